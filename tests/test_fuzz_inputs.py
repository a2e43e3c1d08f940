"""Fuzzing the two loaders that read user files: whatever the bytes, only a CompressorError
comes out (bounded: a few hundred examples, well under 30 s). Also: an alias bomb costs
less than 5 s and 500 MB."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compressor.tasks.array.data import load_data
from compressor.errors import CompressorError
from compressor.config.recipe import load_recipe

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(),
                    st.text(max_size=20))
RECIPE_KEYS = st.sampled_from(["name", "steps", "export", "validate", "target", "extends",
                               "pass", "sparsity", "epochs", "mode", "dtype", "max_drop",
                               "metric", "description", "x"])
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(RECIPE_KEYS, SCALARS), inner, max_size=4)),
    max_leaves=20)
STEP = st.fixed_dictionaries({"pass": st.sampled_from(["prune", "quantize", "distill", "precision",
                                                       "nope"])},
                             optional={"sparsity": SCALARS, "epochs": SCALARS, "mode": SCALARS,
                                       "dtype": SCALARS})


def _loads_or_compressor_error(path):
    try:
        load_recipe(path)
    except CompressorError:
        pass


@FUZZ
@given(text=st.one_of(st.text(max_size=300), st.binary(max_size=300).map(
    lambda b: b.decode("latin-1"))))
def test_recipe_text(tmp_path, text):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    _loads_or_compressor_error(path)


@FUZZ
@given(raw=st.one_of(VALUES, st.fixed_dictionaries(
    {"name": SCALARS, "steps": st.lists(STEP, max_size=3)},
    optional={"validate": VALUES, "export": VALUES, "target": SCALARS, "extends": SCALARS})))
def test_recipe_structure(tmp_path, raw):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(raw))
    _loads_or_compressor_error(path)


ARRAYS = st.one_of(
    st.none(),
    st.lists(st.floats(width=32), max_size=6).map(lambda v: np.asarray(v, np.float32)),
    st.integers(0, 3).flatmap(lambda n: st.sampled_from(
        [np.zeros((n, 8, 8, 1), np.float32), np.full((n, 2), np.nan), np.arange(n),
         np.array(["a"] * n), np.zeros((n, 0)), np.array(n), np.zeros(n, np.complex64)])),
    st.lists(st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2)),
             max_size=4))


@FUZZ
@given(arrays=st.dictionaries(st.sampled_from(["x_train", "y_train", "x_val", "y_val", "other"]),
                              ARRAYS, max_size=5))
def test_data_arrays(arrays):
    try:
        load_data(arrays)
    except CompressorError:
        pass


@FUZZ
@given(blob=st.binary(max_size=400), arrays=st.dictionaries(
    st.sampled_from(["x_train", "y_train", "x_val", "y_val"]), ARRAYS.filter(
        lambda a: isinstance(a, np.ndarray) and a.dtype.kind != "O"), max_size=4),
    cut=st.integers(0, 2000))
def test_data_npz(tmp_path, blob, arrays, cut):
    path = tmp_path / "fuzz.npz"
    if arrays:
        np.savez(path, **arrays)
        path.write_bytes(path.read_bytes()[:cut] if cut < 1000 else path.read_bytes())
    else:
        path.write_bytes(blob)
    try:
        load_data(str(path))
    except CompressorError:
        pass


def test_alias_bomb_is_cheap(tmp_path):
    """Exit 2 in under 5 s and 500 MB peak RSS (the child's, measured by a wrapper)."""
    levels = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    (tmp_path / "bomb.yaml").write_text("\n".join(levels) + "\nname: *a9\nsteps: *a9\n")
    wrapper = textwrap.dedent("""
        import resource, subprocess, sys, time
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "compressor.cli", "recipes", "show",
                               "bomb.yaml"], capture_output=True, text=True)
        print(done.returncode, time.monotonic() - started,
              resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        print(done.stderr, file=sys.stderr)
    """)
    done = subprocess.run([sys.executable, "-c", wrapper], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=True)
    code, seconds, rss_kib = done.stdout.split()
    assert int(code) == 2, done.stderr
    assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()[0]) <= 500
    assert float(seconds) < 5 and int(rss_kib) < 500 * 1024, done.stdout
