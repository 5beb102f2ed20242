"""task=regression metrics: per-group mean squared prediction error against a direct computation."""

from __future__ import annotations

import numpy as np
import pytest

from raco_cli.metrics.evaluate import evaluate_regression


def test_group_mspe_equals_the_direct_mean_per_group():
    rng = np.random.default_rng(0)
    n = 500
    group = rng.integers(0, 3, n)
    target = rng.normal(size=n) * (1 + group)
    pred = target + rng.normal(size=n) * (0.5 + group)
    m = evaluate_regression(pred[:, None], target, group, group_names=("a", "b", "c"))
    direct = {name: float(np.mean((pred[group == k] - target[group == k]) ** 2)) for k, name in enumerate("abc")}
    assert m["group_mspe"] == pytest.approx(direct, rel=1e-12)
    assert m["mspe"] == pytest.approx(float(np.mean((pred - target) ** 2))) and m["loss"] == m["mspe"]
    assert m["worst_group_mspe"] == pytest.approx(max(direct.values()))
    assert m["mspe_gap"] == pytest.approx(max(direct.values()) - min(direct.values()))
    assert m["n"] == n and m["satisfied"] is True


def test_a_group_without_rows_is_null_and_left_out():
    m = evaluate_regression(np.array([1.0, 3.0]), np.array([0.0, 0.0]), np.array([0, 0]), group_names=("a", "b"))
    assert m["group_mspe"] == {"a": 5.0, "b": None}
    assert m["worst_group_mspe"] == 5.0 and m["mspe_gap"] == 0.0
