"""Evaluation metrics, cross-checked against fairlearn."""

from __future__ import annotations

import numpy as np
import pytest
from fairlearn.metrics import (
    demographic_parity_difference,
    equal_opportunity_difference,
    equalized_odds_difference,
)

from raco_cli.constraints import build
from raco_cli.metrics.evaluate import evaluate, fairness_metrics


@pytest.mark.parametrize("n_groups", [2, 3, 5])
def test_gaps_equal_fairlearn(n_groups):
    rng = np.random.default_rng(n_groups)
    n = 2000
    y = rng.integers(0, 2, n)
    group = rng.integers(0, n_groups, n)
    pred = (rng.random(n) < 0.3 + 0.1 * group).astype(int)
    ours = fairness_metrics(y, pred, group, n_classes=2, n_groups=n_groups)
    assert ours["dp_gap"] == pytest.approx(demographic_parity_difference(y, pred, sensitive_features=group))
    assert ours["eo_gap"] == pytest.approx(equalized_odds_difference(y, pred, sensitive_features=group))
    assert ours["eop_gap"] == pytest.approx(equal_opportunity_difference(y, pred, sensitive_features=group))
    assert ours["fnr"] == pytest.approx(((pred == 0) & (y == 1)).sum() / (y == 1).sum())
    assert ours["fpr"] == pytest.approx(((pred == 1) & (y == 0)).sum() / (y == 0).sum())


def test_rigged_evaluation(rigged):
    y, group, pred = rigged
    logits = np.stack([1.0 - pred, pred.astype(float)], axis=1) * 5
    cs = build("dp", n_classes=2, n_groups=2, gamma=0.4)
    m = evaluate(logits, y, group, constraints=cs, temperature=1.0, group_names=("a", "b"))
    assert m["dp_gap"] == pytest.approx(0.5)
    assert m["constraint_max_hard"] == pytest.approx(0.5)
    assert m["violation_hard"] == pytest.approx(0.1)
    assert m["satisfied"] is False
    assert m["accuracy"] == pytest.approx(np.mean(pred == y))
    assert m["group_accuracy"] == {"a": pytest.approx(0.75), "b": pytest.approx(0.75)}
    assert m["group_positive_rate"] == {"a": pytest.approx(0.75), "b": pytest.approx(0.25)}
    # two groups: the max DP constraint value equals the DP gap
    assert m["constraint_max_hard"] == pytest.approx(m["dp_gap"])


def test_empty_group_in_split_is_reported_not_fatal():
    y = np.array([0, 1, 0, 1])
    group = np.zeros(4, dtype=int)  # group 1 has no rows in this split
    logits = np.array([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0], [2.0, 0.0]])
    cs = build("dp", n_classes=2, n_groups=2, gamma=0.05)
    m = evaluate(logits, y, group, constraints=cs, temperature=1.0, group_names=("a", "b"))
    assert m["group_accuracy"]["b"] is None
    assert m["dp_gap"] == 0.0
    assert np.isfinite(m["constraint_max_hard"])


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_binary_evaluation_equals_the_definitions(temperature):
    """The binary fast path (margins, torch's softplus, class-0 mass as rows minus class-1
    mass) against the definitions computed independently here: mean cross-entropy
    ``-log softmax(z)_y`` (clipped at -log 1e-300, as for every task) and Gamma_post of the
    exact hard and soft histograms (paper eq. 8, ``ConstraintSet.histogram``), with extreme
    and infinite margins among the rows."""
    rng = np.random.default_rng(1)
    n, n_groups = 3000, 3
    y = rng.integers(0, 2, n)
    group = rng.integers(0, n_groups, n)
    z = rng.normal(0.0, 3.0, (n, 2))
    z[:5] = [[0.0, 800.0], [800.0, 0.0], [-1e4, 1e4], [0.0, np.inf], [np.inf, 0.0]]
    cs = build("eo", n_classes=2, n_groups=n_groups, gamma=0.05)
    m = evaluate(z, y, group, constraints=cs, temperature=temperature, group_names=("a", "b", "c"))

    d = z[:, 1] - z[:, 0]
    signed = -(2.0 * y - 1.0) * d
    nll = np.minimum(np.logaddexp(0.0, signed), -np.log(1e-300))  # -log p_y of two logits
    assert m["loss"] == pytest.approx(nll.mean(), rel=1e-13)
    cells = cs.cells(y, group)
    hard = np.stack([d <= 0, d > 0], axis=1).astype(float)
    with np.errstate(over="ignore"):
        p1 = 1.0 / (1.0 + np.exp(-temperature * d))
    soft = np.stack([1.0 - p1, p1], axis=1)
    for kind, probs in (("hard", hard), ("soft", soft)):
        want = cs.gamma_post(cs.histogram(probs, cells), floor=None)
        np.testing.assert_allclose(m[f"constraint_values_{kind}"], want, rtol=0, atol=1e-12)


def test_binary_rates_are_the_means_over_each_groups_rows():
    """A binary evaluation's rates come from one product of per-(group, label) counts
    (``_binary_rates``); each must be exactly the mean over its own rows: overall and per-group
    accuracy, positive rate, FNR, FPR and the TPR/FPR spreads.  Group 2 has only negatives (its
    TPR is undefined and left out of the spread), group 3 has no rows, and a NaN margin predicts
    class 0."""
    rng = np.random.default_rng(7)
    n = 1500
    y = rng.integers(0, 2, n)
    group = rng.integers(0, 3, n)
    y[group == 2] = 0
    z = rng.normal(0.0, 1.0, (n, 2)) + 0.3 * group[:, None] * np.array([0.0, 1.0])
    z[:3] = [[np.nan, 0.0], [np.inf, np.inf], [0.0, 0.0]]
    cs = build("eo", n_classes=2, n_groups=4, gamma=0.05)
    m = evaluate(z, y, group, constraints=cs, temperature=1.0, group_names=("a", "b", "c", "d"))

    with np.errstate(invalid="ignore"):
        pred = (z[:, 1] - z[:, 0] > 0).astype(int)
    assert m["accuracy"] == np.mean(pred == y)
    assert m["fnr"] == np.mean(pred[y == 1] == 0)
    assert m["fpr"] == np.mean(pred[y == 0] == 1)
    for g, name in enumerate("abc"):
        rows = group == g
        assert m["group_accuracy"][name] == np.mean(pred[rows] == y[rows])
        assert m["group_positive_rate"][name] == np.mean(pred[rows] == 1)
    assert m["group_accuracy"]["d"] is None and m["group_positive_rate"]["d"] is None
    tpr = [np.mean(pred[(group == g) & (y == 1)]) for g in (0, 1)]
    fpr = [np.mean(pred[(group == g) & (y == 0)]) for g in (0, 1, 2)]
    assert m["eop_gap"] == max(tpr) - min(tpr)
    assert m["eo_gap"] == max(max(tpr) - min(tpr), max(fpr) - min(fpr))
    positive = [np.mean(pred[group == g]) for g in (0, 1, 2)]
    assert m["dp_gap"] == max(positive) - min(positive)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_runs_evaluated_together_equal_each_run_alone(n_classes):
    """Batched evaluation (a sweep group) builds every run's metrics from (R, ...) arrays at
    once: each run's dict must be the one it gets alone, with its own gamma and temperature
    (a run read with another run's gamma or row would differ here)."""
    from raco_cli.metrics.evaluate import evaluate_many

    rng = np.random.default_rng(n_classes)
    n, R, G = 1200, 5, 3
    y = rng.integers(0, n_classes, n)
    group = rng.integers(0, G, n)
    z = rng.normal(0.0, 2.0, (R, n, n_classes)) + np.arange(R)[:, None, None] * 0.2 * (np.arange(n_classes) == 1)
    kinds = ("eo", "dp") if n_classes == 2 else ("dp",)
    for kind in kinds:
        cs = [build(kind, n_classes=n_classes, n_groups=G, gamma=0.01 + 0.03 * r) for r in range(R)]
        temps = [0.5 + r for r in range(R)]
        together = evaluate_many(z, y, group, constraints=cs, temperatures=temps, group_names=("a", "b", "c"))
        for r in range(R):
            alone = evaluate(z[r], y, group, constraints=cs[r], temperature=temps[r], group_names=("a", "b", "c"))
            assert _same(together[r], alone), (kind, r)


def _same(a, b) -> bool:
    """Nested dicts/lists equal, floats to 1e-12 (NaN equals NaN)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, v) for x, v in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (np.isnan(a) and np.isnan(b)) or abs(a - b) <= 1e-12 * max(1.0, abs(b))
    return a == b


@pytest.mark.parametrize("kind", ["eo", "dp", "fnr", "none"])
def test_a_splits_constants_built_once_give_the_same_metrics_bit_for_bit(kind):
    """A sweep group builds each split's :class:`SplitConstants` once for all its evaluations;
    its metrics must be exactly those of an evaluation that builds its own (including a group
    absent from the split, and no constraint)."""
    from raco_cli.metrics.evaluate import evaluate_binary_many, split_constants

    rng = np.random.default_rng(7)
    n, R, G = 900, 4, 3
    y = rng.integers(0, 2, n)
    group = rng.integers(0, G - 1, n)  # the last group has no rows here
    d = rng.normal(0.0, 2.0, (R, n))
    cs = [build(kind, n_classes=2, n_groups=G, gamma=0.02 * (r + 1)) for r in range(R)]
    kwargs = {"constraints": cs, "temperatures": [1.0 + r for r in range(R)], "group_names": ("a", "b", "c")}
    with_constants = evaluate_binary_many(d, y, group, split=split_constants(y, group, cs[0], G), **kwargs)
    own = evaluate_binary_many(d, y, group, **kwargs)
    assert repr(with_constants) == repr(own)


@pytest.mark.parametrize("K", [2, 3])
def test_accuracy_only_is_evaluates_accuracy(K):
    """What privacy.scope=model computes of validation (its n and accuracy) equals the full
    evaluation's, ties, huge and non-finite logits included (two classes: ties and NaN margins
    to class 0; more: the first arg-max)."""
    from raco_cli.metrics.evaluate import accuracy_only

    rng = np.random.default_rng(K)
    n = 4000
    y = rng.integers(0, K, n)
    group = rng.integers(0, 2, n)
    z = rng.integers(-2, 3, (n, K)).astype(float)  # small integers: many ties
    z[:6, :2] = [[np.nan, 0.0], [np.inf, np.inf], [0.0, np.inf], [-np.inf, 0.0], [1e300, -1e300], [5.0, 5.0]]
    cs = build("dp", n_classes=K, n_groups=2, gamma=0.05)
    full = evaluate(z, y, group, constraints=cs, temperature=1.0, group_names=("a", "b"))
    assert accuracy_only(z, y) == {"n": n, "accuracy": full["accuracy"]}
    assert accuracy_only(z[:0], y[:0])["n"] == 0


def test_one_prediction_rule_for_every_evaluation():
    """metrics.evaluate.predictions: two classes by the margin (ties, NaN and inf - inf to
    class 0), more by the first arg-max; the batched evaluator's scope=model validation count
    (GroupEvaluator) predicts through the same functions."""
    from raco_cli.metrics.evaluate import binary_predictions, predictions

    z2 = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [np.nan, 0.0], [0.0, np.nan], [np.inf, np.inf], [-np.inf, 0.0]])
    assert predictions(z2).tolist() == [1, 0, 0, 0, 0, 0, 1]
    with np.errstate(invalid="ignore"):  # (inf - inf)
        margin = z2[:, 1] - z2[:, 0]
    assert binary_predictions(margin).tolist() == [1, 0, 0, 0, 0, 0, 1]
    z3 = np.array([[1.0, 3.0, 3.0], [0.0, 0.0, 0.0], [-1.0, -2.0, 5.0]])
    assert predictions(z3).tolist() == [1, 0, 2]
    assert predictions(np.stack([z3, z3[::-1]])).tolist() == [[1, 0, 2], [2, 0, 1]]  # (R, n, K) of a group
