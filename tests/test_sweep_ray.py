"""Sweeps on a local Ray: the same rows and artifact bytes as serial, failures as rows, resume
unchanged, every Ray listener on 127.0.0.1 and Ray's temp dir removed."""
from __future__ import annotations

import hashlib
import os

import pytest
import yaml

from compressor.run.sweep import sweep

# Ray reads this when first imported; without it the node and its agents use the host address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.slow


def _listen_addresses() -> set[str]:
    """Where this process's children (GCS, raylet, agents, workers) accept TCP connections."""
    addresses = set()
    for child in psutil.Process().children(recursive=True):
        try:
            connections = child.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        addresses |= {c.laddr.ip.removeprefix("::ffff:") for c in connections
                      if c.status == psutil.CONN_LISTEN}
    return addresses


def _artifact_digests(frame, out) -> list[str | None]:
    return [hashlib.sha256((out / row.recipe / row.path).read_bytes()).hexdigest()
            if isinstance(row.path, str) else None for row in frame.itertuples()]


def test_ray_sweep_matches_serial_rows_and_bytes(untrained_keras_file, tmp_path, monkeypatch,
                                                 capfd):
    from compressor.run.sweep_ray import _ray_session

    monkeypatch.setenv("HOME", str(tmp_path))          # Ray writes ~/.ray
    impossible = tmp_path / "impossible.yaml"
    impossible.write_text(yaml.safe_dump({"name": "impossible", "export": ["onnx"],
                                          "steps": [{"pass": "prune", "sparsity": 1.5}]}))
    recipes = ["fp16", "int8", str(impossible)]
    model = str(untrained_keras_file)                   # accuracy does not matter here
    serial = sweep(model, recipes, "digits", tmp_path / "serial", latency=False)

    # The Ray a local sweep starts for itself; held open here to read its listeners.
    with _ray_session(ray, None) as ray_temp:
        node_addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
        on_ray = sweep(model, recipes, "digits", tmp_path / "ray", latency=False,
                       executor="ray")
        listeners = _listen_addresses()   # GCS, raylet, agents and the (now idle) workers
        # resume is unchanged: a second sweep finds every report and computes nothing
        again = sweep(model, recipes[:2], "digits", tmp_path / "ray", latency=False,
                      executor="ray")
    assert not ray.is_initialized()
    assert node_addresses == {"127.0.0.1"} and listeners == {"127.0.0.1"}, listeners
    assert again["cached"].all() and len(again) == 4
    assert ray_temp and not os.path.exists(ray_temp)

    assert list(on_ray["recipe"]) == ["fp16", "fp16", "int8", "int8", str(impossible)]
    compared = ["recipe", "format", "path", "size_bytes", "metric_value", "sparsity", "passed",
                "error"]
    assert on_ray[compared].equals(serial[compared]), (on_ray[compared].to_dict("records"),
                                                       serial[compared].to_dict("records"))
    assert _artifact_digests(on_ray, tmp_path / "ray") == _artifact_digests(serial,
                                                                           tmp_path / "serial")
    failed = on_ray.iloc[-1]
    assert "sparsity = 1.5" in failed["error"] and not failed["passed"]
    progress = [line for line in capfd.readouterr().err.splitlines() if line.startswith("[")]
    assert sorted(line[:5] for line in progress) == ["[1/2]", "[1/3]", "[2/2]", "[2/3]", "[3/3]"]
    assert any("impossible.yaml: error" in line for line in progress)
    assert sum(": cached (" in line for line in progress) == 2
