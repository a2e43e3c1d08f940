"""Keras fine-tuning on two workers under TF_CONFIG (MultiWorkerMirroredStrategy on 127.0.0.1):
`--workers 2`, and the engine's own way (two processes, each given its TF_CONFIG). One model,
one --out written by rank 0, accuracy within 1 pt of one process, every connection on loopback.
"""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from support.process_sockets import LOOPBACK, WILDCARD, run_watching_sockets

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
TRAIN_ROWS = 384   # 12 steps of 32 per epoch: the runs stay short, the accuracy stays ~0.97

# `compress ARGS` as the CLI runs it, spied on: the digest of the weights each rank ends its
# training steps with (masks included: a pruned-away weight is a zero) goes to argv[1].
SPIED_CLI = textwrap.dedent('''
    import hashlib, sys
    import compressor.run.pipeline as pipeline
    from compressor.cli import main

    run_steps = pipeline.run_steps

    def spied(*args, **kwargs):
        state = run_steps(*args, **kwargs)
        digest = hashlib.sha256(b"".join(w.tobytes() for w in state.model.get_weights()))
        open(sys.argv[1], "w").write(digest.hexdigest())
        return state

    pipeline.run_steps = spied
    sys.exit(main(sys.argv[2:]))
''')


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A trained digits CNN, a small training split, and the single-process int8_prune30 run."""
    from compressor import compress
    from compressor.backends.examples import save_keras_digits_cnn
    from compressor.tasks.array.data import digits

    folder = tmp_path_factory.mktemp("multiworker")
    model = save_keras_digits_cnn(folder / "digits.keras")
    data = digits("NHWC")
    npz = folder / "digits_small.npz"
    np.savez(npz, x_train=data.train[0][:TRAIN_ROWS], y_train=data.train[1][:TRAIN_ROWS],
             x_val=data.val[0], y_val=data.val[1])
    single = compress(str(model), "int8_prune30", str(npz), out_dir=folder / "single",
                      formats=("tflite",), latency=False, quiet=True)
    return model, npz, single.report["artifacts"][0]["metric_value"]


def _compress_args(digits_run) -> list[str]:
    model, npz, _ = digits_run
    return [str(model), "--recipe", "int8_prune30", "--data", str(npz), "--format", "tflite",
            "--out", "out", "--no-latency"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            **extra}


def _check_one_out(tmp_path: Path, single_accuracy: float) -> None:
    from compressor.runtimes import inspect_artifact

    report = json.loads((tmp_path / "out" / "report.json").read_text())
    (artifact,) = report["artifacts"]
    assert abs(artifact["metric_value"] - single_accuracy) <= 0.01
    assert inspect_artifact(tmp_path / "out" / "model.tflite").sparsity >= 0.29
    # One --out; rank 1 wrote nothing, and TF's / compressor's temp files went with the run.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tmp"]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_workers_2_trains_one_keras_model_and_rank_0_writes_out(digits_run, tmp_path):
    (run,), sockets = run_watching_sockets(
        [[sys.executable, "-m", "compressor.cli", *_compress_args(digits_run), "--workers", "2"]],
        [_env(tmp_path)], tmp_path, timeout=400)
    assert run.returncode == 0, run.output[-3000:]
    assert run.output.count("data-parallel fine-tuning on 2 workers (tf.distribute") == 2
    assert run.output.count("PASSED") == 1                 # rank 1 prints nothing
    _check_one_out(tmp_path, digits_run[2])
    listeners = {s for s in sockets if s.listening}
    # One gRPC server per worker. TensorFlow binds it to the wildcard address (its gRPC server
    # has no bind-address option); the peers reach each other on 127.0.0.1 only.
    assert len({s.port for s in listeners}) == 2 and {s.ip for s in listeners} <= WILDCARD | LOOPBACK
    assert {s.remote_ip for s in sockets if not s.listening} <= LOOPBACK


def test_chief_and_worker_each_given_tf_config(digits_run, tmp_path):
    from compressor.run.workers import free_ports

    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    envs = [_env(tmp_path, TF_CONFIG=json.dumps({"cluster": cluster, "task": task}))
            for task in ({"type": "chief", "index": 0}, {"type": "worker", "index": 0})]
    digests = [tmp_path / "tmp" / f"digest{rank}" for rank in range(2)]
    (chief, worker), sockets = run_watching_sockets(
        [[sys.executable, "-c", SPIED_CLI, str(digest), *_compress_args(digits_run)]
         for digest in digests], envs, tmp_path, timeout=400)
    assert chief.returncode == 0, chief.output[-3000:]
    assert worker.returncode == 0, worker.output[-3000:]
    assert "PASSED" in chief.output and "PASSED" not in worker.output
    # Both ranks ended their training with the same weights and pruning masks.
    assert digests[0].read_text() == digests[1].read_text()
    for digest in digests:
        digest.unlink()
    _check_one_out(tmp_path, digits_run[2])
    assert {s.port for s in sockets if s.listening} == set(ports)
    assert {s.remote_ip for s in sockets if not s.listening} <= LOOPBACK
