"""One append-only record of what a run measured and decided: step and export timings,
each training step's history, report sections (the fallback search, the int8 mode chosen,
channel pruning), the formats that could not be produced, and notes (user loop, sweep key).

Passes and backends only add to it; the report builder is its only reader. Inputs (recipe,
data, context settings) stay frozen, so nothing a Ray task or a DDP rank carries is changed
in place behind its back.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class ReportSection(Protocol):
    """Something a step found that report.json records under `key` (e.g. the int8 fallback
    search), completed with facts read back from the finished artifacts."""

    key: str

    def report(self, artifacts: Mapping[str, Path]) -> dict[str, Any]: ...


class RunRecord:
    def __init__(self) -> None:
        self._timings: list[tuple[str, float]] = []
        self._histories: list[Any] = []          # backends.fine_tuning.TrainingHistory
        self._sections: list[ReportSection] = []
        self._failed: list[dict[str, Any]] = []
        self._notes: list[tuple[str, Any]] = []
        self._entries: dict[str, dict[str, Any]] = {}

    def add_timing(self, name: str, seconds: float, index: int | None = None) -> None:
        """`name`'s seconds; a name already taken (a recipe's second prune step) is kept
        apart as `name.index`."""
        taken = {key for key, _ in self._timings}
        key = f"{name}.{index}" if name in taken and index is not None else name
        self._timings.append((key, seconds))

    def add_history(self, history: Any) -> None:
        self._histories.append(history)

    def add_section(self, section: ReportSection) -> None:
        """A report section; a later one with the same key supersedes it (a search's final
        answer after its candidates)."""
        self._sections.append(section)

    def add_failed_format(self, failure: dict[str, Any]) -> None:
        self._failed.append(dict(failure))

    def add_note(self, key: str, value: Any) -> None:
        self._notes.append((key, value))

    def add_note_entry(self, key: str, entry: str, value: Any) -> None:
        """One entry of a note several exports add to (`candidates`: each artifact's search):
        report.json lists the entries in order; a later one with the same `entry` (an export
        run again, e.g. by the quantize fallback) supersedes it."""
        self._entries.setdefault(key, {})[entry] = value

    # ------------------------------------------------------------------ the report's reads

    @property
    def timings(self) -> dict[str, float]:
        return dict(self._timings)

    @property
    def histories(self) -> tuple[Any, ...]:
        return tuple(self._histories)

    @property
    def sections(self) -> tuple[ReportSection, ...]:
        latest = {section.key: section for section in self._sections}
        return tuple(latest.values())

    @property
    def failed_formats(self) -> list[dict[str, Any]]:
        return [dict(failure) for failure in self._failed]

    @property
    def notes(self) -> dict[str, Any]:
        notes = dict(self._notes)
        for key, entries in self._entries.items():   # a plain note of the same key goes first
            notes[key] = ([notes[key]] if key in notes else []) + list(entries.values())
        return notes
