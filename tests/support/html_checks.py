"""report.html / sweep.html checks shared by the tests that already make the runs.

`check_report_html(folder)` parses a run's report.html with html.parser and asserts that its
verdict, sections and table numbers (cells' data-value) are report.json's, and that nothing in
it points off the page; `check_sweep_html` does the same for sweep.html. The browser half is
support/browser.py.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

URL_MARKERS = ("http://", "https://", "//cdn", "src=\"//", "@import")


@dataclass
class Page:
    sections: list[str] = field(default_factory=list)         # section ids, in page order
    tables: dict[str, dict[str, list[tuple[str, str | None]]]] = field(default_factory=dict)
    headers: dict[str, list[str]] = field(default_factory=dict)
    row_classes: dict[str, dict[str, str]] = field(default_factory=dict)
    verdict: dict[str, str] = field(default_factory=dict)
    svgs: int = 0
    links: list[str] = field(default_factory=list)
    tags_with_src: list[str] = field(default_factory=list)

    def column(self, table: str, row: str, header: str) -> str | None:
        """The data-value of `row`'s cell under `header` (text where a cell has none)."""
        text, value = self.tables[table][row][self.headers[table].index(header)]
        return value if value is not None else text


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.page = Page()
        self._table = self._row = None
        self._cell: list[str] | None = None
        self._value: str | None = None
        self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag == "section" and attr.get("id"):
            self.page.sections.append(attr["id"])
        elif tag == "table":
            self._table = attr.get("data-table")
            self.page.tables[self._table] = {}
            self.page.headers[self._table] = []
        elif tag == "tr" and attr.get("data-row") is not None:
            self._row = attr["data-row"]
            self.page.tables[self._table][self._row] = []
            self.page.row_classes.setdefault(self._table, {})[self._row] = attr.get("class") or ""
        elif tag in ("td", "th"):
            self._cell, self._value, self._in_th = [], attr.get("data-value"), tag == "th"
        elif tag == "div" and attr.get("id") == "verdict":
            self.page.verdict = {k: v or "" for k, v in attr.items()}
        elif tag == "svg":
            self.page.svgs += 1
        if tag == "a":
            self.page.links.append(attr.get("href") or "")
        if "src" in attr or (tag == "link" and "href" in attr):
            self.page.tags_with_src.append(tag)

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            if self._in_th:
                self.page.headers[self._table].append(text)
            elif self._row is not None:
                self.page.tables[self._table][self._row].append((text, self._value))
            self._cell = None
        elif tag == "tr":
            self._row = None


def parse_page(path: Path) -> Page:
    text = Path(path).read_text()
    assert not [m for m in URL_MARKERS if m in text], f"{path} refers to something off the page"
    parser = _Parser()
    parser.feed(text)
    assert parser.page.tags_with_src == [], f"{path}: tags loading files: {parser.page.tags_with_src}"
    return parser.page


def expected_sections(report: dict[str, Any]) -> list[str]:
    """The section ids report.html must show for this report.json, in page order."""
    arts = report["artifacts"]
    llm = "perplexity" in report["baseline"]
    wanted = [("sizes", bool(arts)), ("metric", bool(arts) and not llm),
              ("latency", any(a.get("latency_ms_p50") is not None for a in arts)),
              ("llm", llm and bool(arts)), ("tensors", None),
              ("history", any(s.get("epochs") for s in report.get("history") or ())),
              ("fallback", bool(report.get("fallback"))),
              ("channels", bool(report.get("channel_pruning"))),
              ("plan", bool((report.get("plan") or {}).get("plans"))),
              ("notes", None), ("run", True)]
    return [key for key, present in wanted if present]


def check_report_html(folder: Path) -> Page:
    """report.html in `folder` shows report.json: verdict, sections, the numbers per artifact."""
    report = json.loads((Path(folder) / "report.json").read_text())
    page = parse_page(Path(folder) / "report.html")
    assert page.verdict["data-passed"] == str(report["passed"]).lower()
    assert page.verdict.get("data-exit-code") == (None if report.get("exit_code") is None
                                                  else str(report["exit_code"]))
    for failure in report.get("failures") or ():
        assert failure in Path(folder, "report.html").read_text().replace("&#x27;", "'") \
            .replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&"), failure
    shown = [s for s in page.sections if s in expected_sections(report)]
    assert shown == expected_sections(report), page.sections
    for art in report["artifacts"]:
        row = art["path"]
        for header, key in (("size", "size_bytes"), ("gzip", "gzip_bytes"),
                            ("sparsity", "sparsity")):
            assert float(page.column("artifacts", row, header)) == pytest.approx(art[key]), header
        assert page.column("artifacts", row, "fits target") == str(art["fits_target"]).lower()
        if "metric" in page.tables:
            assert float(page.column("metric", row, "drop vs baseline")) == pytest.approx(art["drop"])
        if art.get("latency_ms_p50") is not None:
            assert float(page.column("latency", row, "p50 ms")) == pytest.approx(art["latency_ms_p50"])
        if "llm" in page.tables:
            for header, key in (("perplexity", "perplexity"), ("increase", "perplexity_increase"),
                                ("greedy", "greedy_agreement"), ("KV cache", "kv_cache_bytes")):
                assert float(page.column("llm", row, header)) == pytest.approx(art[key]), header
    text = Path(folder, "report.html").read_text()
    for art in report["artifacts"]:   # the tensor chart of each artifact whose row lists them
        if art.get("largest_tensors"):
            assert "tensors" in page.sections and f'data-tensors="{art["path"]}"' in text
            biggest = art["largest_tensors"][0]
            assert f'{biggest["name"]}: {biggest["dtype"]} {biggest["shape"]}' in text, biggest
    for i, step in enumerate(s for s in report.get("history") or () if s.get("epochs")):
        for epoch in step["epochs"]:
            assert float(page.column(f"history-{i}", str(epoch["epoch"]), "loss")) == \
                pytest.approx(epoch["loss"])
    if report.get("fallback"):
        for ranked in report["fallback"]["ranking"]:
            layer = ranked["layer"]
            assert page.column("fallback", layer, "kept float") == \
                str(layer in report["fallback"]["float_layers"]).lower()
    if report.get("channel_pruning"):
        channels = report["channel_pruning"]
        for key in ("params", "macs"):
            assert int(page.column("channels", key, "before")) == channels["model_before"][key]
            assert int(page.column("channels", key, "after")) == channels["model_after"][key]
        for width in channels.get("widths") or ():
            for side in ("before", "after"):
                assert int(page.column("widths", width["layer"], f"channels {side}")) == \
                    width[side], width
    return page


def check_sweep_html(path: Path, frame: Any) -> Page:
    """sweep.html shows every row of the sweep's DataFrame, marks exactly the Pareto front's
    rows, and links each recipe that has a report to a report.html that exists."""
    from compressor.report.pareto import pareto_front

    page = parse_page(path)
    assert page.svgs >= 1 and "pareto" in page.sections and "runs" in page.sections
    rows = page.tables["sweep"]
    assert len(rows) == len(frame)
    front = pareto_front(frame.dropna(subset=["size_bytes", "metric_value"]), "size_bytes",
                         "metric_value")
    marked = {name for name, css in page.row_classes["sweep"].items() if css == "front"}
    assert marked == {f"{r['recipe']}:{r['format']}" for _, r in front.iterrows()}
    for _, row in frame[frame["error"].isna()].iterrows():
        name = f"{row['recipe']}:{row['format']}"
        assert float(page.column("sweep", name, "size")) == row["size_bytes"]
        assert float(page.column("sweep", name, "metric")) == pytest.approx(row["metric_value"])
    assert page.links and all((Path(path).parent / link).is_file() for link in page.links)
    return page
