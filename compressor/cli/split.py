"""`compress split ARTIFACT --devices K`: a model-onnx folder cut into K pipeline stages (one
per board), checked end to end against the unsplit model, with speed and memory per stage;
`compress stage SPLIT_DIR --rank k --master HOST:PORT`: serve one stage on a board (rank 0 is
`compress generate SPLIT_DIR --master HOST:PORT`, which drives)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from compressor.cli.guard import Parser
from compressor.errors import AccuracyGateError, UsageError
from compressor.render.sizes import human_size
from compressor.tasks.lm.split import split_and_check, split_failure


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
    failure = split_failure(report)
    if failure:
        raise AccuracyGateError(failure)
    return 0


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
