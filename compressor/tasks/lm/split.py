"""A language model's ONNX artifact cut into K pipeline stages (one per board) and checked end
to end against the unsplit model: `split_and_check` (what `compress split` runs) and
`split_in_run` (what `compress ... --devices K` runs on the model-onnx folder it wrote, after
evaluating it: report.json's `split` on that artifact's row)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from compressor.errors import ModelLoadError, UsageError

CHECK_WINDOWS, CHECK_WINDOW, CHECK_PROMPTS, CHECK_NEW = 8, 64, 2, 16
LOGIT_TOLERANCE = 1e-4
SPLIT_FOLDER = "split"   # beside the model-onnx folder, in --out
SOURCE_MARKER = "genai_config.json"   # what the folder a split cuts holds (model-onnx/)
SPEED_PREFILL, SPEED_DECODE = 128, 32


def check_devices(devices: int | None) -> None:
    """`--devices K`: at least 2 stages (UsageError, exit 2)."""
    if devices is not None and devices < 2:
        raise UsageError(f"--devices {devices}: a split needs at least 2 stages")


def check_split_asked(devices: int | None, formats: tuple[str, ...]) -> None:
    """A compress run's --devices: at least 2, and an ONNX artifact among the formats it writes
    (the split cuts the model-onnx folder); else UsageError (exit 2) before any work."""
    if devices is None:
        return
    check_devices(devices)
    source = split_format()
    if source not in formats:
        raise UsageError(f"--devices {devices} splits the {source} artifact (model-onnx/), and "
                         f"this run writes {', '.join(formats) or 'no format'} only; add {source} "
                         f"to --format (e.g. --format {source}) or drop --devices")


def split_format() -> str:
    """The format whose language-model artifact a split cuts: the one whose folder holds
    genai_config.json (the ONNX route's model-onnx/)."""
    from compressor.formats import registered_formats

    return next(f.name for f in registered_formats() if f.folder == SOURCE_MARKER)


def is_split_source(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / SOURCE_MARKER).is_file()


def split_and_check(artifact: Path, devices: int, out: Path | None, ranges=None,
                    check: bool = True, threads: int | None = None, speed: bool = True) -> dict:
    """Write the split folder and its split_report.json; returns the report. `speed`: also
    measure each stage's memory and the decode speed split and whole (with `check`)."""
    from compressor.export.onnx_split import layer_costs, split_folder
    from compressor.plan.split import partition

    check_devices(devices)
    if not is_split_source(artifact):
        raise ModelLoadError(f"{artifact}: not a model-onnx folder (no genai_config.json); give "
                             "the folder the ONNX route wrote")
    out = Path(out) if out else Path(artifact).parent / SPLIT_FOLDER
    if ranges is None:
        costs, first, last = layer_costs(artifact)
        ranges = partition(costs, min(devices, len(costs)), first, last)
    description = split_folder(artifact, ranges, out)
    stages = [{"rank": s["rank"], "layers": s["layers"], "file": s["file"], "bytes": s["bytes"]}
              for s in description["stages"]]
    report = {"devices": len(stages), "out": str(out), "source": str(artifact),
              "source_bytes": description["source_bytes"],
              "stage_bytes_total": sum(s["bytes"] for s in stages),
              "shared_bytes": description["shared_bytes"], "stages": stages,
              "link_bytes_per_token": [_token_bytes(link["tensors"]) for link in description["links"]]}
    if check:
        report["validation"], report["speed"] = _check(artifact, out, threads, speed)
        for stage, measured in zip(stages, (report["speed"] or {}).get("split", {}).get("stages", [])):
            stage.update(measured)
    (out / "split_report.json").write_text(json.dumps(report, indent=2))
    return report


def split_failure(report: dict) -> str | None:
    """Why the split's outputs are not the unsplit model's (greedy tokens differ, or logits
    further apart than LOGIT_TOLERANCE); None when they are, or when it was not checked."""
    check = report.get("validation")
    if not check or (check["greedy_identical"] and check["max_abs_logit_diff"] <= LOGIT_TOLERANCE):
        return None
    return (f"the split's outputs differ from the unsplit model's (logits "
            f"{check['max_abs_logit_diff']:.2e} apart, greedy identical: "
            f"{check['greedy_identical']}); {report['out']}/split_report.json")


def split_in_run(artifact: Path, devices: int, threads: int | None, latency: bool,
                 progress: Any) -> dict:
    """Split the run's model-onnx folder (in the staging folder) into `devices` stages beside it
    (split/, published with it), check and measure it; report.json's `split` of its row. Paths
    in the written files are relative to --out (the staging folder is gone once published)."""
    progress.info(f"split {Path(artifact).name} into {devices} stages and check them against it")
    report = split_and_check(artifact, devices, None, threads=threads, speed=latency)
    out = Path(report["out"])
    report.update(out=SPLIT_FOLDER, source=Path(artifact).name)
    (out / "split_report.json").write_text(json.dumps(report, indent=2))
    split_json = out / "split.json"
    description = json.loads(split_json.read_text())
    description["source"] = f"../{Path(artifact).name}/{Path(description['source']).name}"
    split_json.write_text(json.dumps(description, indent=2))
    failure = split_failure(report)
    check, speed = report["validation"], report["speed"] or {}
    progress.info(f"split: greedy {'identical' if check['greedy_identical'] else 'DIFFERENT'}, "
                  f"logits within {check['max_abs_logit_diff']:.1e} of {Path(artifact).name}"
                  + (f"; decode {speed['split']['decode_tokens_per_s']:.1f} tokens/s split, "
                     f"{speed['single']['decode_tokens_per_s']:.1f} in one process" if speed else ""))
    return {
        "devices": report["devices"], "path": SPLIT_FOLDER,
        "stages": [{key: stage.get(key) for key in ("rank", "layers", "file", "bytes",
                                                    "peak_rss_bytes", "rss_imported_bytes",
                                                    "sent_bytes_per_token")}
                   for stage in report["stages"]],
        "stage_bytes_total": report["stage_bytes_total"], "shared_bytes": report["shared_bytes"],
        "link_bytes_per_token": report["link_bytes_per_token"],
        "decode_tokens_per_s": speed.get("split", {}).get("decode_tokens_per_s"),
        "decode_tokens_per_s_single": speed.get("single", {}).get("decode_tokens_per_s"),
        "validation": {key: check.get(key) for key in (
            "max_abs_logit_diff", "top1_agreement", "perplexity", "perplexity_unsplit",
            "greedy_identical", "genai_greedy_identical", "windows", "prompts", "new_tokens")},
        "passed": failure is None, "failure": failure and f"{artifact.name}: {failure}",
    }


def _check(artifact: Path, out: Path, threads: int | None, speed: bool) -> tuple[dict, dict | None]:
    from tokenizers import Tokenizer

    from compressor.runtimes.common import default_threads
    from compressor.runtimes.split_check import check_split, speeds
    from compressor.tasks.lm.text_data import TextData

    tokenizer = Tokenizer.from_file(str(Path(artifact) / "tokenizer.json"))
    ids = np.array(tokenizer.encode(TextData().texts()[1]).ids, np.int64)
    window = min(CHECK_WINDOW, len(ids) // CHECK_WINDOWS)
    windows = ids[:window * CHECK_WINDOWS].reshape(CHECK_WINDOWS, window)
    prompts = [list(map(int, w[:window // 2])) for w in windows[:CHECK_PROMPTS]]
    cores = default_threads(threads)
    devices = len(json.loads((out / "split.json").read_text())["stages"])
    stage_threads = max(1, cores // devices)
    validation = check_split(artifact, out, windows, prompts, CHECK_NEW, stage_threads)
    if not speed:
        return validation, None
    return validation, speeds(artifact, out, cores, stage_threads, SPEED_PREFILL, SPEED_DECODE)


def _token_bytes(tensors: list[dict]) -> int:
    sizes = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}
    return sum(sizes.get(t["dtype"], 4) * int(np.prod([d for d in t["shape"] if isinstance(d, int)]))
               for t in tensors)
