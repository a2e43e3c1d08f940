"""Rank and launcher choice for `--workers` / torchrun / TF_CONFIG, without starting anything."""
from __future__ import annotations

import json
import socket

import pytest

from compressor.run import workers


def _tf_config(monkeypatch, cluster: dict, task_type: str, index: int) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                "task": {"type": task_type, "index": index}}))


@pytest.mark.parametrize(("cluster", "task_type", "index", "rank"), [
    ({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "worker", 0, 0),
    ({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "worker", 1, 1),
    ({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "chief", 0, 0),
    ({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}, "worker", 1, 2),
    ({"worker": ["127.0.0.1:1"]}, "worker", 0, 0),           # one task: not distributed
])
def test_rank_under_tf_config(monkeypatch, cluster, task_type, index, rank):
    _tf_config(monkeypatch, cluster, task_type, index)
    assert workers.rank() == rank
    assert workers.under_launcher() == (len(sum(cluster.values(), [])) > 1)


def test_torchrun_rank_and_no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert workers.rank() == 1 and workers.under_launcher()
    monkeypatch.setenv("TF_CONFIG", "not json")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert workers.rank() == 0 and not workers.under_launcher()


def test_local_tf_configs_name_loopback_and_free_ports():
    configs = [json.loads(c) for c in workers.local_tf_configs(3)]
    addresses = configs[0]["cluster"]["worker"]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    for address in addresses:   # free when handed out
        with socket.socket() as s:
            s.bind(("127.0.0.1", int(address.split(":")[1])))


def test_without_workers_drops_both_spellings():
    argv = ["m.keras", "--workers", "2", "--recipe", "int8", "--workers=3", "--out", "o"]
    assert workers.without_workers(argv) == ["m.keras", "--recipe", "int8", "--out", "o"]
