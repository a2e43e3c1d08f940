"""`compress report OUT_DIR [--open]`: report.md and report.html again from report.json, so a
report can be re-rendered (a newer page, a lost file) without rerunning the compression."""
from __future__ import annotations

import json
from pathlib import Path

from compressor.cli.guard import Parser
from compressor.errors import DataError, UsageError

# keys every report.json of this version has; an older / foreign file lacking one is refused
REQUIRED = ("recipe", "seed", "baseline", "artifacts", "gate", "passed", "timings_s")


def report(argv: list[str]) -> int:
    parser = Parser(prog="compress report",
                    description="re-render report.md and report.html from OUT_DIR/report.json")
    parser.add_argument("out_dir", type=Path, help="a compress --out folder")
    parser.add_argument("--open", action="store_true", help="open report.html in a browser")
    args = parser.parse_args(argv)
    written = rerender(args.out_dir)
    print(f"wrote {written[0]} and {written[1]}")
    if args.open:
        import webbrowser

        webbrowser.open(written[1].resolve().as_uri())
    return 0


def rerender(folder: Path) -> tuple[Path, Path]:
    """(report.md, report.html) rewritten in `folder` from its report.json."""
    from compressor.report.html.report_page import render_html
    from compressor.report import render_markdown

    source = load_report(folder)
    try:
        markdown, page = render_markdown(source), render_html(source, folder)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:   # a field of another shape
        raise DataError(f"{folder / 'report.json'} does not have the shape this version writes "
                        f"({type(exc).__name__}: {exc}); rerun compress to make a new one") from None
    md, html = folder / "report.md", folder / "report.html"
    md.write_text(markdown)
    html.write_text(page)
    return md, html


def load_report(folder: Path) -> dict:
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder; give the --out folder of a compress run")
    path = folder / "report.json"
    if not path.is_file():
        raise UsageError(f"{folder} has no report.json; give the --out folder of a compress run")
    try:
        loaded = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is not valid JSON ({exc}); rerun compress to write it again") from None
    missing = [key for key in REQUIRED if not isinstance(loaded, dict) or key not in loaded]
    if missing:
        raise DataError(f"{path} is not a compress report (no {', '.join(missing)}); give the "
                        "--out folder of a compress run")
    return loaded
