"""Device profiles (`--target`): how much memory a model may use on an edge device.

Built-in profiles live in devices.yaml (package data); a path to a YAML file with one
profile works wherever a profile name does. No ML framework is imported here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from compressor.errors import CompressorError
from compressor.errors import did_you_mean
# artifact format -> the runtime that runs it, read from the format registry at each use
from compressor.formats import FORMAT_RUNTIMES

if TYPE_CHECKING:
    from compressor.runtimes import ArtifactInfo

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_KEYS = {"name", "description", "memory_bytes", "model_share", "arch", "runtimes", "llm_share",
         "memory_bandwidth", "int8_ops", "fp16_ops", "network_bandwidth"}
_RATE_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
HOST = "host"   # the machine compress runs on, measured (not in devices.yaml)


class DeviceProfileError(CompressorError):
    """An unknown device name, or a device profile file that is missing or malformed (exit 2)."""


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    memory_bytes: int          # RAM on the device (shared CPU/GPU on Jetsons)
    model_share: float         # fraction of memory_bytes a model may use; the rest is OS / runtime reserve
    arch: str                  # CPU architecture, e.g. "aarch64"
    runtimes: tuple[str, ...]  # "litert", "onnxruntime", "tensorrt"
    description: str = ""
    # For language-model plans (compress plan); None where a profile does not say.
    llm_share: float | None = None           # fraction of memory_bytes a headless LLM process may use
    memory_bandwidth: float | None = None    # bytes/s, theoretical peak of the RAM
    int8_ops: float | None = None            # int8 ops/s (dense), the fastest engine that runs ONNX
    fp16_ops: float | None = None            # fp16 FLOP/s (dense)
    network_bandwidth: float | None = None   # bytes/s between two such boards (pipeline splits)

    @property
    def budget_bytes(self) -> int:
        """Bytes one model may use: weights + activations + runtime overhead."""
        return int(self.memory_bytes * self.model_share)

    @property
    def llm_budget_bytes(self) -> int:
        """Bytes a language model may use when it is the board's one job (llm_share), or the
        vision-app budget where the profile sets no llm_share."""
        return int(self.memory_bytes * (self.llm_share or self.model_share))

    def runs(self, fmt: str) -> bool:
        """Whether the device has a runtime for artifacts of this format (a registered name)."""
        return FORMAT_RUNTIMES.get(fmt) in self.runtimes

    def fits(self, est_peak_memory_bytes: int) -> bool:
        """Whether a model estimated to need this much memory is within the budget."""
        return est_peak_memory_bytes <= self.budget_bytes


def fits(info: ArtifactInfo, profile: DeviceProfile | str) -> bool:
    """Whether the artifact's estimated peak memory is within the device's model budget."""
    if isinstance(profile, str):
        profile = get_profile(profile)
    return profile.fits(info.est_peak_memory_bytes)


def parse_size(value: Any, where: str) -> int:
    """Bytes from an int or a string such as "8GiB", "512 MB", "1MB"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(value), flags=re.IGNORECASE)
    if isinstance(value, bool) or not match or float(match.group(1)) <= 0:
        raise DeviceProfileError(f"{where}: memory_bytes = {value!r}, but it must be a positive number "
                                 "of bytes or a size such as 8GiB or 512MB")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


def parse_rate(value: Any, where: str, key: str) -> float | None:
    """A rate from a number or a string such as "102.4 GB/s", "35 TOPS", "12.5 TFLOPS"."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([KMGT]?)(B/s|OPS|FLOPS)?\s*", str(value),
                         flags=re.IGNORECASE)
    if isinstance(value, bool) or not match or float(match.group(1)) <= 0:
        raise DeviceProfileError(f"{where}: {key} = {value!r}, but it must be a positive rate "
                                 "such as 102.4 GB/s, 35 TOPS or 12.5 TFLOPS")
    return float(match.group(1)) * _RATE_UNITS[match.group(2).upper()]


def _share(raw: dict, key: str, name: str, where: str) -> float:
    share = raw[key]
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise DeviceProfileError(f"{where}: {name}.{key} = {share!r}, but it must be above 0 "
                                 "and at most 1 (the fraction of memory a model may use, e.g. 0.5)")
    return float(share)


def _profile(name: str, raw: Any, where: str) -> DeviceProfile:
    if not isinstance(raw, dict):
        raise DeviceProfileError(f"{where}: profile {name!r} must be a mapping of "
                                 f"{', '.join(sorted(_KEYS - {'name'}))}")
    unknown = set(raw) - _KEYS
    missing = {"memory_bytes", "model_share"} - set(raw)
    if unknown or missing:
        problem = f"unknown keys {sorted(unknown)}" if unknown else f"missing keys {sorted(missing)}"
        raise DeviceProfileError(f"{where}: profile {name!r} has {problem}; keys are {sorted(_KEYS)}")
    share = _share(raw, "model_share", name, where)
    llm_share = _share(raw, "llm_share", name, where) if "llm_share" in raw else None
    rates = {key: parse_rate(raw.get(key), f"{where}: {name}", key)
             for key in ("memory_bandwidth", "int8_ops", "fp16_ops", "network_bandwidth")}
    runtimes = raw.get("runtimes", list(FORMAT_RUNTIMES.values()))
    if isinstance(runtimes, str) or not isinstance(runtimes, list):
        raise DeviceProfileError(f"{where}: {name}.runtimes must be a list, e.g. [litert, onnxruntime]")
    return DeviceProfile(name=name, memory_bytes=parse_size(raw["memory_bytes"], f"{where}: {name}"),
                         model_share=share, arch=str(raw.get("arch", "unknown")),
                         runtimes=tuple(str(r) for r in runtimes), description=str(raw.get("description", "")),
                         llm_share=llm_share, **rates)


def _read_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # C: 10x faster
    except yaml.YAMLError as e:
        raise DeviceProfileError(f"{where}: not valid YAML ({e})") from e


def load_profiles() -> dict[str, DeviceProfile]:
    """The built-in profiles, by name, in the order devices.yaml lists them."""
    text = resources.files("compressor.devices").joinpath("devices.yaml").read_text(encoding="utf-8")
    raw = _read_yaml(text, "devices.yaml")
    return {name: _profile(name, entry, "devices.yaml") for name, entry in raw.items()}


def load_profile_file(path: Path) -> DeviceProfile:
    """One profile from a YAML file holding its keys and a `name`."""
    path = Path(path)
    try:
        raw = _read_yaml(path.read_text(encoding="utf-8"), str(path))
    except OSError as e:
        raise DeviceProfileError(f"{path}: cannot read the device profile ({e.strerror})") from e
    if not isinstance(raw, dict):
        raise DeviceProfileError(f"{path}: a device profile file must be a mapping with "
                                 f"name, memory_bytes, model_share, arch, runtimes")
    name = str(raw.get("name") or path.stem)
    return _profile(name, raw, str(path))


def get_profile(name_or_path: str | Path) -> DeviceProfile:
    """A built-in profile by name, or the profile in a .yaml / .yml file."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or isinstance(name_or_path, Path):
        return load_profile_file(Path(text))
    if text == HOST:
        from compressor.devices.host import host_measurements

        return DeviceProfile(**host_measurements())
    profiles = load_profiles()
    if text not in profiles:
        raise DeviceProfileError(f"unknown device {text!r}{did_you_mean(text, [*profiles, HOST])} "
                                 "(compress devices lists them, or pass a .yaml profile file)")
    return profiles[text]
