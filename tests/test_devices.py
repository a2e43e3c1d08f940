"""Device profiles: the built-ins load, budgets follow from memory and share, fits() decides."""
from __future__ import annotations

from pathlib import Path

import pytest

from compressor.devices import (
    DeviceProfileError,
    fits,
    get_profile,
    load_profiles,
    parse_size,
)
from compressor.errors import CompressorError
from compressor.runtimes import ArtifactInfo

BUILT_IN = {"jetson-orin-nx-8gb", "jetson-orin-nano-8gb", "jetson-agx-orin-64gb", "raspberry-pi-5-8gb",
            "raspberry-pi-4-4gb", "generic-8gb"}


def artifact(est_bytes: int, fmt: str = "tflite") -> ArtifactInfo:
    return ArtifactInfo(format=fmt, path=Path(f"m.{fmt}"), size_bytes=1, gzip_bytes=1, sha256="0" * 64,
                        params=1, weight_dtypes={"int8": 1.0}, sparsity=0.0, ops={}, inputs=[], outputs=[],
                        est_peak_memory_bytes=est_bytes)


def test_built_in_profiles_load_with_sane_budgets():
    profiles = load_profiles()
    assert set(profiles) == BUILT_IN
    for name, p in profiles.items():
        assert p.name == name and p.arch and p.description
        assert 0 < p.budget_bytes < p.memory_bytes and p.runs("tflite") and p.runs("onnx")
    nx = profiles["jetson-orin-nx-8gb"]
    assert nx.memory_bytes == 8 * 2**30 and nx.budget_bytes == 4 * 2**30 and "tensorrt" in nx.runtimes
    assert profiles["raspberry-pi-4-4gb"].memory_bytes == 4 * 2**30


def test_unknown_device_suggests_the_closest_name():
    with pytest.raises(DeviceProfileError, match="did you mean 'jetson-orin-nx-8gb'") as e:
        get_profile("jetson-orin-nx")
    assert isinstance(e.value, CompressorError) and e.value.exit_code == 2


def test_profile_file_with_a_one_megabyte_device(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny-mcu\nmemory_bytes: 1MB\nmodel_share: 0.5\narch: armv7\nruntimes: [litert]\n")
    tiny = get_profile(str(path))
    assert (tiny.name, tiny.memory_bytes, tiny.budget_bytes) == ("tiny-mcu", 10**6, 500_000)
    assert not tiny.runs("onnx")
    assert fits(artifact(400_000), tiny) and not fits(artifact(600_000), tiny)
    assert fits(artifact(600_000), "raspberry-pi-4-4gb")


def test_a_real_artifact_does_not_fit_one_megabyte(tmp_path):
    from runtimes.test_runtimes import build_onnx  # a tiny Conv + Gemm net, inspected for real

    from compressor.runtimes import inspect_artifact
    info = inspect_artifact(build_onnx(tmp_path / "m.onnx"))
    path = tmp_path / "tiny.yaml"
    path.write_text("memory_bytes: 1MiB\nmodel_share: 1.0\n")
    assert info.est_peak_memory_bytes > 2**20 and not fits(info, get_profile(path))
    assert fits(info, get_profile("raspberry-pi-4-4gb"))


@pytest.mark.parametrize("text, message", [
    ("memory_bytes: lots\nmodel_share: 0.5\n", "memory_bytes = 'lots'"),
    ("memory_bytes: 1GB\nmodel_share: 1.5\n", "model_share = 1.5"),
    ("memory_bytes: 1GB\n", "missing keys \\['model_share'\\]"),
    ("memory_bytes: 1GB\nmodel_share: 0.5\nram: 3\n", "unknown keys \\['ram'\\]"),
    ("[1, 2", "not valid YAML"),
])
def test_malformed_profile_files_say_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(DeviceProfileError, match=message):
        get_profile(path)


def test_missing_profile_file(tmp_path):
    with pytest.raises(DeviceProfileError, match="cannot read"):
        get_profile(str(tmp_path / "nope.yaml"))


def test_sizes():
    assert parse_size("8GiB", "x") == 8 * 2**30 and parse_size("512 MB", "x") == 512 * 10**6
    assert parse_size(1234, "x") == 1234 and parse_size("1.5KiB", "x") == 1536
