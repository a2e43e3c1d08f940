"""`compress plan MODEL`: the plan as a table on the terminal, or one JSON object (--json)."""
from __future__ import annotations

import json
import sys

from compressor.cli.guard import Parser
from compressor.render.sizes import human_size

TFLITE_LIMIT = 2**31 - 1   # a flatbuffer's size: the LiteRT route refuses larger weights
BOUNDS_NOTE = ("tok/s are upper bounds, not predictions: decode <= bandwidth / bytes read per "
               "token (weights + KV cache), prefill <= compute / ops per token")


def run_plan(argv: list[str]) -> int:
    from compressor.plan import plan

    parser = Parser(prog="compress plan",
                    description="will a model fit a device, at which recipe, how fast can it "
                                "decode; from shapes alone (no weight data is read)")
    parser.add_argument("model", nargs="?", help="config.json | HF folder | .safetensors | "
                        "model.safetensors.index.json | .gguf | a built-in name (--list) | "
                        ".onnx / .tflite")
    parser.add_argument("--target", help="device profile (compress devices), host (this machine, "
                                         "measured) or all [default: jetson-orin-nx-8gb]")
    parser.add_argument("--context", type=int, help="positions held in the KV cache [default: "
                                                    "the model's, at most 4096]")
    parser.add_argument("--batch", type=int, default=1, help="sequences at once [default: 1]")
    parser.add_argument("--recipes", help="comma-separated recipes: built-in names (compress "
                                          "recipes list), fp32 (no step) or .yaml files "
                                          "[default: fp16,int8,int4,int4_g128]")
    parser.add_argument("--recipe", action="append", default=[],
                        help="a recipe to plan, built-in name or .yaml file (repeatable; with "
                             "--recipes: both are planned)")
    parser.add_argument("--kv-dtype", choices=("float16", "int8", "float32"),
                        help="KV cache element type [default: the artifact's: float32 for "
                             "int8 / int4 CPU builds, float16 for fp16]")
    parser.add_argument("--devices", type=int, help="split the layers over K boards (pipeline)")
    parser.add_argument("--json", action="store_true", help="one JSON object (keys: docs/language-models.md)")
    parser.add_argument("--list", action="store_true", help="the built-in models")
    args = parser.parse_args(argv)
    if args.list:
        return _list()
    if not args.model:
        parser.error("give MODEL (or --list for the built-in names)")
    recipes = [r.strip() for r in (args.recipes or "").split(",") if r.strip()] + args.recipe
    result = plan(args.model, args.target, args.context, args.batch, recipes or None,
                  args.kv_dtype, args.devices)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _render(result)
    return 0


def _list() -> int:
    from compressor.decoders.catalogue import entries

    for entry in entries().values():
        print(f"{entry.name:<18} {entry.params:>15,} params  {entry.source}")
    return 0


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def _render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 132)
    m = result["model"]
    layers = f", {m['layers']} layers" if m.get("layers") else ""
    active = m.get("active_params", m["params"])
    params = (f"{m['params']:,} params ({active:,} active per token: a mixture of experts)"
              if active != m["params"] else f"{m['params']:,} params")
    console.print(f"{m['name']}: {params}{layers} ({m['source']})")
    context = f"context {result['context']}, batch {result['batch']}" if result["context"] else ""
    for target in result.get("targets", [result]):
        d = target["device"]
        bw = f", {d['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s" if d["bandwidth_bytes_per_s"] else ""
        table = Table(title=f"{target.get('target', result['target'])}: {human_size(d['usable_bytes'])} "
                            f"usable{bw}; {context}", title_justify="left")
        for col in ("recipe", "weights", "KV cache", "working", "total", "fits", "headroom",
                    "decode tok/s <=", "prefill tok/s <=", "max context"):
            table.add_column(col, justify="left" if col in ("recipe", "fits") else "right", no_wrap=True)
        for p in target["plans"]:
            headroom = human_size(abs(p["headroom_bytes"]))
            table.add_row(p["recipe"], human_size(p["weights_bytes"]), human_size(p["kv_cache_bytes"]),
                          human_size(p["working_bytes"]), human_size(p["total_bytes"]),
                          "yes" if p["fits"] else "NO",
                          headroom if p["headroom_bytes"] >= 0 else f"-{headroom}",
                          _rate(p["decode_tokens_per_s_bound"]), _rate(p["prefill_tokens_per_s_bound"]),
                          "-" if p["max_context"] is None else f"{p['max_context']:,}")
        console.print(table)
        _render_tflite(console, target["plans"])
        _render_gguf(console, target["plans"], result.get("llama_cpp_kv_cache_bytes"))
        mixed = [f"{p['recipe']} up to {p['int8_budget']:g}x" for p in target["plans"]
                 if p.get("int8_budget", 1.0) > 1.0]
        if mixed:
            console.print("int8 for the matrices int4 moves most (chosen when quantizing; weights "
                          f"counted at that ceiling): {', '.join(mixed)} the all-int4 bytes")
        console.print(f"recommended: {target['recommended'] or 'none fits with 5% headroom'}")
        if "split" in target:
            _render_split(console, target["split"])
    if result["context"]:
        console.print(BOUNDS_NOTE, style="dim")


def _render_tflite(console, plans: list[dict]) -> None:
    """The LiteRT route's model.tflite per recipe (weights above: the ONNX artifact)."""
    sizes = [f"{p['recipe']} {human_size(p['tflite_bytes'])}"
             + (" (over 2 GiB: not written)" if p["tflite_bytes"] > TFLITE_LIMIT else "")
             for p in plans if p.get("tflite_bytes") is not None]
    if sizes:
        console.print(f"model.tflite (weights column: the ONNX artifact): {', '.join(sizes)}")


def _render_gguf(console, plans: list[dict], kv: dict | None) -> None:
    """The GGUF route's model.gguf per recipe, and llama.cpp's KV cache at its cache types."""
    sizes = [f"{p['recipe']} {human_size(p['gguf_bytes'])}" for p in plans
             if p.get("gguf_bytes") is not None]
    if sizes:
        cache = (f"; llama.cpp KV cache f16 {human_size(kv['f16'])}, q8_0 "
                 f"{human_size(kv['q8_0'])} (-ctk / -ctv)") if kv else ""
        console.print(f"model.gguf (llama.cpp): {', '.join(sizes)}{cache}")


def _render_split(console, split: dict) -> None:
    stages = ", ".join(f"layers {s['first_layer']}-{s['last_layer']}: {human_size(s['bytes'])}"
                       for s in split["stages"])
    verdict = "fits" if split["fits"] else "does NOT fit"
    console.print(f"split over {split['devices']} devices at {split['recipe']} ({verdict}): {stages}; "
                  f"{split['link_bytes_per_token']:,} bytes per token per link, link <= "
                  f"{_rate(split['link_tokens_per_s_bound'])} tok/s, decode <= "
                  f"{_rate(split['decode_tokens_per_s_bound'])} tok/s")
