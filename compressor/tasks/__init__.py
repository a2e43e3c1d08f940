"""Tasks: what a model is for, and so how its data is prepared, how artifacts are scored and
what the report shows."""
