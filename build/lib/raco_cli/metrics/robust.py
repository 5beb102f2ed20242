"""Robustness metrics of hard and soft predictions on a split: worst-group and per-class
accuracy, ROC AUC and F1 (the DP-DRO paper's evaluation, Section 5.1).

Definitions (checked against scikit-learn in ``tests/unit/metrics``):

* ``worst_group_accuracy``: min over the sensitive groups present of their accuracy;
* ``class_accuracy``: per class, the accuracy on its rows (its recall); ``worst_class_accuracy``
  the min and ``balanced_accuracy`` the mean over the classes present;
* ``roc_auc``: binary: AUC of the class-1 probability; multi-class: the unweighted mean of the
  one-vs-rest AUCs (scikit-learn's ``multi_class="ovr", average="macro"``); null when a class
  is missing from the split; absent when no probabilities are given (ERM runs: the rank
  statistic costs ~13 ms per evaluation of Adult's training split);
* ``f1``: binary: F1 of class 1; multi-class: macro F1 (scikit-learn's ``average="macro"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def rank_auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """``P(s_pos > s_neg) + P(s_pos = s_neg) / 2`` (Mann-Whitney U / (n_pos n_neg)), ties at mid-rank.

    >>> rank_auc(np.array([0.9, 0.8]), np.array([0.1, 0.8]))
    0.875
    """
    positive, negative = np.asarray(positive, dtype=np.float64), np.asarray(negative, dtype=np.float64)
    if len(positive) == 0 or len(negative) == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([positive, negative]), method="average")
    u = ranks[: len(positive)].sum() - len(positive) * (len(positive) + 1) / 2.0
    return float(u / (len(positive) * len(negative)))


def _f1(y: np.ndarray, pred: np.ndarray, k: int) -> float:
    tp = float(np.sum((pred == k) & (y == k)))
    denom = float(np.sum(pred == k) + np.sum(y == k))
    return 2.0 * tp / denom if denom > 0 else 0.0


def robust_metrics(
    y: np.ndarray, pred: np.ndarray, probs: np.ndarray | None, group: np.ndarray, *, group_names: Sequence[str],
    class_names: Sequence[str] | None = None, n_classes: int | None = None,
) -> dict[str, Any]:
    """The metrics of the module docstring for one split (``probs``: (n, K) class
    probabilities, or None to skip ROC AUC; ``n_classes`` then gives K)."""
    y, pred, group = np.asarray(y), np.asarray(pred), np.asarray(group)
    K = probs.shape[1] if probs is not None else int(n_classes or 2)
    names = list(class_names) if class_names is not None else [str(k) for k in range(K)]
    correct = pred == y
    group_acc = [float(correct[group == g].mean()) for g in range(len(group_names)) if np.any(group == g)]
    class_acc = {names[k]: (float(correct[y == k].mean()) if np.any(y == k) else None) for k in range(K)}
    present = [v for v in class_acc.values() if v is not None]
    f1 = _f1(y, pred, 1) if K == 2 else float(np.mean([_f1(y, pred, k) for k in range(K)]))
    out: dict[str, Any] = {
        "worst_group_accuracy": min(group_acc) if group_acc else None,
        "class_accuracy": class_acc,
        "worst_class_accuracy": min(present) if present else None,
        "balanced_accuracy": float(np.mean(present)) if present else None,
        "f1": f1,
    }
    if probs is not None:
        out["roc_auc"] = roc_auc(y, probs)
    return out


def roc_auc(y: np.ndarray, probs: np.ndarray) -> float | None:
    """``roc_auc`` of the module docstring from (n, K) class probabilities (rows with a
    non-finite probability left out); None when a class is missing from the split."""
    y = np.asarray(y)
    K = probs.shape[1]
    finite = np.isfinite(probs).all(axis=1)
    if K == 2:
        auc = rank_auc(probs[finite & (y == 1), 1], probs[finite & (y == 0), 1]) if np.all(np.isin([0, 1], y)) else float("nan")
    else:
        aucs = [rank_auc(probs[finite & (y == k), k], probs[finite & (y != k), k]) for k in range(K)]
        auc = float(np.mean(aucs)) if all(np.any(y == k) for k in range(K)) else float("nan")
    return auc if np.isfinite(auc) else None
