"""`compress report OUT_DIR`: report.md and report.html again from a report.json (no run), every
section a report can have drawn from a hand-built one, and the one-line refusals.

The real runs' pages are checked where those runs are made (support/html_checks.py is called
from test_pipeline, passes/test_fallback, passes/test_prune_channels, llm/test_compress_lm,
test_sweep); the headless-Chromium check is in test_pipeline.py."""
from __future__ import annotations

import copy
import json

import pytest
from support.html_checks import check_report_html, parse_page

from compressor.cli import main
from compressor.report.html.report_page import render_html
from unit.test_report import REPORT

EPOCHS = [{"epoch": 1, "loss": 0.31, "lr": 1e-3, "val_metric": 0.95},
          {"epoch": 2, "loss": 0.12, "lr": 1e-5, "val_metric": 0.971}]
FULL = {**copy.deepcopy(REPORT), "exit_code": 3,
        "history": [{"step": "pruning to 30%", "metric": "accuracy", "best_epoch": 2,
                     "stopped_early": False, "epochs": EPOCHS}],
        "fallback": {"format": "tflite", "dtype": "float16", "evaluations": 7,
                     "ranking": [{"layer": "bottleneck", "sensitivity": 0.87,
                                  "fidelity_gain": 1.0, "size_cost_bytes": 1016},
                                 {"layer": "logits", "sensitivity": 0.002,
                                  "fidelity_gain": 0.04, "size_cost_bytes": 16}],
                     "float_layers": ["bottleneck"],
                     "float_layer_costs": [{"layer": "bottleneck", "size_cost_bytes": 1016}],
                     "float_weight_dtypes": {"tflite": ["float16"]},
                     "full_int8": {"metric_value": 0.1, "drop": 0.87, "size_bytes": 44_000},
                     "chosen": {"metric_value": 0.97, "drop": 0.002, "size_bytes": 46_000,
                                "passed": True}},
        "channel_pruning": {"structure": "channel", "ratio": 0.5, "target_macs": None,
                            "model_before": {"params": 38_282, "macs": 337_536},
                            "model_after": {"params": 9_802, "macs": 86_848},
                            "groups_pruned": 3,
                            "attention_heads": [{"layer": "attn", "before": 4, "after": 2}],
                            "kept_whole": [{"layers": ["dense_1"], "reason": "a model output"}]},
        "plan": {"model": {"name": "tiny", "params": 1000, "layers": 2, "source": "config.json"},
                 "target": "raspberry-pi-5-8gb", "context": 512, "batch": 1,
                 "device": {"usable_bytes": 6 << 30, "bandwidth_bytes_per_s": 1e10},
                 "plans": [{"recipe": "int4", "weights_bytes": 600, "kv_cache_bytes": 4096,
                            "working_bytes": 100, "total_bytes": 4796, "fits": True,
                            "headroom_bytes": 1 << 30, "decode_tokens_per_s_bound": 1e6,
                            "max_context": 4096}],
                 "recommended": "int4", "split": None},
        "quantize": {"mode": "qat", "reason": "set by the recipe"}}


def test_compress_report_rerenders_every_section_from_report_json(tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps(FULL))
    assert main(["report", str(tmp_path)]) == 0
    assert "report.html" in capsys.readouterr().out
    page = check_report_html(tmp_path)   # verdict, sections and numbers match report.json
    assert page.sections == ["sizes", "metric", "latency", "history", "fallback", "channels",
                             "plan", "notes", "run"]
    assert page.verdict["data-exit-code"] == "3" and page.verdict["class"] == "verdict failed"
    assert page.column("plan", "int4", "total") == "4796"
    assert page.column("heads", "attn", "heads after") == "2"
    assert page.column("history-0", "2", "accuracy") == "0.971"   # the kept epoch
    assert (tmp_path / "report.md").read_text().startswith("# compress report: int8_prune30")
    # the artifacts are not there: the tensor chart is left out, not an error
    assert "tensors" not in page.sections and page.svgs >= 8


def test_a_report_json_older_than_its_optional_keys_still_renders():
    """No exit_code, history, fallback, p90 or threads: those parts are left out."""
    old = copy.deepcopy(REPORT)
    del old["history"], old["failed_formats"]
    html = render_html(old)
    assert 'data-passed="false"' in html and "data-exit-code" not in html
    assert 'id="history"' not in html and 'id="fallback"' not in html


@pytest.mark.parametrize("case, message", [
    ("missing", "is not a folder; give the --out folder of a compress run"),
    ("empty", "has no report.json; give the --out folder of a compress run"),
    ("corrupt", "report.json is not valid JSON"),
    ("foreign", "report.json is not a compress report (no recipe, seed, baseline"),
    ("wrong shape", "does not have the shape this version writes"),
])
def test_compress_report_refuses_with_one_error_line(case, message, tmp_path, capsys):
    folder = tmp_path / "out"
    if case != "missing":
        folder.mkdir()
    text = {"corrupt": "{not json", "foreign": json.dumps({"name": "x"}),
            "wrong shape": json.dumps({**REPORT, "artifacts": [{"path": "model.tflite"}]})}
    if case in text:
        (folder / "report.json").write_text(text[case])
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (folder / "report.html").exists()


def test_the_page_has_no_url_and_escapes_what_the_run_named(tmp_path):
    named = copy.deepcopy(FULL)
    named["recipe"]["name"] = "<script>alert(1)</script>"
    (tmp_path / "report.json").write_text(json.dumps(named))
    (tmp_path / "report.html").write_text(render_html(named, tmp_path))
    parse_page(tmp_path / "report.html")   # no http(s) URL, no src= / <link href>
    assert "<script>alert(1)" not in (tmp_path / "report.html").read_text()


def test_compress_sweep_writes_sweep_html_even_when_every_recipe_fails(tmp_path, capsys):
    """No recipe loads, so nothing runs: the page lists the errors and draws no Pareto plot."""
    out = tmp_path / "sweep"
    assert main(["sweep", "model.keras", "--recipes", "int8_prun30", "--out", str(out)]) == 0
    assert "sweep.html" in capsys.readouterr().out
    page = parse_page(out / "sweep.html")
    assert page.sections == ["runs", "errors"] and page.links == []
    assert "did you mean 'int8_prune30'" in (out / "sweep.html").read_text().replace("&#x27;", "'")
