"""A split model checked end to end against the unsplit one it was cut from: the same
model.onnx run whole in onnxruntime with the same feeding code (split_stages.StageModel), on
teacher-forced windows (logits, top-1, perplexity) and greedy continuations (also against
onnxruntime-genai's own generator, GenaiLm), then speed and memory per stage measured in
child processes (split_speed.py) beside the single-process figure."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from compressor.runtimes.lm import PREDICT_BATCH
from compressor.runtimes.split_lm import SplitLm
from compressor.runtimes.split_stages import StageModel, read_split, result_of


def whole_model(source: Path, threads: int | None = None) -> StageModel:
    config = json.loads((Path(source) / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    return StageModel(Path(source) / decoder.get("filename", "model.onnx"), decoder, threads)


def whole_greedy(model: StageModel, prompt: list[int], count: int, eos_ids: list[int]) -> list[int]:
    """Greedy with end-of-sequence suppressed, as SplitLm.generate without stop ids."""
    ids, total, out = np.array([prompt], np.int64), len(prompt), []
    for _ in range(count):
        token = int(result_of(model.run(1, total, {}, ids)["logits"], 2, eos_ids)[0])
        out.append(token)
        ids, total = np.array([[token]], np.int64), total + 1
    return out


def _scores(logits: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return logits.argmax(-1), np.take_along_axis(logp[:, :-1], rows[:, 1:, None], -1)[..., 0]


def check_split(source: Path, folder: Path, windows: np.ndarray, prompts: list[list[int]],
                new_tokens: int, threads: int | None = None, genai: bool = True) -> dict:
    """{"max_abs_logit_diff", "top1_agreement", "perplexity", "perplexity_unsplit",
    "greedy_identical", "genai_greedy_identical", ...}: the split against the unsplit model."""
    split = read_split(folder)
    whole = whole_model(source, threads)
    diffs, agree, logp_split, logp_whole, greedy, reference = [], [], [], [], [], []
    with SplitLm(folder, threads=threads) as runtime:
        for start in range(0, len(windows), PREDICT_BATCH):
            rows = np.asarray(windows[start:start + PREDICT_BATCH], np.int64)
            ours = runtime.logits(rows)
            theirs = whole.run(len(rows), rows.shape[1], {}, rows)["logits"].astype(np.float32)
            diffs.append(float(np.abs(ours - theirs).max()))
            (top_a, lp_a), (top_b, lp_b) = _scores(ours, rows), _scores(theirs, rows)
            agree.append((top_a == top_b).mean())
            logp_split.append(lp_a.ravel())
            logp_whole.append(lp_b.ravel())
        for prompt in prompts:
            greedy.append(runtime.generate(prompt, new_tokens))
            reference.append(whole_greedy(whole, prompt, len(greedy[-1]), split.get("eos_ids", [])))
    result = {"windows": int(len(windows)), "window_tokens": int(windows.shape[1]),
              "max_abs_logit_diff": max(diffs), "top1_agreement": float(np.mean(agree)),
              "perplexity": float(np.exp(-np.concatenate(logp_split).mean())),
              "perplexity_unsplit": float(np.exp(-np.concatenate(logp_whole).mean())),
              "prompts": len(prompts), "new_tokens": new_tokens,
              "greedy_identical": greedy == reference, "greedy": greedy}
    if genai:
        from compressor.runtimes.genai import GenaiLm

        lm = GenaiLm(source, threads=threads)
        result["genai_greedy_identical"] = [lm.generate(p, new_tokens) for p in prompts] == greedy
    return result


def speeds(source: Path, folder: Path, threads: int, stage_threads: int, prefill: int,
           decode: int) -> dict:
    """{"split": split_speed's keys with per-stage `stages` (`stage_threads` each), "single":
    the unsplit model.onnx in one process with the same loop (`threads`)}; each measured in a
    child process of its own."""
    from compressor.runtimes.lm_speed import run_child

    module = "compressor.runtimes.split_speed"
    return {"split": run_child(module, folder, stage_threads, prefill, decode, "split onnxruntime"),
            "single": run_child(module, source, threads, prefill, decode, "onnxruntime")}
