"""The `compress` command. Every failure becomes one `error:` line and an exit code (cli_guard)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from compressor.cli.guard import Parser, debug_requested, guarded
from compressor.core.cluster import record_exit_code

SUBCOMMANDS = ("recipes", "inspect", "eval", "devices", "sweep", "plan", "generate", "report",
               "split", "stage")

EPILOG = """\
other commands:
  compress recipes list | compress recipes show NAME
  compress inspect ARTIFACT [--json]      sizes, dtypes, sparsity, ops, est. memory
  compress eval ARTIFACT --data D         metric of an artifact in its runtime
  compress devices                        the device profiles
  compress sweep MODEL --recipes a,b,c --data D --out DIR   sweep.csv, pareto.png, sweep.html
  compress report OUT_DIR [--open]        report.md + report.html again from report.json
  compress plan MODEL [--target D|all|host] [--context N] [--devices K] [--json]
                                          will an LLM fit, at which recipe, how fast (from shapes)
  compress generate ARTIFACT --prompt TEXT [--max-new-tokens N] [--chat]
                                          text from an LLM artifact, streamed, then tokens/s
  compress split MODEL_ONNX_DIR --devices K [--out DIR]   K pipeline stages (one per board),
                                          checked against the unsplit model
  compress stage SPLIT_DIR --rank K --master HOST:PORT    serve one stage on a board (rank 0:
                                          compress generate SPLIT_DIR --master HOST:PORT)

exit codes: 0 passed, 1 internal error (a bug: rerun with --debug for the traceback),
  2 bad input, 3 accuracy gate failed, 4 device budget exceeded, 130/143 interrupted
"""


def main(argv: list[str] | None = None) -> int:
    os.environ["COMPRESSOR_CLI"] = "1"   # compressor.core.quiet: the command owns the root logger
    debug, argv = debug_requested(list(sys.argv[1:] if argv is None else argv))
    code = guarded(lambda: _dispatch(argv), debug)
    record_exit_code(code)   # a `--workers` rank's code, for its launcher
    return code


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        from compressor.cli.commands import run as run_subcommand

        return run_subcommand(argv[0], argv[1:])
    args = _compress_parser().parse_args(argv)
    if args.workers > 1:
        from compressor.core.cluster import under_launcher
        from compressor.run import workers

        if not under_launcher():
            from compressor.backends import framework_of

            return workers.launch(args.workers, workers.without_workers(argv),
                                  framework_of(args.model))
    return _compress(args)


def _compress_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="compress", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compress a Keras or PyTorch model with a named recipe, export TFLite / ONNX, "
                    "and validate the artifacts in LiteRT / onnxruntime.")
    parser.add_argument("model", help="model.keras | model.h5 | SavedModel dir | model.pt2 | "
                                      "module:function (PyTorch, transformers) | Hugging Face "
                                      "folder | model.gguf")
    parser.add_argument("--recipe", required=True, help="built-in name (compress recipes list) "
                                                        "or a recipe .yaml")
    parser.add_argument("--weights", help="state_dict file for a module:function PyTorch model")
    parser.add_argument("--data", default="digits",
                        help="digits (built-in) | data.npz (x_train y_train x_val y_val) | "
                             "module:function; language models: text (built-in English) | "
                             "corpus.txt | corpus.jsonl  [default: digits, or text for a "
                             "language model]")
    parser.add_argument("--teacher", help="teacher model for distill steps (same forms as MODEL)")
    parser.add_argument("--teacher-weights", help="state_dict file for a PyTorch teacher")
    parser.add_argument("--out", default="dist", help="output folder [default: dist]")
    parser.add_argument("--target", help="device profile (compress devices); default: the recipe's")
    parser.add_argument("--format", help="comma-separated subset of tflite,onnx; default: the recipe's")
    parser.add_argument("--seed", type=int, default=0, help="random seed [default: 0]")
    parser.add_argument("--threads", type=int, help="runtime threads for latency [default: all cores]")
    parser.add_argument("--context", type=int,
                        help="language models: the context length the artifacts' KV cache is "
                             "sized to [default: the model's, at most 4096]")
    parser.add_argument("--devices", type=int,
                        help="language models: also split the ONNX artifact into K pipeline "
                             "stages, one per board (split/ in --out), checked against it")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")
    parser.add_argument("--force-plan", action="store_true",
                        help="run even when `compress plan` says the recipe cannot fit --target")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow pickled PyTorch modules (loading them runs code from the file)")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency measurement")
    parser.add_argument("--workers", type=int, default=1,
                        help="fine-tuning on N local data-parallel ranks (PyTorch: torchrun, "
                             "gloo; Keras: TF_CONFIG workers); rank 0 writes --out [default: 1]")
    parser.add_argument("--quiet", "-q", action="store_true", help="print errors only")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of a failure (any command)")
    return parser


def _compress(args: argparse.Namespace) -> int:
    from compressor.run.pipeline import compress
    from compressor.core.cluster import rank

    if rank() > 0:
        return _compress_other_rank(args)
    result = compress(args.model, args.recipe, args.data, **_options(args))
    if not args.quiet:
        from compressor.report.summary import print_summary

        print_summary(result.report, result.out_dir)
    result.check()   # a failed gate / budget raises its typed error (exit 3 / 4)
    return 0


def _options(args: argparse.Namespace) -> dict:
    formats = tuple(f.strip() for f in args.format.split(",")) if args.format else None
    return dict(teacher=args.teacher, out_dir=Path(args.out), target=args.target,
                formats=formats, seed=args.seed, weights=args.weights,
                teacher_weights=args.teacher_weights, trust_pickle=args.trust_pickle,
                force=args.force, quiet=args.quiet, latency=not args.no_latency,
                threads=args.threads, context=args.context,
                force_plan=args.force_plan, devices=args.devices)


def _compress_other_rank(args: argparse.Namespace) -> int:
    """Ranks 1..N-1 train with rank 0 (every collective must be met) and stop there: no export,
    no validation, nothing written but their own work folder, which goes."""
    from compressor.run.pipeline import run_steps
    from compressor.run.session import open_session
    from compressor.core.workspace import removed_after

    session = open_session(args.model, args.recipe, args.data, **{
        **_options(args), "out_dir": None, "quiet": True, "latency": False})
    with removed_after(session.ctx.workdir):
        run_steps(session)
    return 0


if __name__ == "__main__":
    sys.exit(main())
