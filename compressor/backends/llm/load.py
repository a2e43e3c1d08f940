"""Load causal language models as LoadedLm: a Hugging Face folder, a `.gguf` file, a
`module:function` returning a model (or `(model, tokenizer)`), or an in-memory model.

A folder is loaded in its checkpoint's dtype (bf16 stays bf16: a float32 copy of a whole model
is what makes conversion need more RAM than the board), with weights memory-mapped by
safetensors. Nothing the caller holds is changed: in-memory models are used read-only (the
quantize pass never writes into them); they run in eval mode, and `cz.compress` gives each
module its training flag back when it returns (core/modes.py).
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from compressor.backends.model_kinds import is_causal_lm
from compressor.backends.llm.model import LoadedLm
from compressor.errors import ModelLoadError, first_line

CONFIG_FILE = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def load_lm(source: Any, tokenizer: Any = None) -> LoadedLm:
    from compressor.backends.torch.env import IMPORT_NOISE, quiet_loggers

    quiet_transformers()
    with quiet_loggers(*IMPORT_NOISE):   # transformers imports parts of torchao as it loads
        return _load(source, tokenizer)


def _load(source: Any, tokenizer: Any) -> LoadedLm:
    if isinstance(source, LoadedLm):
        return source
    if isinstance(source, tuple) and len(source) == 2:
        return _load(source[0], source[1])
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.suffix == ".gguf":
            from compressor.backends.llm.gguf import load_gguf

            return load_gguf(path)
        if is_hf_folder(path):
            return _load_folder(path)
        from compressor.backends.references import call_reference, is_builder_reference

        if not path.exists() and is_builder_reference(str(source)):
            return _load(call_reference(str(source)), tokenizer)
        raise ModelLoadError(f"{source}: not a Hugging Face model folder (no {CONFIG_FILE}); give "
                             "the folder save_pretrained wrote, a .gguf file or module:function")
    if not is_causal_lm(source):
        raise ModelLoadError(f"a {type(source).__qualname__} is not a causal language model; "
                             "give a transformers *ForCausalLM model")
    source.eval()
    return LoadedLm(model=source, tokenizer=tokenizer or _tokenizer_near(source),
                    source=_folder_of(source))


def quiet_transformers() -> None:
    """Offline, and no progress bars or advice on our console (ours report progress)."""
    from compressor.backends.torch.env import IMPORT_NOISE, configure_environment, quiet_loggers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing is downloaded at run time
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    configure_environment()
    with quiet_loggers(*IMPORT_NOISE):
        import transformers
        if importlib.util.find_spec("torchao") is not None:
            import torchao  # noqa: F401  (transformers imports it later, less quietly)

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _load_folder(path: Path) -> LoadedLm:
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelLoadError(f"{path}/{CONFIG_FILE} cannot be read as a model config: "
                             f"{first_line(exc)}; check the file") from None
    if not any(arch.endswith("ForCausalLM") for arch in (config.architectures or [])) and \
            type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelLoadError(f"{path} holds a {type(config).__name__.removesuffix('Config')} model "
                             "without a causal-LM head; compress language models as "
                             "*ForCausalLM checkpoints")
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                             "save the tokenizer into the folder (tokenizer.save_pretrained)")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="auto")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load the model in {path}: {first_line(exc)}") from None
    model.eval()
    return LoadedLm(model=model, tokenizer=tokenizer, source=path, owned=True)


def _folder_of(model: Any) -> Path | None:
    name = getattr(model.config, "_name_or_path", "") or ""
    return Path(name) if name and is_hf_folder(Path(name)) else None


def _tokenizer_near(model: Any) -> Any:
    """The tokenizer saved beside a model loaded from a folder, or None (then the caller
    passes one: `cz.compress((model, tokenizer), ...)`, or `module:function` returns the pair)."""
    folder = _folder_of(model)
    if folder is None or not any((folder / name).exists() for name in TOKENIZER_FILES):
        return None
    import transformers

    return transformers.AutoTokenizer.from_pretrained(folder)
