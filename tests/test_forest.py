"""The frames' forest walked in C (`trainprof/trace/_forest.c`) against the numpy code that walks it
where the module is not built: `nearest_marked` and `enclosing_parents` give the same arrays on
every fixture trace's threads and on random forests and ranges."""

from __future__ import annotations

import numpy as np
import pytest

from trainprof.trace import TraceLoadError, load_trace, model
from trainprof.trace.model import FRAME_CATEGORIES, NESTING_SLACK_US, enclosing_parents, nearest_marked


@pytest.fixture(autouse=True)
def _built():
    if model._forest is None:
        pytest.fail("trainprof.trace._forest is not built: `make test` builds it (pip install -e .)")


def _numpy(monkeypatch, function, *args):
    with monkeypatch.context() as patch:
        patch.setattr(model, "_forest", None)
        return function(*args)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_every_fixture_threads_frames_walk_alike(fixtures_dir, monkeypatch):
    threads = 0
    for path in sorted(fixtures_dir.glob("**/*.json*")):
        try:
            trace = load_trace(path)
        except TraceLoadError:  # sidecars and sync sites files: not traces
            continue
        for thread in range(len(trace.threads)):
            frames = trace.frames(thread)
            if not len(frames.ends):
                continue
            threads += 1
            assert _same(enclosing_parents(frames.ends), _numpy(monkeypatch, enclosing_parents, frames.ends))
            is_op = frames.category_codes == FRAME_CATEGORIES.index("cpu_op")
            is_python = frames.category_codes == FRAME_CATEGORIES.index("python_function")
            for marked in (is_op, is_python, is_op & (frames.parents >= 0), np.zeros_like(is_op)):
                ours = nearest_marked(frames.parents, marked)
                assert _same(ours, _numpy(monkeypatch, nearest_marked, frames.parents, marked)), path
    assert threads > 30


@pytest.mark.parametrize("seed", range(20))
def test_random_forests_in_any_order(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    order = rng.permutation(n)  # node order[k]'s parent is an earlier node in `order`, or a root
    parents = np.full(n, -1, dtype=np.int64)
    for k in range(1, n):
        if rng.random() < 0.9:
            parents[order[k]] = order[rng.integers(0, k)]
    parents[parents < 0] = rng.choice([-1, -7], size=int((parents < 0).sum()))  # any negative: a root
    for density in (0.0, 0.05, 0.5, 1.0):
        marked = rng.random(n) < density
        assert _same(nearest_marked(parents, marked), _numpy(monkeypatch, nearest_marked, parents, marked))


@pytest.mark.parametrize("seed", range(20))
def test_random_ranges_nested_overlapping_and_grouped(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 500))
    # Times on a coarse grid, so that ends tie and sit exactly NESTING_SLACK_US apart.
    starts = np.sort(rng.integers(0, 200, n) * NESTING_SLACK_US)
    ends = starts + rng.integers(0, 60, n) * NESTING_SLACK_US
    order = np.lexsort((starts - ends, starts))
    ends = ends[order].astype(np.float64)
    assert _same(enclosing_parents(ends), _numpy(monkeypatch, enclosing_parents, ends))
    groups = np.sort(rng.integers(0, 4, n))
    group_first = np.searchsorted(groups, groups)
    assert _same(
        enclosing_parents(ends, group_first), _numpy(monkeypatch, enclosing_parents, ends, group_first)
    )


def test_nan_ends_are_left_to_numpy(monkeypatch):
    ends = np.array([10.0, np.nan, 5.0, 4.0])
    assert model._forest.enclosing_parents(ends, NESTING_SLACK_US, np.empty(4, dtype=np.int64)) is False
    assert _same(enclosing_parents(ends), _numpy(monkeypatch, enclosing_parents, ends))


def test_parents_that_are_no_forest_raise():
    out = np.empty(3, dtype=np.int64)
    with pytest.raises(IndexError):
        model._forest.nearest_marked(np.array([1, 2, 0]), np.zeros(3, dtype=bool), out)  # a cycle
    with pytest.raises(IndexError):
        model._forest.nearest_marked(np.array([-1, 5, 0]), np.zeros(3, dtype=bool), out)  # out of range
    with pytest.raises(ValueError):
        model._forest.nearest_marked(np.array([-1, 0, 0], dtype=np.int32), np.zeros(3, dtype=bool), out)
