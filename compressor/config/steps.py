"""Every recipe step's typed config, and the `validate` section's.

The bottom of the package: it imports only pydantic, `errors` and the schemes (a quantize
step is its scheme's own typed model, built from the scheme's recipe keys), so passes,
backends, recipes and reports can all name these types without import cycles. A config is
immutable and rejects unknown keys; run state (masks, wrapped models) lives in
`context.ModelState`.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (BaseModel, ConfigDict, Field, SerializationInfo, ValidationError,
                      ValidatorFunctionWrapHandler, create_model, field_validator,
                      model_serializer, model_validator)

from compressor.config.scheme_steps import dump_own_type, explained, scheme_fields
from compressor.errors import RecipeError
from compressor.schemes.base import Scheme, registered_schemes, scheme_class, scheme_of_step


class StepConfig(BaseModel):
    """Base of every step config: immutable, and unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @property
    def trains(self) -> bool:
        """Whether this step fine-tunes the model (and so could run in a user's loop)."""
        return False


class TrainingConfig(StepConfig):
    """Keys shared by every step that fine-tunes the model."""

    # The default peak lr, as a fraction of the optimizer's from-scratch rate: a trained model
    # is fine-tuned, not retrained (backends/fine_tuning.py). Measured (docs/measurements.md
    # "Fine-tuning learning rate"): the full rate wrecked pretrained nets (ResNet-style int8_prune30 -2.2 pt,
    # MobileNetV2-style int8_qat -3.8 pt); 1/10 could not recover pruning or fake-quant on a
    # small net (-1.3 pt); 3/10 kept 13 nets x recipes within 0.9 pt.
    default_lr_fraction: ClassVar[float] = 0.3

    epochs: int = Field(2, ge=0, description="fine-tuning epochs over the training split")
    lr: float | None = Field(
        None, gt=0, description="peak learning rate; unset: a fine-tuning rate, 3/10 of the "
        "optimizer's from-scratch rate (adam/adamw 3e-4, sgd 3e-3; distill the whole "
        "from-scratch rate)")
    optimizer: Literal["adam", "adamw", "sgd"] = Field(
        "adam", description="adam, adamw (weight decay 1e-4) or sgd (momentum 0.9)")
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine", alias="schedule",
        description="cosine: linear warmup, then cosine decay to 0; constant: lr throughout")
    warmup: float = Field(0.1, ge=0.0, lt=1.0,
                          description="cosine only: the fraction of steps the lr ramps up over")
    keep_best: bool = Field(True, description="keep the epoch with the best val metric, not the "
                                              "last (pruning: among epochs at full sparsity)")
    early_stop: int | None = Field(None, ge=1, description="stop after this many epochs "
                                                           "without a better val metric")
    batch_size: int = Field(32, ge=1, description="fine-tuning batch size, e.g. 32")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="fp32, or bf16: the training step's forward and backward in "
        "bfloat16 (language models: every weight read as bfloat16 from a float32 master; "
        "PyTorch: autocast; the optimizer updates float32 masters)")

    @property
    def trains(self) -> bool:
        return True


class PruneConfig(TrainingConfig):
    kind: Literal["prune"] = Field("prune", alias="pass")
    sparsity: float | None = Field(None, gt=0.0, lt=1.0,
                                   description="the fraction of weights to set to zero, e.g. 0.3")
    schedule: Literal["constant", "polynomial"] = Field(
        "polynomial", description="constant: full sparsity from the start; polynomial: ramp up")
    structure: Literal["unstructured", "channel"] = Field(
        "unstructured", description="unstructured: zero single weights; channel: remove whole "
        "filters / units (a smaller dense model; sparsity = fraction of channels per group)")
    # `schedule` is the sparsity ramp here (the recipe format's since round 1); the learning
    # rate's schedule is `lr_schedule`.
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="cosine: linear warmup, then cosine decay to 0; constant: lr throughout")
    target_macs: float | None = Field(
        None, gt=0.0, lt=1.0, description="channel only: prune until the model's MACs are at most "
        "this fraction of the original's, e.g. 0.3 (one ratio for every group, instead of sparsity)")
    channel_multiple: int = Field(
        1, ge=1, le=256, description="channel only: round each group's kept channels to the "
        "nearest multiple of this (never below it), e.g. 16: int8 kernels work on 16 channels at "
        "a time")

    @property
    def leaves_zeros(self) -> bool:
        """Whether later steps (QAT, distillation) have pruned zeros to keep at zero."""
        return self.structure == "unstructured"

    @model_validator(mode="after")
    def _target_macs_needs_channels(self) -> PruneConfig:
        for key, unset in (("target_macs", None), ("channel_multiple", 1)):
            if getattr(self, key) != unset and self.structure != "channel":
                raise ValueError(f"sets {key}, which only structure: channel uses; add "
                                 f"`structure: channel` or remove {key}")
        if self.sparsity is None and self.target_macs is None:
            raise ValueError("needs sparsity (the fraction of weights, or with structure: "
                             "channel of channels, to remove, e.g. 0.3)")
        return self


class QuantizeConfig(StepConfig):
    """A quantize step: `mode` and `dtype` name its scheme (compressor/schemes), and the
    scheme's recipe keys are the step's other keys. A recipe's step and `QuantizeConfig(...)`
    both build the scheme's own step model (`quantize_step_model`, a subclass of this one), so
    a key of another scheme is an error naming it."""

    kind: Literal["quantize"] = Field("quantize", alias="pass")
    mode: str = Field(
        "qat", min_length=1, max_length=64,
        description="qat (fine-tune with fake-quant), ptq (calibrate), dynamic or weight_only "
        "(or a registered scheme's mode)")
    dtype: str = Field("int8", min_length=1, max_length=16,
                       description="the weights' integer type, e.g. int8")

    def __new__(cls, *args: Any, **data: Any) -> QuantizeConfig:
        if cls is QuantizeConfig:
            cls = _step_model_for(data) or cls
        return super().__new__(cls)

    @model_validator(mode="wrap")
    @classmethod
    def _as_scheme_step(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if cls is not QuantizeConfig or not isinstance(data, dict):
            return handler(data)
        model = _step_model_for(data)
        if model is None:   # an unknown mode / dtype: the recipe names it (recipe._check_scheme)
            return handler({k: v for k, v in data.items() if k in ("pass", "kind", "mode", "dtype")})
        return validate_step(model, data)

    @model_serializer(mode="wrap")
    def _whole(self, handler: Any, info: SerializationInfo) -> Any:
        return dump_own_type(self, handler, info)

    @property
    def scheme(self) -> Scheme:
        """The scheme this step builds."""
        return scheme_of_step(self)

    def __reduce__(self) -> tuple:
        return _quantize_step, (self.model_dump(),)


def _quantize_step(data: dict[str, Any]) -> QuantizeConfig:
    return QuantizeConfig(**data)


def _step_model_for(data: dict[str, Any]) -> type[QuantizeConfig] | None:
    """The step model of the scheme `data`'s mode and dtype name (None: none registered)."""
    mode, dtype = data.get("mode", "qat"), data.get("dtype", "int8")
    if not isinstance(mode, str) or not isinstance(dtype, str):
        return None
    try:
        return quantize_step_model(scheme_class(mode, dtype))
    except RecipeError:
        return None


_STEP_MODELS: dict[type[Scheme], type[QuantizeConfig]] = {}


def quantize_step_model(scheme: type[Scheme]) -> type[QuantizeConfig]:
    """The typed step model of `scheme`: pass, mode, dtype, the scheme's `key` fields and, for
    a scheme that trains, the training keys (TrainingConfig)."""
    if scheme not in _STEP_MODELS:
        bases = (QuantizeConfig, TrainingConfig) if scheme.trains else (QuantizeConfig,)
        _STEP_MODELS[scheme] = create_model(f"{scheme.__name__}Step", __base__=bases,
                                            __module__=__name__, **scheme_fields(scheme))
    return _STEP_MODELS[scheme]


def validate_step(model: type[QuantizeConfig], data: dict[str, Any]) -> QuantizeConfig:
    """`data` as `model`'s step; its errors name the key and what it means, and a key the
    scheme lacks names the schemes that have it."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        labels = {quantize_step_model(s): f"{s.dtype} {s.name}" for s in registered_schemes()}
        errors = [explained(error, model, labels) for error in exc.errors()]
        raise ValidationError.from_exception_data(exc.title, errors) from None


FEATURE_WEIGHT = 0.1   # distill feature_weight default: 1.0 measured worse (docs/measurements.md)


class DistillConfig(TrainingConfig):
    # A distill step usually trains a student far from its teacher (small, briefly trained):
    # the from-scratch rate; keep_best guards a converged one (docs/measurements.md).
    default_lr_fraction: ClassVar[float] = 1.0

    kind: Literal["distill"] = Field("distill", alias="pass")
    temperature: float = Field(2.0, gt=0, description="softens both models' logits, e.g. 2.0")
    alpha: float = Field(0.7, ge=0.0, le=1.0,
                         description="weight of the teacher term vs the hard-label loss, e.g. 0.7")
    loss: Literal["kl", "mse"] = Field("kl", description="kl on soft targets, or mse on logits")
    guide_later_steps: bool = Field(
        False, description="keep the teacher's term in the loss of the prune / QAT steps after "
        "this one (off: they fine-tune on the labels, which measured better)")
    feature_pairs: tuple[tuple[str, str], ...] = Field(
        (), description="[student_layer, teacher_layer] name pairs: each adds an MSE term between "
        "the two layers' outputs during this step (a learned projection maps the student's "
        "width to the teacher's when they differ)")
    feature_weight: float = Field(FEATURE_WEIGHT, ge=0.0,
                                  description="weight of the feature terms, summed over pairs")

    def guides(self, step: StepConfig | None) -> bool:
        """Whether the teacher's term is in `step`'s loss: this step's own, and with
        guide_later_steps the later training steps' (None: a user's plain fine-tuning)."""
        return step is self or self.guide_later_steps

    @field_validator("feature_pairs")
    @classmethod
    def _layer_names_given(cls, pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        if any(not name.strip() for pair in pairs for name in pair):
            raise ValueError("feature_pairs entries are [student_layer, teacher_layer] with both "
                             "names non-empty, e.g. [[conv2d_1, conv2d_1]]")
        return pairs


class PrecisionConfig(StepConfig):
    kind: Literal["precision"] = Field("precision", alias="pass")
    dtype: Literal["float16", "bfloat16"] = "float16"
    keep_io_types: bool = Field(True, description="keep model inputs/outputs float32")
    exclude: tuple[str, ...] = Field((), description="layer-name patterns kept in float32")


class ValidateConfig(BaseModel):
    """The accuracy gate: how the artifacts are compared with the original model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: Literal["accuracy", "fidelity", "mse", "perplexity"] = Field(
        "accuracy", description="accuracy (labels), fidelity (cosine vs the original's outputs), "
        "mse, or perplexity (language models, on held-out text)")
    max_drop: float = Field(0.01, ge=0.0, description="absolute metric drop allowed, e.g. 0.01")
    max_increase: float | None = Field(
        None, ge=0.0, description="language models: relative perplexity increase allowed, e.g. "
        "0.05 = 5% (default 0.05); a classifier recipe run on a language model is gated by it")
    eval_windows: int | None = Field(
        None, ge=1, le=4096, description="language models: held-out windows scored (default 16)")
    window: int | None = Field(
        None, ge=8, le=8192, description="language models: tokens per window (default 256)")
    min_fidelity: float | None = Field(None, gt=0.0, le=1.0,
                                       description="for metric fidelity: lowest allowed, e.g. 0.99")
    output: str | int | None = Field(
        None, description="multi-output models: the output (name or index) accuracy / mse read; "
                          "default the first. Fidelity compares every output")


STEP_CONFIGS: tuple[type[StepConfig], ...] = (PruneConfig, QuantizeConfig, DistillConfig,
                                              PrecisionConfig)


def step_kind(config_cls: type[StepConfig]) -> str:
    """The `pass:` name of a step config class, e.g. "prune"."""
    return config_cls.model_fields["kind"].default


def pass_names() -> list[str]:
    """The `pass:` names a recipe step may use."""
    return sorted(step_kind(cls) for cls in STEP_CONFIGS)
