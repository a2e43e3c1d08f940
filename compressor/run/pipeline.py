"""One compression run: load -> steps -> export -> validate -> report.

Split in three so the training-loop API (prepare / finalize) and sweeps reuse the same parts:
`open_session` (session.py) resolves and checks every input before any work, `run_steps`
applies the recipe, `finish` exports, validates in the real runtimes, reports and publishes
atomically.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import compressor.passes  # noqa: F401  (fills the pass registry)
from compressor.config.gate import gate_failure, gate_passes
from compressor.core.context import ModelState
from compressor.errors import (AccuracyGateError, BackendUnavailableError, DeviceBudgetError,
                               FormatsIncompleteError, first_line)
from compressor.export.int8 import export_checked
from compressor.core.memory import run_objects_only, stop_sampling
from compressor.core.modes import training_flags_kept
from compressor.runtimes.weights import MIN_WEIGHT_SHARE
from compressor.config.recipe import Recipe
from compressor.passes.registry import get_pass
from compressor.report import build_report, write_report
from compressor.run.session import Session, open_session
from compressor.config.steps import StepConfig
from compressor.core.workspace import (check_output_path, make_staging_folder, output_lock, publish,
                                  removed_after)


@dataclass
class Result:
    """What a run produced. `exit_code`: 0 passed, 3 accuracy gate failed, 4 over budget,
    5 some formats could not be produced."""

    passed: bool
    exit_code: int
    out_dir: Path
    artifacts: dict[str, Path]
    report: dict[str, Any]

    def check(self) -> Result:
        """This result if it passed; else AccuracyGateError (exit 3), DeviceBudgetError (exit 4)
        or FormatsIncompleteError (exit 5) naming every failure. The artifacts and report stay
        written either way."""
        if self.exit_code == 0:
            return self
        failures = "; ".join(self.report["failures"])
        error = {AccuracyGateError.exit_code: AccuracyGateError,
                 DeviceBudgetError.exit_code: DeviceBudgetError}.get(self.exit_code,
                                                                     FormatsIncompleteError)
        raise error(f"{failures} (artifacts and report in {self.out_dir})")


def run_steps(session: Session, state: ModelState | None = None,
              steps: Sequence[tuple[int, StepConfig]] | None = None) -> ModelState:
    """Apply the recipe's steps, or only `steps` ((index, step) pairs of them), to `state`."""
    state = state or ModelState(model=session.backend.clone(session.model))
    for index, step in (enumerate(session.recipe.steps) if steps is None else steps):
        session.ctx.progress.info(f"[{index + 1}/{len(session.recipe.steps)}] {step.kind}")
        started = time.perf_counter()
        state = get_pass(step.kind)(state, step, session.ctx, session.backend)
        session.record.add_timing(step.kind, time.perf_counter() - started, index)
    return state


def finish(session: Session, state: ModelState) -> Result:
    """Export every format into a staging folder, validate, report, then publish into out_dir
    (whole folders swapped, see workspace.publish). The work folder goes on every exit path."""
    with removed_after(session.ctx.workdir):
        staging = make_staging_folder(session.out_dir)
        try:
            artifacts = _export_all(session, state, staging)
            rows = _validate_all(session, state, artifacts)
            report = build_report(session, rows, _judge(session, rows, state), artifacts)
            write_report(report, staging)
            published = publish(staging, session.out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            stop_sampling()   # the report has the run's peak RSS
    return Result(passed=report["passed"], exit_code=report["exit_code"], out_dir=session.out_dir,
                  artifacts={fmt: published / path.name for fmt, path in artifacts.items()},
                  report=report)


def compress(model: Any, recipe: str | Path | Recipe, data: Any = "digits", **options: Any) -> Result:
    """The whole run, as the `compress` command does it; `out_dir` is locked for all of it.
    An in-memory `model` (or `(model, tokenizer)` pair) gets its modules' training flags back
    when the call ends, however it ends."""
    out = Path(options.get("out_dir", "dist"))
    check_output_path(out, options.get("force", False))   # before the lock file goes beside it
    with output_lock(out), training_flags_kept(model), run_objects_only():
        session = open_session(model, recipe, data, **options)
        try:
            with removed_after(session.ctx.workdir):
                return finish(session, run_steps(session))
        finally:
            stop_sampling()


FORMAT_ERROR_CHARS = 300   # a failed format's error in report.json and on the console


def _export_all(session: Session, state: ModelState, staging: Path) -> dict[str, Path]:
    """Every format that can be produced; the ones that could not (format, one-line error,
    the converter's log kept under logs/ in --out) go to the run record. None produced: the
    first error."""
    artifacts, first_error = {}, None
    for fmt in session.ctx.formats:
        started = time.perf_counter()
        session.ctx.progress.info(f"export {fmt}")
        try:
            artifacts[fmt] = export_checked(session.backend, state, fmt,
                                            staging / f"model.{fmt}", session.ctx)
        except BackendUnavailableError as exc:
            first_error = first_error or exc
            kept = _kept_logs(exc, session.ctx.workdir, staging, session.out_dir)
            error = first_line(exc, FORMAT_ERROR_CHARS)
            session.record.add_failed_format({"format": fmt, "error": error, "logs": kept})
            session.ctx.progress.info(f"warning: {fmt} not produced: {error}")
        session.record.add_timing(f"export_{fmt}", time.perf_counter() - started)
    if not artifacts and first_error is not None:
        if (staging / "logs").is_dir():
            publish(staging, session.out_dir)   # --out holds the logs the error cites
        raise first_error
    return artifacts


def _kept_logs(exc: BaseException, workdir: Path, staging: Path, out: Path) -> str | None:
    """The run's converter logs, copied into the published folder (the work folder goes);
    `exc`'s message is rewritten to cite the copy in --out/logs/."""
    logs = Path(workdir) / "logs"
    if not logs.is_dir():
        return None
    shutil.copytree(logs, staging / "logs", dirs_exist_ok=True)
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (exc.args[0].replace(str(logs), str(Path(out) / "logs")), *exc.args[1:])
    return "logs/"


def _validate_all(session: Session, state: ModelState,
                  artifacts: dict[str, Path]) -> list[dict[str, Any]]:
    """Each artifact validated in a child process. One that crashes its runtime goes to the
    run record's failed formats (exit 5) and out of `artifacts` (its file is deleted: nothing
    unvalidated is published); the other formats are kept."""
    from compressor.runtimes.isolated import RuntimeCrashError
    from compressor.schemes import find_export

    rows = []
    started = time.perf_counter()
    ctx = session.ctx
    for fmt, path in list(artifacts.items()):
        ctx.progress.info(f"validate {path.name} in its runtime")
        try:
            row = session.task.evaluate(session, state, path)
        except RuntimeCrashError as exc:
            error = first_line(exc, FORMAT_ERROR_CHARS)
            session.record.add_failed_format({"format": fmt, "error": error, "logs": None})
            ctx.progress.info(f"warning: {fmt} not validated: {error}")
            artifacts.pop(fmt)
            path.unlink(missing_ok=True)
            continue
        if row["runtime_warning"]:
            ctx.progress.info(f"warning: {row['runtime_warning']}")
        # which scheme, and which tool with which ranges, made this file
        row["scheme"] = state.scheme.label
        row["made_by"] = find_export(state.scheme, session.backend.name, fmt).made_by
        rows.append(row)
    session.record.add_timing("validate", time.perf_counter() - started)
    return rows


def _judge(session: Session, rows: list[dict[str, Any]], state: ModelState) -> dict[str, Any]:
    """Apply the accuracy gate, the scheme's weight share and the device budget to each
    artifact (mutates rows' fits_target); formats not produced give exit 5 when all else
    passed."""
    failed = session.record.failed_formats
    validation = session.validation
    failures = [gate_failure(validation, row, session.metric_name) for row in rows
                if not gate_passes(validation, row["metric_value"], row["drop"])]
    failures += _weight_share_failures(state, rows)
    failures += [row["split"]["failure"] for row in rows   # --devices: split != unsplit
                 if (row.get("split") or {}).get("failure")]
    gate_passed = not failures
    budget = None
    if session.target:
        from compressor.devices import get_profile

        budget = session.task.budget_bytes(get_profile(session.target))
    for row in rows:
        row["fits_target"] = budget is None or row["est_peak_memory_bytes"] <= budget
        if not row["fits_target"]:
            failures.append(f"{row['path']} needs ~{row['est_peak_memory_bytes']:,} bytes, over "
                            f"the {session.target} budget of {budget:,} bytes")
    fits = all(row["fits_target"] for row in rows)
    exit_code = 0 if gate_passed and fits else (AccuracyGateError.exit_code if not gate_passed
                                                else DeviceBudgetError.exit_code)
    if failed:
        failures += [f"{f['format']} not produced: {f['error']}" for f in failed]
        exit_code = exit_code or FormatsIncompleteError.exit_code
    return {"gate_passed": gate_passed, "fits": fits,
            "budget_bytes": budget,
            "failures": failures, "exit_code": exit_code}


def _weight_share_failures(state: ModelState, rows: list[dict[str, Any]]) -> list[str]:
    """An integer scheme's artifacts must hold >= 90% of their weight bytes at the scheme's
    bit width (unless the quantize fallback kept layers float on purpose): a converter that
    left the weights float must not pass as int8 (or int4)."""
    scheme = state.scheme
    if not scheme.integer or state.float_layers:
        return []
    return [f"{row['path']} holds only {row['weight_share_at_bits']:.0%} {scheme.dtype} weight "
            f"bytes (< {MIN_WEIGHT_SHARE:.0%}); largest float tensors: "
            f"{', '.join(row['largest_float_weights'])}" for row in rows
            if row["weight_share_at_bits"] < MIN_WEIGHT_SHARE]
