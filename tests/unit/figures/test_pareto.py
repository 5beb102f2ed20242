"""Pareto fronts and seed statistics against brute force and scipy (property tests)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raco_cli.figures.pareto import dominates, mean_ci, pareto_front, t95

# few distinct values so that ties (same x, same y, duplicates) are common
coords = st.lists(st.tuples(st.sampled_from([0.0, 0.01, 0.02, 0.05, 0.1, math.nan]),
                            st.sampled_from([0.7, 0.8, 0.81, 0.85, math.nan])), max_size=25)


def brute_front(points, **kw):
    ok = [i for i, p in enumerate(points) if not any(math.isnan(v) for v in p)]
    return {i for i in ok if not any(dominates(points[j], points[i], **kw) for j in ok if j != i)}


@settings(max_examples=300, deadline=None)
@given(coords, st.booleans(), st.booleans())
def test_front_equals_brute_force(points, minimize_x, maximize_y):
    kw = {"minimize_x": minimize_x, "maximize_y": maximize_y}
    front = pareto_front([p[0] for p in points], [p[1] for p in points], **kw)
    assert len(front) == len(set(front))
    assert set(front) == brute_front(points, **kw)


@settings(max_examples=200, deadline=None)
@given(coords, st.randoms(use_true_random=False))
def test_front_does_not_depend_on_input_order(points, rnd):
    order = list(range(len(points)))
    rnd.shuffle(order)
    shuffled = [points[i] for i in order]
    front = pareto_front([p[0] for p in points], [p[1] for p in points])
    front_shuffled = pareto_front([p[0] for p in shuffled], [p[1] for p in shuffled])
    assert {order[i] for i in front_shuffled} == set(front)


@settings(max_examples=200, deadline=None)
@given(coords)
def test_every_point_off_the_front_is_dominated_by_a_front_point(points):
    front = pareto_front([p[0] for p in points], [p[1] for p in points])
    for i, p in enumerate(points):
        if i in front or any(math.isnan(v) for v in p):
            continue
        assert any(dominates(points[j], p) for j in front)


def test_front_is_sorted_by_x_best_first():
    xs, ys = [0.1, 0.0, 0.05, 0.2], [0.9, 0.5, 0.7, 0.95]
    assert pareto_front(xs, ys) == [1, 2, 0, 3]
    with pytest.raises(ValueError, match="differ in length"):
        pareto_front([0.1], [])


@pytest.mark.parametrize("n", [2, 3, 5, 10, 20, 30])
def test_mean_ci_matches_scipy_t_interval(n):
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(n)
    values = [rng.gauss(0.83, 0.01) for _ in range(n)]
    m = mean_ci(values)
    lo, hi = stats.t.interval(0.95, n - 1, loc=stats.tmean(values), scale=stats.sem(values))
    assert m.mean == pytest.approx((lo + hi) / 2, abs=1e-12)
    assert m.ci == pytest.approx((hi - lo) / 2, rel=1e-3)  # t quantiles tabulated to 3 decimals
    assert m.n == n


def test_t95_beyond_the_table_is_conservative():
    stats = pytest.importorskip("scipy.stats")
    for dof in (*range(1, 200), 500, 10_000):
        assert t95(dof) >= stats.t.ppf(0.975, dof) - 5e-4


def test_mean_ci_edge_cases():
    assert mean_ci([0.5]).ci == 0.0 and mean_ci([0.5]).mean == 0.5
    assert math.isnan(mean_ci([]).mean) and mean_ci([math.nan, None]).n == 0
    assert mean_ci([1.0, math.inf, 3.0]).n == 2


def _record(method: str, eps: str | None, gamma: float, seed: int, x: float, y: float) -> dict:
    private = eps is not None
    params = {"method.name": method, "constraint.gamma": str(gamma), "seed": str(seed), **({"eps": eps} if private else {})}
    return {"status": "FINISHED", "params": params, "tags": {"method": method, "private": str(private).lower()},
            "metrics": {"final/test/accuracy": y, "final/test/dp_gap": x}}


@settings(max_examples=50, deadline=None)
@given(st.randoms(use_true_random=False))
def test_curves_do_not_follow_the_order_of_the_runs(rnd):
    """A figure's curves (their line styles and legend) and a report's rows come in one order
    whatever order the store lists the runs in (seen: two `make reproduce` with the legend of
    fig5_adult swapped)."""
    from raco_cli.figures.aggregate import aggregate, curves, run_points

    records = [_record(m, e, g, s, 0.01 * s + g, 0.8 + g) for m, eps in (("raco_dp", ("9", "1", "0.5")), ("sgda", (None,)))
               for e in eps for g in (0.05, 0.1) for s in range(2)]
    shuffled = list(records)
    rnd.shuffle(shuffled)
    keys = [list(curves(aggregate(run_points(r, x_metric="dp_gap")))) for r in (records, shuffled)]
    assert keys[0] == keys[1]
    assert keys[0] == [("raco_dp", (0.5,)), ("raco_dp", (1.0,)), ("raco_dp", (9.0,)), ("sgda", (None,))]


@settings(max_examples=50, deadline=None)
@given(st.randoms(use_true_random=False))
def test_points_and_their_means_do_not_follow_the_order_of_the_runs(rnd):
    """Every point, and every mean summed from the seeds, is the same bits whatever order the
    store lists the runs in (seen: fig3's overlapping markers and fig5_adult's anti-aliased
    curves differed by a few hundred pixels between two `make reproduce` with equal tables)."""
    from raco_cli.figures.aggregate import aggregate, run_points

    records = [_record(m, e, g, s, 0.1 / (3 + s) + g / 7, 0.8 + g / (1 + s)) for m, eps in (("raco_dp", ("9", "1")), ("sgda", (None,)))
               for e in eps for g in (0.05, 0.1, 0.3) for s in range(5)]
    shuffled = list(records)
    rnd.shuffle(shuffled)
    pts = [run_points(r, x_metric="dp_gap") for r in (records, shuffled)]
    assert [(p.method, p.series, p.knob_value, p.seed) for p in pts[0]] == [(p.method, p.series, p.knob_value, p.seed) for p in pts[1]]
    means = [[(a.x.mean, a.y.mean, a.x.ci, a.y.ci) for a in aggregate(p)] for p in pts]
    assert means[0] == means[1]
