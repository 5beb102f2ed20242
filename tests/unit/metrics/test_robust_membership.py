"""Robustness metrics and membership inference against scikit-learn's definitions."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

from raco_cli.constraints import build as build_constraints
from raco_cli.metrics.evaluate import evaluate, softmax
from raco_cli.metrics.membership import membership_inference
from raco_cli.metrics.robust import rank_auc, robust_metrics


@pytest.mark.parametrize("K", [2, 4])
def test_robust_metrics_match_sklearn(K):
    rng = np.random.default_rng(K)
    n = 300
    y = rng.integers(0, K, n)
    logits = rng.normal(size=(n, K)) + 1.5 * np.eye(K)[y]
    logits[:7] = np.round(logits[:7])  # ties
    group = rng.integers(0, 3, n)
    probs = softmax(logits)
    pred = logits.argmax(1)
    m = robust_metrics(y, pred, probs, group, group_names=("a", "b", "c"))
    if K == 2:
        assert m["roc_auc"] == pytest.approx(roc_auc_score(y, probs[:, 1]))
        assert m["f1"] == pytest.approx(f1_score(y, pred))
    else:
        assert m["roc_auc"] == pytest.approx(roc_auc_score(y, probs, multi_class="ovr", average="macro"))
        assert m["f1"] == pytest.approx(f1_score(y, pred, average="macro"))
    assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, pred))
    accs = [float((pred[group == g] == y[group == g]).mean()) for g in range(3)]
    assert m["worst_group_accuracy"] == pytest.approx(min(accs))
    assert m["worst_class_accuracy"] == pytest.approx(min(float((pred[y == k] == k).mean()) for k in range(K)))


def test_rank_auc_ties_and_empty():
    assert rank_auc(np.array([1.0, 1.0]), np.array([1.0])) == 0.5
    assert np.isnan(rank_auc(np.array([]), np.array([1.0])))


def test_missing_class_gives_null_auc_and_evaluate_carries_the_metrics():
    y = np.array([0, 0, 0])
    logits = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    cons = build_constraints("dp", n_classes=2, n_groups=2, gamma=0.1)
    out = evaluate(logits, y, np.array([0, 1, 1]), constraints=cons, temperature=1.0, group_names=("g0", "g1"),
                   class_names=("neg", "pos"), robust=True)
    assert out["roc_auc"] is None and out["class_accuracy"] == {"neg": 2 / 3, "pos": None}
    assert out["worst_group_accuracy"] == 0.5 and out["worst_class_accuracy"] == 2 / 3


@pytest.mark.parametrize("K", [2, 3])
def test_roc_auc_only_when_robust(K):
    """ERM evaluations skip the robustness metrics (their cost and their MLflow rows at every
    evaluation of a sweep); the DRO runs' (robust=True) ROC AUC matches scikit-learn on the
    binary-margin and the softmax path."""
    rng = np.random.default_rng(1)
    y, group = rng.integers(0, K, 200), rng.integers(0, 2, 200)
    logits = rng.normal(size=(200, K)) + np.eye(K)[y]
    cons = build_constraints("dp", n_classes=K, n_groups=2, gamma=0.1)
    kw = dict(constraints=cons, temperature=1.0, group_names=("g0", "g1"))
    plain, robust = evaluate(logits, y, group, **kw), evaluate(logits, y, group, robust=True, **kw)
    assert not {"roc_auc", "worst_group_accuracy", "class_accuracy", "f1"} & set(plain)  # ERM runs: none of them
    assert robust["worst_group_accuracy"] == min(plain["group_accuracy"].values())
    probs = softmax(logits)
    want = roc_auc_score(y, probs[:, 1]) if K == 2 else roc_auc_score(y, probs, multi_class="ovr", average="macro")
    assert robust["roc_auc"] == pytest.approx(want)


def test_membership_attacks_on_a_memorising_and_a_blind_model():
    rng = np.random.default_rng(0)
    y_in, y_out = rng.integers(0, 2, 500), rng.integers(0, 2, 800)
    z_in = 4.0 * (2 * np.eye(2)[y_in] - 1)  # confident and right on members
    z_out = rng.normal(size=(800, 2))
    hit = membership_inference(z_in, y_in, z_out, y_out)
    assert hit["auc_loss"] > 0.95 and hit["auc_confidence"] > 0.95 and hit["n_members"] == hit["n_nonmembers"] > 400
    blind = membership_inference(rng.normal(size=(500, 2)), y_in, rng.normal(size=(800, 2)), y_out)
    assert abs(blind["auc_loss"] - 0.5) < 0.06 and abs(blind["auc_confidence"] - 0.5) < 0.06
    # the loss attack is the AUC of -loss: sklearn on the same label-matched subsample
    rng = np.random.default_rng(0)
    keep_in, keep_out = [], []
    for label in (0, 1):
        a, b = np.flatnonzero(y_in == label), np.flatnonzero(y_out == label)
        m = min(len(a), len(b))
        keep_in.append(rng.choice(a, m, replace=False))
        keep_out.append(rng.choice(b, m, replace=False))
    i_in, i_out = np.sort(np.concatenate(keep_in)), np.sort(np.concatenate(keep_out))
    lp = lambda z, yy: (z - np.log(np.exp(z).sum(1, keepdims=True)))[np.arange(len(yy)), yy]  # noqa: E731
    scores = np.concatenate([lp(z_in[i_in], y_in[i_in]), lp(z_out[i_out], y_out[i_out])])
    labels = np.r_[np.ones(len(i_in)), np.zeros(len(i_out))]
    assert hit["auc_loss"] == pytest.approx(roc_auc_score(labels, scores))


def test_label_shift_alone_is_not_membership():
    """Members 90 % label 0, non-members balanced, a model that only knows the label prior:
    matching label counts keeps the AUC at 1/2."""
    rng = np.random.default_rng(1)
    y_in = (rng.random(2000) < 0.1).astype(int)
    y_out = (rng.random(2000) < 0.5).astype(int)
    z = lambda n: np.tile([2.0, 0.0], (n, 1))  # noqa: E731  always "label 0"
    res = membership_inference(z(2000), y_in, z(2000), y_out)
    assert res["auc_loss"] == pytest.approx(0.5) and res["auc_confidence"] == pytest.approx(0.5)


@pytest.mark.parametrize("K", [2, 3])
def test_batched_evaluation_gives_robust_metrics_exactly(K):
    """The R-run evaluation (exact class counts) equals robust_metrics run by run, with an empty
    group and a class absent from the split."""
    from raco_cli.metrics.evaluate import evaluate_many

    rng = np.random.default_rng(K)
    n, R = 500, 4
    y = rng.integers(0, K - 1, n) if K == 3 else rng.integers(0, K, n)  # K=3: class 2 absent
    group = rng.integers(1, 3, n)  # group 0 of 3 empty (first: a NaN there would win min())
    logits = rng.normal(size=(R, n, K)) + np.eye(K)[y]
    names = ("g0", "g1", "g2")
    cons = [build_constraints("dp", n_classes=K, n_groups=3, gamma=0.1)] * R
    out = evaluate_many(logits, y, group, constraints=cons, temperatures=[1.0] * R, group_names=names, robust=True)
    for r in range(R):
        want = robust_metrics(y, logits[r].argmax(1), softmax(logits[r]), group, group_names=names)
        got = {k: out[r][k] for k in want}
        assert got == want
