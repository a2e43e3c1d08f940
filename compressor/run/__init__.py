"""A run from start to end: open a session (session.py), apply the recipe and finish it
(pipeline.py), inside a user's training loop (user_loop.py), many recipes as a sweep
(sweep.py, sweep_ray.py), on several local workers (workers.py)."""
