"""Device profiles for language models: bandwidth, compute, link and llm_share on every
built-in board; rates parse with units; a profile without them still plans (no bounds)."""
from __future__ import annotations

import pytest

from compressor.devices import DeviceProfileError, get_profile, load_profiles, parse_rate
from compressor.plan import plan


def test_every_built_in_board_has_llm_numbers():
    for name, p in load_profiles().items():
        assert p.memory_bandwidth and p.int8_ops and p.fp16_ops and p.network_bandwidth, name
        assert p.budget_bytes <= p.llm_budget_bytes < p.memory_bytes, name
    nx = get_profile("jetson-orin-nx-8gb")
    assert nx.memory_bandwidth == 102.4e9 and nx.budget_bytes == 4 * 2**30     # vision budget kept
    assert nx.llm_budget_bytes == int(8 * 2**30 * 0.85)
    assert get_profile("raspberry-pi-5-8gb").memory_bandwidth == 17e9
    assert get_profile("jetson-agx-orin-64gb").memory_bandwidth == 204.8e9


def test_rates_parse_with_units():
    assert parse_rate("102.4 GB/s", "x", "memory_bandwidth") == 102.4e9
    assert parse_rate("35 TOPS", "x", "int8_ops") == 35e12
    assert parse_rate("384 GFLOPS", "x", "fp16_ops") == 384e9 and parse_rate(5, "x", "k") == 5.0
    with pytest.raises(DeviceProfileError, match="memory_bandwidth = 'fast', but it must be"):
        parse_rate("fast", "x", "memory_bandwidth")


def test_a_profile_without_llm_keys_plans_without_bounds(tmp_path):
    path = tmp_path / "board.yaml"
    path.write_text("name: board\nmemory_bytes: 2GiB\nmodel_share: 0.5\n")
    out = plan("smollm2-135m", target=str(path), context=2048, recipes=["int4"])
    assert out["device"]["usable_bytes"] == 2**30                 # model_share without llm_share
    assert out["plans"][0]["fits"] and out["plans"][0]["decode_tokens_per_s_bound"] is None
    path.write_text("name: board\nmemory_bytes: 2GiB\nmodel_share: 0.5\nllm_share: 1.5\n")
    with pytest.raises(DeviceProfileError, match="board.llm_share = 1.5"):
        get_profile(path)
