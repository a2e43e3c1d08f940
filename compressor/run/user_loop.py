"""Compression inside your own training loop: `prepare`, train, `finalize`.

    run = cz.prepare(model, "int8_prune30", data=cz.Data(train=(x, y), val=(xv, yv)))
    # Keras: compile run.model yourself, then
    run.model.fit(x, y, epochs=2, callbacks=run.callbacks)
    # PyTorch: optimizer over run.model.parameters(); per batch
    #   loss = run.loss(run.model(xb), yb, inputs=xb); loss.backward(); opt.step(); run.step()
    result = run.finalize(out_dir="dist")   # strip, later steps, export, validate, report

`prepare` applies the recipe's steps before its first training step (prune, qat quantize or
distill) and hands that step to your loop. The steps after it run at `finalize` with the
backend's own loop for the recipe's epochs (int8_prune30: your loop prunes, finalize runs
the prune-preserving QAT). A recipe without a training step (int8 ptq, fp16) hands over a
trainable copy, and finalize applies all its steps to what you trained.
"""
from __future__ import annotations

import dataclasses
import math
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

from compressor.backends import UserLoopBackend, backend_for
from compressor.core.context import ModelState
from compressor.tasks.array.data import load_data
from compressor.errors import UsageError
from compressor.run.pipeline import Result, finish, run_steps
from compressor.config.recipe import Recipe
from compressor.run.session import Session, check_output_folder, open_session
from compressor.config.order import check_user_loop_step
from compressor.config.steps import QuantizeConfig, StepConfig

# open_session checks an output folder, but a run's folder is only named at finalize (and
# checked there): None tells open_session there is none yet.
UNNAMED_OUTPUT = None


def prepare(model: Any, recipe: str | Path | Recipe, data: Any = "digits", *,
            steps: int | None = None, **options: Any) -> TrainingRun:
    """Set up `recipe` around your own training loop; see this module's docstring.

    `data` (arrays, `cz.Data`, tf.data Datasets or torch DataLoaders) gives the validation
    split, calibration and the training data of the steps that run at finalize; the pruning
    schedule spans the recipe's epochs over it, or `steps` optimizer steps of your loop.
    `options` are compress's (teacher, target, formats, seed, quiet, ...) except out_dir and
    force, which go to `finalize`.
    """
    for key in ("out_dir", "force"):
        if key in options:
            raise UsageError(f"{key} is chosen when the run ends: run.finalize({key}=...)")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise UsageError(f"steps={steps!r}: give the number of optimizer steps your loop will "
                         "run (a positive int), or leave it out to use the recipe's epochs")
    backend = backend_for(model)
    if not isinstance(backend, UserLoopBackend):
        raise UsageError(f"{backend.name} models cannot be trained in your own loop; use "
                         "cz.compress for this model")
    # Datasets are read into arrays once, here, and a wrong framework's data is refused.
    data = load_data(data, backend.image_layout, backend.name)
    session = open_session(model, recipe, data, out_dir=UNNAMED_OUTPUT, force=True, **options)
    try:
        return TrainingRun(session, steps)
    except BaseException:
        shutil.rmtree(session.ctx.workdir, ignore_errors=True)
        raise


class TrainingRun:
    """A recipe applied around your training loop. Made by `prepare`; ends with `finalize`."""

    def __init__(self, session: Session, steps: int | None = None):
        self._session = session
        indexed = list(enumerate(session.recipe.steps))
        first = next((i for i, (_, step) in enumerate(indexed) if step.trains), None)
        before, handed = (indexed, None) if first is None else (indexed[:first], indexed[first])
        self._after = [] if first is None else indexed[first + 1:]
        self._handed_index = None if handed is None else handed[0]
        step = None if handed is None else handed[1]
        state = run_steps(session, steps=before)
        check_user_loop_step(state.steps, step)
        per_epoch = None
        if steps is not None and step is not None:
            per_epoch = math.ceil(steps / max(1, step.epochs))   # the schedule spans `steps`
        self._training = session.backend.start_user_training(state, step, session.ctx,
                                                              per_epoch)
        self._started = time.perf_counter()
        self._steps_taken = 0
        self._finalized = False
        # The work folder goes when the run is finalized, or garbage-collected unfinished.
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(session.ctx.workdir), True)

    @property
    def model(self) -> Any:
        """The model your loop trains: pruning wrappers / masks or fake-quant in place."""
        return self._training.model

    @property
    def callbacks(self) -> list[Any]:
        """Keras: pass to `run.model.fit(..., callbacks=run.callbacks)`. PyTorch: empty."""
        return list(self._training.callbacks)

    @property
    def loop_step(self) -> StepConfig | None:
        """The recipe step your loop drives (None: plain fine-tuning, finalize does the rest)."""
        return self._training.step

    @property
    def steps_taken(self) -> int:
        """How many times `step()` was called."""
        return self._steps_taken

    def loss(self, outputs: Any, target: Any, inputs: Any = None) -> Any:
        """PyTorch: the step's loss for a batch (cross-entropy with labels, plus the teacher's
        term while distilling, which needs `inputs`). Keras: compile run.model instead."""
        self._check_open("loss")
        if self._training.loss is None:
            raise UsageError(f"run.loss is for PyTorch loops; with a {self._session.backend.name} "
                             "model, compile run.model with your loss and pass "
                             "callbacks=run.callbacks to fit")
        return self._training.loss(outputs, target, inputs=inputs)

    def step(self) -> None:
        """Call after each optimizer step: advances the pruning schedule and re-applies masks.
        Keras wrappers count their own steps, so there it only counts."""
        self._check_open("step")
        self._steps_taken += 1
        if self._training.after_step is not None:
            self._training.after_step(self._steps_taken)

    def finalize(self, out_dir: str | Path = "dist", *, force: bool = False) -> Result:
        """Strip the wrappers, run the recipe's remaining steps, export, validate, report and
        publish into `out_dir` (refused when it is not empty, unless `force`)."""
        self._check_open("finalize")
        out = Path(out_dir)
        check_output_folder(out, force)
        self._finalized = True
        session = dataclasses.replace(self._session, out_dir=out, force=force)
        try:
            state = self._trained_state(session)
            state = run_steps(session, state, steps=self._after)
        except BaseException:
            self._cleanup()
            raise
        return finish(session, state)   # removes the work folder

    def close(self) -> None:
        """Abandon the run without artifacts and remove its work folder."""
        self._finalized = True
        self._cleanup()

    def _trained_state(self, session: Session) -> ModelState:
        step = self._training.step
        state = session.backend.end_user_training(self._training, session.ctx)
        if isinstance(step, QuantizeConfig):
            # the user's loop did the apply handler's work (QAT): only the scheme is set
            state = state.replace(scheme=step.scheme)
        if step is not None:
            state = state.after(step)
        session.record.add_timing("user_loop" if step is None else step.kind,
                                  time.perf_counter() - self._started, self._handed_index)
        session.record.add_note("user_loop", {"step": None if step is None else step.kind,
                                              "steps_counted": self._steps_taken})
        return state

    def _check_open(self, call: str) -> None:
        if self._finalized:
            raise UsageError(f"run.{call}() after run.finalize(): this run is over; call "
                             "cz.prepare(...) again for another one")

    def __repr__(self) -> str:
        step = self._training.step
        state = "finalized" if self._finalized else f"{self._steps_taken} steps"
        return (f"<TrainingRun {self._session.recipe.name}: your loop drives "
                f"{step.kind if step is not None else 'plain fine-tuning'} ({state})>")
