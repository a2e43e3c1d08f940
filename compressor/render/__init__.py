"""Pieces every rendering shares, with no knowledge of runs: HTML primitives (html.py: page,
section, table, cell), inline-SVG charts (charts.py) and sizes as people read them (sizes.py).
Reports and tasks compose their pages from these."""
