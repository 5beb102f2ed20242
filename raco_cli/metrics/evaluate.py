"""Non-private evaluation of predictions on a whole split (paper Section 6, App. E.2).

Constraint values come from the same :class:`ConstraintSet` the training uses
(``Gamma_post`` on the exact histogram of the split), so what is optimised and what is
reported cannot drift apart.  Standard fairness metrics follow fairlearn's definitions
(``demographic_parity_difference``, ``equalized_odds_difference``, ...), with the positive
class being label 1 for binary tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raco_cli.constraints.rate import ConstraintSet

#: the standard (fairlearn-defined, binary) metric reported with each constraint family
STANDARD_METRICS: dict[str, tuple[str, ...]] = {
    "dp": ("dp_gap",),
    "eo": ("eo_gap",),
    "eop": ("eop_gap",),
    "fnr": ("fnr",),
    "fpr": ("fpr",),
    "custom": (),
}


def softmax(z: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise ``softmax(temperature * z)``, shape preserved.

    Rows with non-finite logits (an input row with NaN/inf features) give NaN
    probabilities, reported as such (null in summary.json), without warnings.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        s = temperature * np.asarray(z, dtype=np.float64)
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)


def _group_rate(mask_event: np.ndarray, mask_cond: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """``P(event | cond, group=g)`` per group, NaN for groups without conditioning rows."""
    out = np.full(n_groups, np.nan)
    for g in range(n_groups):
        sel = mask_cond & (group == g)
        if sel.any():
            out[g] = mask_event[sel].mean()
    return out


def _spread(rates: np.ndarray) -> float:
    """max - min over the finite entries (0 with fewer than two)."""
    finite = rates[np.isfinite(rates)]
    return float(finite.max() - finite.min()) if len(finite) >= 2 else 0.0


def fairness_metrics(y: np.ndarray, pred: np.ndarray, group: np.ndarray, *, n_classes: int, n_groups: int) -> dict[str, float]:
    """Standard group-fairness metrics of hard predictions.

    * ``dp_gap``: max over predicted classes k of (max_g - min_g) P(pred=k | g); for binary
      tasks this is fairlearn's ``demographic_parity_difference``.
    * ``eo_gap``: max(TPR spread, FPR spread) over groups (fairlearn's
      ``equalized_odds_difference``); ``eop_gap``: the TPR spread (equal opportunity).
    * ``fnr`` / ``fpr``: overall false-negative / false-positive rates, positive class 1.
    """
    everyone = np.ones_like(y, dtype=bool)
    if n_classes == 2:
        dp = _spread(_group_rate(pred == 1, everyone, group, n_groups))
    else:
        dp = max(_spread(_group_rate(pred == k, everyone, group, n_groups)) for k in range(n_classes))
    out = {"dp_gap": dp}
    if n_classes == 2:
        pos, neg = y == 1, y == 0
        tpr = _group_rate(pred == 1, pos, group, n_groups)
        fpr_g = _group_rate(pred == 1, neg, group, n_groups)
        out["eop_gap"] = _spread(tpr)
        out["eo_gap"] = max(_spread(tpr), _spread(fpr_g))
        out["fnr"] = float((pred[pos] == 0).mean()) if pos.any() else float("nan")
        out["fpr"] = float((pred[neg] == 1).mean()) if neg.any() else float("nan")
    return out


def evaluate(
    logits: np.ndarray,
    y: np.ndarray,
    group: np.ndarray,
    *,
    constraints: ConstraintSet,
    temperature: float,
    group_names: Sequence[str],
) -> dict[str, Any]:
    """Metrics of one split.

    Returns:
        A flat dict: ``accuracy``, ``loss``, ``constraint_values_hard`` / ``_soft`` (J lists),
        ``constraint_max_hard`` / ``_soft`` (max_j Gamma_j), ``violation_hard`` / ``_soft``
        (max_j Gamma_j - gamma_j), ``satisfied`` (violation_hard <= 0), the fairness
        metrics of :func:`fairness_metrics`, ``group_accuracy`` and ``group_positive_rate``
        (maps group name -> value), ``n``, and ``constraints``: per family (see
        :func:`family_metrics`).
    """
    logits = np.asarray(logits, dtype=np.float64)
    y = np.asarray(y)
    group = np.asarray(group)
    n_groups = len(group_names)
    K = logits.shape[1]
    pred = logits.argmax(axis=1)
    p = softmax(logits)
    loss = float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-300, None)).mean())
    out: dict[str, Any] = {"n": int(len(y)), "accuracy": float((pred == y).mean()), "loss": loss}
    cells = constraints.cells(y, group)
    values = {}
    for kind, probs in (("hard", np.eye(K)[pred]), ("soft", softmax(logits, temperature))):
        if constraints.is_empty:
            values[kind] = np.zeros(0)
        else:
            values[kind] = constraints.gamma_post(constraints.histogram(probs, cells), floor=None)
        out[f"constraint_values_{kind}"] = [float(v) for v in values[kind]]
        out[f"constraint_max_{kind}"] = _max(values[kind])
        out[f"violation_{kind}"] = _max(values[kind] - constraints.gamma)
    out["satisfied"] = bool(out["violation_hard"] <= 0.0)
    out.update(fairness_metrics(y, pred, group, n_classes=K, n_groups=n_groups))
    out["constraints"] = family_metrics(constraints, values["hard"], values["soft"], out)
    acc_g = _group_rate(pred == y, np.ones_like(y, dtype=bool), group, n_groups)
    pos_g = _group_rate(pred == (K - 1), np.ones_like(y, dtype=bool), group, n_groups)
    out["group_accuracy"] = {name: _nan_to_none(v) for name, v in zip(group_names, acc_g)}
    out["group_positive_rate"] = {name: _nan_to_none(v) for name, v in zip(group_names, pos_g)}
    return out


def _max(values: np.ndarray) -> float:
    """max over the finite entries (0 when there are none: no constraint, or empty subsets)."""
    finite = values[np.isfinite(values)]
    return float(finite.max()) if len(finite) else 0.0


def family_metrics(
    constraints: ConstraintSet, hard: np.ndarray, soft: np.ndarray, standard: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Per constraint family: ``names``, ``gamma``, ``values_hard`` / ``values_soft`` (the
    family's Gamma_j), ``max_hard`` / ``max_soft`` (max_j Gamma_j), ``max_violation_hard`` /
    ``_soft`` (max_j Gamma_j - gamma_j), ``satisfied`` (hard), and ``standard``: the family's
    standard metric(s) from :data:`STANDARD_METRICS` (binary tasks; null otherwise).
    """
    out: dict[str, dict[str, Any]] = {}
    for family in constraints.families:
        idx = constraints.family_indices(family)
        gamma = constraints.gamma[idx]
        entry: dict[str, Any] = {
            "names": [constraints.names[j] for j in idx],
            "gamma": [float(g) for g in gamma],
        }
        for kind, values in (("hard", hard[idx]), ("soft", soft[idx])):
            entry[f"values_{kind}"] = [float(v) for v in values]
            entry[f"max_{kind}"] = _max(values)
            entry[f"max_violation_{kind}"] = _max(values - gamma)
        entry["satisfied"] = bool(entry["max_violation_hard"] <= 0.0)
        entry["standard"] = {name: standard.get(name) for name in STANDARD_METRICS.get(family, ())}
        out[family] = entry
    return out


def _nan_to_none(v: float) -> float | None:
    return None if not np.isfinite(v) else float(v)


def evaluate_regression(pred: np.ndarray, target: np.ndarray, group: np.ndarray, *, group_names: Sequence[str]) -> dict[str, Any]:
    """Metrics of one split of a regression task (``task=regression``).

    The mean squared prediction error (MSPE) of the DPSE paper's tables, overall and per group:
    ``MSPE_k = mean_{i in group k} (pred_i - target_i)^2``.

    Returns:
        ``n``, ``mspe`` (all rows), ``loss`` (the same: the squared loss is the training
        loss), ``group_mspe`` (group name -> MSPE, null for a group without rows),
        ``worst_group_mspe`` (max over groups), ``mspe_gap`` (max - min over groups) and
        ``satisfied`` (True: regression runs have no rate constraint).

    >>> m = evaluate_regression(np.array([1.0, 2.0, 0.0]), np.array([0.0, 0.0, 0.0]), np.array([0, 0, 1]),
    ...                         group_names=("a", "b"))
    >>> m["mspe"], m["group_mspe"], m["worst_group_mspe"], m["mspe_gap"]
    (1.6666666666666667, {'a': 2.5, 'b': 0.0}, 2.5, 2.5)
    """
    pred = np.asarray(pred, dtype=np.float64).reshape(-1)
    err = (pred - np.asarray(target, dtype=np.float64)) ** 2
    group = np.asarray(group)
    n_groups = len(group_names)
    per_group = _group_rate(err, np.ones_like(err, dtype=bool), group, n_groups)
    mspe = float(err.mean()) if len(err) else float("nan")
    return {
        "n": int(len(err)),
        "mspe": mspe,
        "loss": mspe,
        "group_mspe": {name: _nan_to_none(v) for name, v in zip(group_names, per_group)},
        "worst_group_mspe": _max(per_group),
        "mspe_gap": _spread(per_group),
        "satisfied": True,
    }
