"""The run record: append-only, read by the report builder."""
from __future__ import annotations

from dataclasses import dataclass

from compressor.core.record import RunRecord


@dataclass(frozen=True)
class Section:
    key: str
    value: int

    def report(self, artifacts):
        return {"value": self.value, "formats": sorted(artifacts)}


def test_timings_keep_repeated_steps_apart_by_index():
    record = RunRecord()
    record.add_timing("load", 1.5)
    record.add_timing("prune", 2.0, index=0)
    record.add_timing("prune", 3.0, index=2)
    assert record.timings == {"load": 1.5, "prune": 2.0, "prune.2": 3.0}


def test_sections_latest_per_key_in_first_order_and_reads_are_copies():
    record = RunRecord()
    record.add_section(Section("fallback", 1))
    record.add_section(Section("quantize", 2))
    record.add_section(Section("fallback", 3))
    assert [(s.key, s.value) for s in record.sections] == [("fallback", 3), ("quantize", 2)]
    record.add_failed_format({"format": "tflite", "error": "x"})
    record.failed_formats[0]["error"] = "changed by a reader"
    assert record.failed_formats == [{"format": "tflite", "error": "x"}]
    record.add_note("user_loop", {"step": "prune"})
    record.add_history("h1")
    assert record.notes == {"user_loop": {"step": "prune"}} and record.histories == ("h1",)
