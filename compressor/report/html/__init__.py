"""report.html (report_page.py, report_sections.py, tensors.py) and sweep.html (sweep_page.py),
built from the primitives in compressor/render."""
