"""The plan of an .onnx / .tflite artifact that is not a language model (CNNs, encoders):
the weights + activations + runtime estimate `compress inspect` makes, against the device's
model budget (model_share: the vision-app budget)."""
from __future__ import annotations

from pathlib import Path

from compressor.devices import DeviceProfile
from compressor.plan.llm import HEADROOM_FRACTION


def artifact_plan(path: Path, profiles: list[DeviceProfile], target: str | None) -> dict:
    from compressor.runtimes import inspect_artifact

    if not path.is_file():
        from compressor.errors import ModelLoadError

        raise ModelLoadError(f"{path} does not exist; give the path of an .onnx or .tflite file")
    info = inspect_artifact(path)
    per_device = []
    for profile in profiles:
        usable = profile.budget_bytes
        headroom = usable - info.est_peak_memory_bytes
        fits = headroom >= 0
        per_device.append({
            "target": profile.name,
            "device": {"name": profile.name, "usable_bytes": usable,
                       "bandwidth_bytes_per_s": profile.memory_bandwidth},
            "plans": [{"recipe": "as-is", "weights_bytes": info.size_bytes, "kv_cache_bytes": 0,
                       "working_bytes": max(info.est_peak_memory_bytes - info.size_bytes, 0),
                       "total_bytes": info.est_peak_memory_bytes, "fits": fits,
                       "headroom_bytes": headroom, "decode_tokens_per_s_bound": None,
                       "prefill_tokens_per_s_bound": None, "max_context": None}],
            "recommended": "as-is" if headroom >= HEADROOM_FRACTION * usable else None})
    head = {"model": {"name": path.stem, "params": info.params, "layers": None,
                      "source": str(path), "family": info.format},
            "target": target or profiles[0].name, "context": None, "batch": 1}
    if target == "all":
        return {**head, "targets": per_device}
    return {**head, **{k: v for k, v in per_device[0].items() if k != "target"}}
