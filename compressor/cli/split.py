"""`compress split ARTIFACT --devices K`: a model-onnx folder cut into K pipeline stages (one
per board), checked end to end against the unsplit model, with speed and memory per stage;
`compress stage SPLIT_DIR --rank k --master HOST:PORT`: serve one stage on a board (rank 0 is
`compress generate SPLIT_DIR --master HOST:PORT`, which drives)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from compressor.cli.guard import Parser
from compressor.errors import AccuracyGateError, ModelLoadError, UsageError
from compressor.render.sizes import human_size

CHECK_WINDOWS, CHECK_WINDOW, CHECK_PROMPTS, CHECK_NEW = 8, 64, 2, 16
LOGIT_TOLERANCE = 1e-4


def split(argv: list[str]) -> int:
    parser = Parser(prog="compress split", description="cut a model-onnx folder into K pipeline "
                    "stages (one per board) and check them against the unsplit model")
    parser.add_argument("artifact", type=Path, help="the model-onnx folder a compress run wrote")
    parser.add_argument("--devices", type=int, required=True, help="stages (boards), at least 2")
    parser.add_argument("--out", type=Path, help="the split folder [default: ARTIFACT/../split]")
    parser.add_argument("--layers", help="layer ranges per stage, e.g. 0-13,14-31 [default: the "
                                         "plan's partition over the artifact's bytes]")
    parser.add_argument("--no-check", action="store_true", help="write only; no end-to-end check")
    parser.add_argument("--threads", type=int, help="threads in all, shared by the local stages")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    report = split_and_check(args.artifact, args.devices, args.out, _ranges(args.layers),
                             check=not args.no_check, threads=args.threads)
    print(json.dumps(report, indent=2) if args.json else "\n".join(summary_lines(report)))
    check = report.get("validation")
    if check and not (check["greedy_identical"] and check["max_abs_logit_diff"] <= LOGIT_TOLERANCE):
        raise AccuracyGateError(f"the split's outputs differ from the unsplit model's (logits "
                                f"{check['max_abs_logit_diff']:.2e} apart, greedy identical: "
                                f"{check['greedy_identical']}); {report['out']}/split_report.json")
    return 0


def split_and_check(artifact: Path, devices: int, out: Path | None, ranges=None,
                    check: bool = True, threads: int | None = None) -> dict:
    """Write the split folder and its split_report.json; returns the report."""
    from compressor.export.onnx_split import layer_costs, split_folder
    from compressor.plan.split import partition

    if devices < 2:
        raise UsageError(f"--devices {devices}: a split needs at least 2 stages")
    if not (Path(artifact) / "genai_config.json").is_file():
        raise ModelLoadError(f"{artifact}: not a model-onnx folder (no genai_config.json); give "
                             "the folder the ONNX route wrote")
    out = Path(out) if out else Path(artifact).parent / "split"
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
        report["validation"], report["speed"] = _check(artifact, out, threads)
        for stage, measured in zip(stages, report["speed"]["split"]["stages"]):
            stage.update(measured)
    (out / "split_report.json").write_text(json.dumps(report, indent=2))
    return report


def _check(artifact: Path, out: Path, threads: int | None) -> tuple[dict, dict]:
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
    validation = check_split(artifact, out, windows, prompts, CHECK_NEW, max(1, cores // devices))
    return validation, speeds(artifact, out, cores, max(1, cores // devices), 128, 32)


def _token_bytes(tensors: list[dict]) -> int:
    sizes = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}
    return sum(sizes.get(t["dtype"], 4) * int(np.prod([d for d in t["shape"] if isinstance(d, int)]))
               for t in tensors)


def _ranges(text: str | None) -> list[tuple[int, int]] | None:
    if not text:
        return None
    try:
        return [(int(a), int(b)) for a, b in (part.split("-") for part in text.split(","))]
    except ValueError:
        raise UsageError(f"--layers {text}: give ranges like 0-13,14-31") from None


def summary_lines(report: dict) -> list[str]:
    lines = [f"split {report['source']} into {report['devices']} stages: {report['out']} "
             f"({human_size(report['stage_bytes_total'])} in all, the unsplit "
             f"{human_size(report['source_bytes'])}, {human_size(report['shared_bytes'])} held "
             "by more than one stage)"]
    for stage in report["stages"]:
        extra = (f", peak RSS {human_size(stage['peak_rss_bytes'])}, sends "
                 f"{stage['sent_bytes_per_token']:,} B/token") if "peak_rss_bytes" in stage else ""
        lines.append(f"  stage {stage['rank']}: layers {stage['layers'][0]}-{stage['layers'][1]}, "
                     f"{stage['file']} {human_size(stage['bytes'])}{extra}")
    check = report.get("validation")
    if check:
        lines.append(f"  check: logits within {check['max_abs_logit_diff']:.1e} of the unsplit "
                     f"model, top-1 {check['top1_agreement']:.1%}, perplexity "
                     f"{check['perplexity']:.3f} (unsplit {check['perplexity_unsplit']:.3f}), greedy "
                     f"{'identical' if check['greedy_identical'] else 'DIFFERENT'}")
        speed = report["speed"]
        lines.append(f"  decode {speed['split']['decode_tokens_per_s']:.1f} tokens/s split, "
                     f"{speed['single']['decode_tokens_per_s']:.1f} in one process")
    return lines


def stage(argv: list[str]) -> int:
    """One stage's process; RANK / MASTER_ADDR / MASTER_PORT as torchrun sets them also do."""
    from compressor.runtimes.split_lm import DEFAULT_TIMEOUT_S
    from compressor.runtimes.split_stages import worker_main

    parser = Parser(prog="compress stage", description="serve one stage of a split model "
                    "(rank 0 is `compress generate SPLIT_DIR --master HOST:PORT`)")
    parser.add_argument("folder", type=Path, help="the split folder (a copy on this board)")
    parser.add_argument("--rank", type=int, default=_env_int("RANK"))
    parser.add_argument("--master", default=_env_master(), help="HOST:PORT of rank 0")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds to wait for a neighbour [default: {DEFAULT_TIMEOUT_S:g}]")
    parser.add_argument("--threads", type=int, help="runtime threads [default: all cores]")
    args = parser.parse_args(argv)
    if args.rank is None or not args.master:
        raise UsageError("give --rank K and --master HOST:PORT (or RANK, MASTER_ADDR and "
                         "MASTER_PORT as torchrun sets them)")
    host, _, port = args.master.rpartition(":")
    sys.stdout.flush()
    return worker_main(args.folder, args.rank, host, int(port), args.timeout, args.threads)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else None


def _env_master() -> str | None:
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{host}:{port}" if host and port else None
