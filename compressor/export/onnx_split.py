"""An onnxruntime-genai model.onnx cut into K pipeline stages (`compress split`, `compress
--devices K`): stage k holds the decoder layers of its range, their KV cache inputs / outputs,
the embedding on the first stage and the final norm + lm_head on the last, each in its own
stage{k}.onnx + stage{k}.onnx.data (only its own tensors, copied from model.onnx.data in
chunks: nothing is loaded whole). A run description, split.json, names each stage's file,
layers, inputs, and the tensors that cross each link with their shapes and dtypes
(runtimes/split_stages.py runs it).

Nodes go to stages by the layer index in their names (`/model/layers.{i}/...`; an index past
the last layer is the final norm, so the last stage); `/model/embed_tokens` to the first stage,
`/lm_head` to the last. A node without one (the attention-mask preprocessing, constants) goes
to the latest stage among its producers, or, fed by graph inputs alone, into every stage whose
outputs need it (it is cut again into each). The tensors crossing link k are those produced on
stages <= k and consumed on stages > k, read from the graph: between two decoder layers that is
the residual sum and the last layer's output (SkipSimplifiedLayerNormalization adds them on the
far side), not one named hidden state.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from compressor.errors import ModelLoadError, UsageError

SPLIT_FILE = "split.json"
FORMAT = "compressor-split/1"
LAYER = re.compile(r"^/model/layers\.(\d+)/")
FIRST = ("/model/embed_tokens",)
LAST = ("/lm_head",)
DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64", 6: "int32"}
COPIED = ("genai_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
          "special_tokens_map.json")


def stage_of_layer(ranges: list[tuple[int, int]], layer: int) -> int:
    for k, (first, end) in enumerate(ranges):
        if first <= layer <= end:
            return k
    return len(ranges) - 1   # past the last layer: the final norm


def check_ranges(ranges: list[tuple[int, int]], layers: int) -> None:
    if len(ranges) < 2:
        raise UsageError(f"a split needs at least 2 stages, got {len(ranges)}")
    expected = 0
    for first, end in ranges:
        if first != expected or end < first:
            raise UsageError(f"stage layer ranges {ranges} must cover layers 0-{layers - 1} "
                             "contiguously, in order, each stage at least one layer")
        expected = end + 1
    if expected != layers:
        raise UsageError(f"stage layer ranges {ranges} cover {expected} layers; the model has {layers}")


def assign_nodes(nodes: list, ranges: list[tuple[int, int]]) -> list[int | None]:
    """The stage of each node (None: fed by graph inputs alone, cut into every stage needing it)."""
    producer: dict[str, int] = {}
    stages: list[int | None] = []
    for index, node in enumerate(nodes):
        match = LAYER.match(node.name)
        if match:
            stage = stage_of_layer(ranges, int(match.group(1)))
        elif node.name.startswith(FIRST):
            stage = 0
        elif node.name.startswith(LAST):
            stage = len(ranges) - 1
        else:
            found = [stages[producer[t]] for t in node.input if t in producer]
            found = [s for s in found if s is not None]
            stage = max(found) if found else None
        stages.append(stage)
        for out in node.output:
            if out:
                producer[out] = index
    return stages


def boundaries(nodes: list, stages: list[int | None], count: int) -> list[list[str]]:
    """Per link k (stage k -> k+1): the tensors produced on stages <= k, consumed on > k, in
    the order they are first produced."""
    produced: dict[str, int] = {}
    for node, stage in zip(nodes, stages):
        for out in node.output:
            if out and stage is not None:
                produced[out] = stage
    last_use: dict[str, int] = {}
    for node, stage in zip(nodes, stages):
        for name in node.input:
            if name in produced and stage is not None:
                last_use[name] = max(last_use.get(name, -1), stage)
    return [[t for t, s in produced.items() if s <= k < last_use.get(t, -1)]
            for k in range(count - 1)]


def closure(nodes: list, outputs: list[str], available: set[str]) -> list[int]:
    """Indices (in graph order) of the nodes computing `outputs` from `available` tensors."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    wanted, seen, stack = set(), set(), list(outputs)
    while stack:
        name = stack.pop()
        if not name or name in seen or name in available:
            continue
        seen.add(name)
        if name in producer:
            index = producer[name]
            if index not in wanted:
                wanted.add(index)
                stack.extend(nodes[index].input)
    return sorted(wanted)


def value_json(info) -> dict:
    tensor = info.type.tensor_type
    return {"name": info.name, "dtype": DTYPES.get(tensor.elem_type, str(tensor.elem_type)),
            "shape": [d.dim_param or d.dim_value for d in tensor.shape.dim]}


def split_folder(folder: Path, ranges: list[tuple[int, int]], out: Path) -> dict:
    """Write out/stage{k}.onnx(+.data) for the layer `ranges`, split.json, and copies of the
    genai config and tokenizer files; returns the description (split.json's content)."""
    import onnx

    from compressor.export.onnx_split_data import write_stage

    folder, out = Path(folder), Path(out)
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    source = folder / decoder.get("filename", "model.onnx")
    if not source.is_file():
        raise ModelLoadError(f"{folder}: no {source.name}; give the model-onnx folder compress wrote")
    layers = int(decoder["num_hidden_layers"])
    check_ranges(ranges, layers)
    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    nodes = list(graph.node)
    stages = assign_nodes(nodes, ranges)
    links = boundaries(nodes, stages, len(ranges))
    infos = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}
    missing = [t for link in links for t in link if t not in infos]
    if missing:
        raise ModelLoadError(f"{source}: no type recorded for {missing[:3]}; export it again")
    inputs = {v.name for v in graph.input}
    initializers = {t.name for t in graph.initializer}
    out.mkdir(parents=True, exist_ok=True)
    described = []
    for k in range(len(ranges)):
        received = links[k - 1] if k else []
        sent = links[k] if k < len(links) else []
        own = [t for t in sent if t not in received]
        finals = [o.name for o in graph.output
                  if any(stages[i] == k for i, n in enumerate(nodes) if o.name in n.output)]
        wanted = closure(nodes, own + finals, inputs | initializers | set(received))
        strays = sorted({stages[i] for i in wanted} - {None, k})
        if strays:
            raise ModelLoadError(f"{source}: stage {k} would need nodes of stage(s) {strays}; "
                                 "this graph cannot be cut at these layers")
        entry = write_stage(model, source, out, k, [nodes[i] for i in wanted],
                            [infos[t] for t in received], own + finals, infos)
        entry.update(rank=k, layers=list(ranges[k]), receives=received, sends=sent,
                     outputs=finals)
        described.append(entry)
    shared = _shared_bytes(model, described)
    for name in COPIED:
        if (folder / name).is_file():
            shutil.copy2(folder / name, out / name)
    description = {
        "format": FORMAT, "source": str(source), "source_bytes": _model_bytes(folder, source),
        "eos_ids": _ids(config["model"].get("eos_token_id")), "stages": described,
        "shared_bytes": shared,
        "links": [{"from": k, "to": k + 1, "tensors": [value_json(infos[t]) for t in link]}
                  for k, link in enumerate(links)],
        "result": {"to": 0, "full": {"name": "logits", "dtype": "float32",
                                     "shape": ["batch_size", "sequence_length", config["model"]["vocab_size"]]},
                   "token": {"name": "next_token", "dtype": "int64", "shape": ["batch_size"]}},
    }
    (out / SPLIT_FILE).write_text(json.dumps(description, indent=2))
    return description


def _model_bytes(folder: Path, source: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith(source.name))


def _ids(value) -> list[int]:
    return [] if value is None else [int(v) for v in (value if isinstance(value, list) else [value])]


def _shared_bytes(model, stages: list[dict]) -> int:
    """Bytes of the tensors held by more than one stage, counted once per extra copy (a tied
    embedding / lm_head table on the first and last stage, the rotary caches on each)."""
    import onnx

    sizes = {}
    for tensor in model.graph.initializer:
        ext = {e.key: e.value for e in tensor.external_data}
        sizes[tensor.name] = int(ext["length"]) if tensor.data_location == onnx.TensorProto.EXTERNAL \
            else len(tensor.raw_data)
    counts: dict[str, int] = {}
    for stage in stages:
        for name in stage.pop("tensors"):
            counts[name] = counts.get(name, 0) + 1
    return sum(sizes.get(name, 0) * (n - 1) for name, n in counts.items())


def layer_costs(folder: Path) -> tuple[list[int], int, int]:
    """(bytes per decoder layer: its weights and its float32 KV cache at the folder's context;
    the first stage's extra bytes; the last stage's), read from the artifact's initializers:
    what the plan's partition (plan/split.py) weighs. A tensor both ends read (a tied
    embedding / lm_head) counts on both."""
    import onnx

    folder = Path(folder)
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    model = onnx.load(str(folder / decoder.get("filename", "model.onnx")), load_external_data=False)
    layers = int(decoder["num_hidden_layers"])
    context = int(config.get("search", {}).get("max_length") or config["model"]["context_length"])
    kv = 2 * decoder["num_key_value_heads"] * decoder["head_size"] * context * 4
    costs, ends = [kv] * layers, {"first": 0, "last": 0}
    users: dict[str, set] = {}
    for node in model.graph.node:
        match = LAYER.match(node.name)
        kind = ("last" if int(match.group(1)) >= layers else int(match.group(1))) if match else \
            "first" if node.name.startswith(FIRST) else "last" if node.name.startswith(LAST) else None
        for name in node.input:
            users.setdefault(name, set()).add(kind)
    for tensor in model.graph.initializer:
        ext = {e.key: e.value for e in tensor.external_data}
        size = int(ext.get("length", len(tensor.raw_data)))
        for kind in users.get(tensor.name, set()) - {None}:
            if isinstance(kind, int):
                costs[kind] += size
            else:
                ends[kind] += size
    return costs, ends["first"], ends["last"]
