"""The `compress` subcommands: recipes, inspect, eval, devices."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from compressor.cli.generate import generate
from compressor.cli.plan import run_plan
from compressor.cli.report import report
from compressor.cli.guard import Parser
from compressor.errors import CompressorError, DataError
from compressor.render.sizes import human_size
from compressor.core.tensors import is_named, rows, specs_of


def run(command: str, argv: list[str]) -> int:
    commands = {"recipes": _recipes, "inspect": _inspect, "eval": _eval, "devices": _devices,
                "sweep": _sweep, "plan": run_plan, "generate": generate,
                "report": report, "split": _split, "stage": _stage}
    return commands[command](argv)


def _split(argv: list[str]) -> int:
    from compressor.cli.split import split

    return split(argv)


def _stage(argv: list[str]) -> int:
    from compressor.cli.split import stage

    return stage(argv)


def _recipes(argv: list[str]) -> int:
    from compressor.config.recipe import builtin_names, load_recipe

    parser = Parser(prog="compress recipes")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the built-in recipes")
    show = sub.add_parser("show", help="a recipe as YAML, with its `extends` resolved")
    show.add_argument("name", help="built-in name or path to a .yaml")
    args = parser.parse_args(argv)
    if args.action == "list":
        for name in builtin_names():
            recipe = load_recipe(name)
            print(f"{name:<18} {recipe.description}")
    else:
        print(load_recipe(args.name).to_yaml(), end="")
    return 0


def _inspect(argv: list[str]) -> int:
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.weights import MATRIX_ELEMENTS, int8_weight_share

    parser = Parser(prog="compress inspect", description="what an artifact holds")
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--json", action="store_true", help="one JSON object with report keys")
    parser.add_argument("--target", help="device profile to check the memory estimate against")
    args = parser.parse_args(argv)
    _require_file(args.artifact)
    info = inspect_artifact(args.artifact)
    summary = {
        "format": info.format, "path": str(info.path), "size_bytes": info.size_bytes,
        "gzip_bytes": info.gzip_bytes, "sha256": info.sha256, "params": info.params,
        "macs": info.macs,
        "weight_dtypes": info.weight_dtypes, "sparsity": info.sparsity, "ops": info.ops,
        "inputs": info.inputs, "outputs": info.outputs, "fixed_batch": info.fixed_batch,
        # the gate's share; None when no tensor is large enough to count (a tiny model)
        "int8_weight_share": round(int8_weight_share(info.weights)[0], 6)
        if any(w.size >= MATRIX_ELEMENTS for w in info.weights) else None,
        "est_peak_memory_bytes": info.est_peak_memory_bytes,
    }
    if info.storage:   # a .gguf: llama.cpp's tensor types, their bytes and bits per weight
        summary["storage"] = info.storage
    if args.target:
        from compressor.devices import fits

        summary["fits_target"] = fits(info, args.target)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{info.path}  ({info.format})")
    print(f"  size          {human_size(info.size_bytes)} raw, {human_size(info.gzip_bytes)} gzip")
    print(f"  params        {info.params:,}")
    print(f"  MACs          {info.macs:,} per sample (conv / dense / matmul)")
    print("  weight dtypes " + ", ".join(f"{k} {v:.1%}" for k, v in info.weight_dtypes.items())
          + " of the weight elements")
    if summary["int8_weight_share"] is not None:
        print(f"  int8 share    {summary['int8_weight_share']:.1%} of the weight bytes in matrices "
              "and tables (what the int8 gate reads)")
    print(f"  sparsity      {info.sparsity:.1%} of kernel weights are zero")
    print(f"  est. memory   {human_size(info.est_peak_memory_bytes)}")
    for kind in ("inputs", "outputs"):
        for io in summary[kind]:
            print(f"  {kind[:-1]:<13} {io['name']} {io['shape']} {io['dtype']}")
    print("  batch         " + ("dynamic (-1): any number of rows per call" if info.fixed_batch is None
                              else f"fixed at {info.fixed_batch}: every call takes exactly "
                                   f"{info.fixed_batch} row(s); resizing is refused"))
    if info.ops:
        print("  ops           " + ", ".join(f"{k} x{v}" for k, v in sorted(info.ops.items())))
    for kind, entry in info.storage.items():
        print(f"  {kind:<13} {entry['tensors']} tensors, {human_size(entry['bytes'])}, "
              f"{entry['bits_per_weight']:g} bits per weight")
    if "fits_target" in summary:
        print(f"  fits {args.target}: {'yes' if summary['fits_target'] else 'NO'}")
    return 0


def _eval(argv: list[str]) -> int:
    import tempfile

    from compressor.tasks.array.data import load_data
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.isolated import RuntimeRunError, run_isolated
    from compressor.tasks.array.metrics import metric_value

    parser = Parser(prog="compress eval", description="an artifact's metric")
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--data", required=True, help="digits | data.npz | module:function")
    parser.add_argument("--metric", default="accuracy", choices=("accuracy", "mse"))
    parser.add_argument("--threads", type=int)
    parser.add_argument("--output", type=_output_key,
                        help="multi-output artifacts: the output (name or index) the metric reads")
    args = parser.parse_args(argv)
    _require_file(args.artifact)
    info = inspect_artifact(args.artifact)
    shape = info.inputs[0]["shape"] or []   # None: an ONNX input of unknown rank
    # Built-in images: a channel dimension of 1 right after the batch means NCHW.
    layout = "NCHW" if len(shape) == 4 and shape[1] == 1 else "NHWC"
    data = load_data(args.data, layout)
    x, y = data.val
    x = x if is_named(x) else np.asarray(x)
    if args.metric == "accuracy" and y is None:
        raise DataError(f"{data.name} has no y_val labels; accuracy needs them")
    _check_input_shapes(x, info.inputs, data.name, args.artifact.name)
    if len(info.outputs) > 1 and args.output is None:
        # a runtime's output order need not be the model's (LiteRT orders by tensor index)
        raise DataError(f"{args.artifact.name} has {len(info.outputs)} outputs "
                        f"({', '.join(o['name'] for o in info.outputs)}); pass --output NAME: the "
                        "one the metric reads (a report reads validate.output)")
    with tempfile.TemporaryDirectory(prefix="compressor-eval-") as folder:
        try:
            run = run_isolated(args.artifact, x, Path(folder), threads=args.threads)
        except (DataError, RuntimeRunError) as exc:   # the runtime refused this data (dtype, values)
            raise DataError(f"{args.artifact.name} cannot run {data.name}'s val inputs "
                            f"({'; '.join(s.describe() for s in specs_of(x))}): {exc}") from None
    value = metric_value(args.metric, run.outputs, y, run.outputs, args.output)
    print(json.dumps({"path": str(args.artifact), "metric": args.metric, "value": value,
                      "samples": rows(x)}))
    return 0


def _check_input_shapes(x, inputs: list[dict], data_name: str, artifact: str) -> None:
    """DataError when a val input's rank or a fixed dimension differs from the artifact's
    input of the same name (the only one, for a single-input artifact)."""
    given = x if is_named(x) else {inputs[0]["name"]: x}
    wanted = {io["name"]: io["shape"] for io in inputs}
    if len(given) == len(inputs) and not set(given) & set(wanted):
        wanted = dict(zip(given, wanted.values()))   # other names: in order, as the runtime feeds
    for name, array in given.items():
        shape = wanted.get(name)
        if shape is None:
            continue
        if len(shape) != array.ndim or any(isinstance(want, int) and want > 0 and want != got
                                           for want, got in zip(shape[1:], array.shape[1:])):
            raise DataError(f"{data_name}: val input {name} has shape {array.shape}, but "
                            f"{artifact} takes {shape}; give data shaped for this artifact")


def _devices(argv: list[str]) -> int:
    from compressor.devices import load_profiles

    Parser(prog="compress devices", description="device profiles").parse_args(argv)
    for name, p in load_profiles().items():
        print(f"{name:<22} {human_size(p.memory_bytes):>9} total, {human_size(p.budget_bytes):>9} "
              f"for the model  {p.arch:<8} {', '.join(p.runtimes)}")
    return 0


def _sweep(argv: list[str]) -> int:
    from compressor.report.pareto import plot_pareto
    from compressor.run.sweep import sweep

    parser = Parser(prog="compress sweep",
                                     description="run several recipes; write sweep.csv, pareto.png "
                                                 "and sweep.html")
    parser.add_argument("model")
    parser.add_argument("--recipes", required=True, help="comma-separated names or .yaml paths")
    parser.add_argument("--data", default="digits")
    parser.add_argument("--out", type=Path, default=Path("sweep"))
    parser.add_argument("--weights")
    parser.add_argument("--teacher")
    parser.add_argument("--target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--executor", choices=("serial", "ray"), default="serial",
                        help="ray: one Ray task per recipe (pip install 'compressor[ray]')")
    parser.add_argument("--address", help="with --executor ray: a running Ray cluster "
                        "(default: a local Ray on 127.0.0.1, started for this sweep)")
    args = parser.parse_args(argv)
    frame = sweep(args.model, [r.strip() for r in args.recipes.split(",") if r.strip()], args.data,
                  args.out, weights=args.weights, teacher=args.teacher, target=args.target,
                  seed=args.seed, latency=not args.no_latency, executor=args.executor,
                  address=args.address)
    frame.to_csv(args.out / "sweep.csv", index=False)
    plot_pareto(frame).savefig(args.out / "pareto.png", dpi=120)
    from compressor.report.html.sweep_page import render_sweep

    (args.out / "sweep.html").write_text(render_sweep(frame, args.out))
    columns = ["recipe", "format", "size_bytes", "metric_value", "drop", "passed", "cached", "error"]
    print(frame[columns].to_string(index=False))
    print(f"wrote {args.out / 'sweep.csv'}, {args.out / 'pareto.png'} and {args.out / 'sweep.html'}")
    return 0  # a recipe that failed is a row with its error, not a failed sweep


def _output_key(text: str) -> str | int:
    return int(text) if text.isdigit() else text


def _require_file(path: Path) -> None:
    """`path` is an artifact of a registered format (compressor/formats): its file, or its
    folder (a language model's model-onnx/); the format's quick check runs on a file."""
    from compressor.formats import artifact_format, artifact_suffixes, registered_formats, resolve

    fmt = artifact_format(path)
    if fmt is not None and fmt.is_folder_artifact(path):
        return
    if not path.is_file():
        folders = [f.folder_hint for f in registered_formats() if f.folder_hint]
        raise CompressorError(f"{path} does not exist; give the path of a "
                              f"{' or '.join(artifact_suffixes())} file"
                              + (f" (or {' or '.join(folders)})" if folders else ""))
    if fmt is not None and fmt.check:
        resolve(fmt.check)(path)
