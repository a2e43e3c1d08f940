"""PyTorch fine-tuning under torchrun (2 ranks, gloo on loopback): training_setup wraps the
model in DistributedDataParallel and shards the data, and both ranks end with the same weights."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.models import TORCH_BUILDER
from support.process_sockets import LOOPBACK, WILDCARD, run_watching_sockets

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]

RANK_SCRIPT = textwrap.dedent('''
    import json, sys
    from types import SimpleNamespace
    import torch, torch.distributed as dist
    from sklearn.datasets import load_digits
    from compressor.backends.examples import torch_digits_cnn
    from compressor.backends.torch.train import data_parallel, training_setup
    from compressor.config.steps import TrainingConfig

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    digits = load_digits()
    x = torch.tensor(digits.images[:320, None] / 16.0, dtype=torch.float32)
    y = digits.target[:320]
    model = torch_digits_cnn(seed=rank)   # different starts: DDP broadcasts rank 0's weights
    setup = training_setup(model, [x], y, TrainingConfig(epochs=2, batch_size=32, lr=3e-3),
                           SimpleNamespace(seed=0, output_index=0,
                                           progress=SimpleNamespace(info=print)))
    batches = 0
    for epoch in range(2):
        setup.sampler.set_epoch(epoch)
        for xb, yb in setup.loader:
            setup.optimizer.zero_grad()
            setup.loss(setup.model(xb), yb).backward()
            setup.optimizer.step()
            batches += 1
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    accuracy = (model(x).argmax(1).numpy() == y).mean()
    if rank == 0:
        json.dump({"parallel": data_parallel(), "batches": batches, "accuracy": float(accuracy),
                   "max_rank_difference": float(max((w - every[0]).abs().max() for w in every)),
                   "moved": float((every[0] - torch.cat([p.flatten() for p in
                                   torch_digits_cnn(seed=0).parameters()])).abs().max())},
                  open(sys.argv[1], "w"))
    dist.destroy_process_group()
''')


def test_two_ranks_train_data_parallel_to_identical_weights(tmp_path):
    script, result = tmp_path / "rank.py", tmp_path / "result.json"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "TMPDIR": str(tmp_path / "tmp"),
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(script), str(result)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(result.read_text())
    assert found["parallel"]
    assert found["batches"] == 2 * 5          # 320 rows / 2 ranks / 32 per batch, per epoch
    assert found["max_rank_difference"] == 0.0 and found["moved"] > 1e-3
    assert found["accuracy"] > 0.5


def test_cli_workers_2_prunes_and_quantizes_with_one_out(tmp_path):
    import torch

    from compressor.backends import examples

    weights = tmp_path / "digits_state.pt"
    torch.save(examples.train_torch_digits_cnn(epochs=4).state_dict(), weights)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    (run,), sockets = run_watching_sockets(
        [[sys.executable, "-m", "compressor.cli", TORCH_BUILDER, "--weights", str(weights),
          "--recipe", "int8_prune30", "--out", str(tmp_path / "out"), "--no-latency",
          "--workers", "2"]], [env], tmp_path, timeout=400)
    assert run.returncode == 0, run.output[-3000:]
    assert "data-parallel fine-tuning on 2 ranks (gloo)" in run.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    for artifact in report["artifacts"]:
        assert artifact["sparsity"] >= 0.29
        assert report["baseline"]["value"] - artifact["metric_value"] <= 0.01
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["out", "tmp"]
    # The launcher ran torchrun with TMPDIR in its own temp folder, removed after.
    left = [p.name for p in (tmp_path / "tmp").iterdir()]
    assert not [name for name in left if name.startswith(("torchelastic_", "compressor-"))], left
    # The ranks' gloo listeners are on loopback; torchrun's rendezvous store (in the torchrun
    # process) binds the wildcard address; every connection is on loopback.
    ranks = {s for s in sockets if s.listening and "torch.distributed.run" not in s.command}
    store = {s for s in sockets if s.listening and "torch.distributed.run" in s.command}
    assert ranks and {s.ip for s in ranks} <= LOOPBACK, ranks
    assert {s.ip for s in store} <= WILDCARD | LOOPBACK, store
    assert {s.remote_ip for s in sockets if not s.listening} <= LOOPBACK
