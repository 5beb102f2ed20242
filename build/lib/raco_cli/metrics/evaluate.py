"""Non-private evaluation of predictions on a whole split (paper Section 6, App. E.2).

Constraint values come from the same :class:`ConstraintSet` the training uses
(``Gamma_post`` on the exact histogram of the split), so what is optimised and what is
reported cannot drift apart.  Standard fairness metrics follow fairlearn's definitions
(``demographic_parity_difference``, ``equalized_odds_difference``, ...), with the positive
class being label 1 for binary tasks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.metrics.robust import roc_auc

#: the standard (fairlearn-defined, binary) metric reported with each constraint family
STANDARD_METRICS: dict[str, tuple[str, ...]] = {
    "dp": ("dp_gap",),
    "eo": ("eo_gap",),
    "eop": ("eop_gap",),
    "fnr": ("fnr",),
    "fpr": ("fpr",),
    "custom": (),
}


def softmax(z: np.ndarray, temperature: float | np.ndarray = 1.0, *, axis: int = -1) -> np.ndarray:
    """``softmax(temperature * z)`` over ``axis`` (the classes; default the last), shape preserved.

    Rows with non-finite logits (an input row with NaN/inf features) give NaN
    probabilities, reported as such (null in summary.json), without warnings.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        s = temperature * np.asarray(z, dtype=np.float64)
        s = s - s.max(axis=axis, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=axis, keepdims=True)


def logistic_terms(margin: np.ndarray, y: np.ndarray, temperatures: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-row cross-entropy and soft class-1 probability of R runs' binary margins.

    With ``d = z_1 - z_0`` (R, n) and ``s = -(2y - 1) d``: the loss ``-log p_y = log(1 +
    exp(s))``, computed by torch's fused ``softplus`` with threshold 40 (``s`` itself above it,
    where ``log(1 + exp(-s)) < 4.3e-18``: no overflow) and clipped at ``-log 1e-300`` as for
    every task; and ``p_1 = sigmoid(tau_r d)`` with each run's temperature (``temperatures``
    (R,); None: no probabilities).  Float64, in torch: its exp, log1p and sigmoid are
    vectorised (numpy's log1p is scalar code), and these were the largest elementwise costs of
    an evaluation; one fused pass instead of eight (~20 % of this function's time).  NaN
    margins stay NaN, +-inf give the clipped or zero loss and probabilities 1 / 0.

    >>> nll, p1 = logistic_terms(np.array([[0.0, 800.0, -800.0, np.inf, -np.inf]]), np.ones(5, dtype=int), np.ones(1))
    >>> nll[0].tolist() == [np.log(2.0), 0.0, -np.log(1e-300), 0.0, -np.log(1e-300)], p1[0].tolist() == [0.5, 1.0, 0.0, 1.0, 0.0]
    (True, True)
    """
    import torch

    d = np.ascontiguousarray(margin, dtype=np.float64)
    sign = torch.from_numpy(1.0 - 2.0 * np.asarray(y, dtype=np.float64))
    nll = np.empty_like(d)
    p1 = None if temperatures is None else np.empty_like(d)
    temps = None if temperatures is None else np.broadcast_to(np.asarray(temperatures, dtype=np.float64), (len(d),))
    with torch.no_grad():
        # one run's row at a time: torch's vectorised loops compute a tensor's last few
        # entries apart, so a run's values would depend on its place among the others
        for r, row in enumerate(torch.from_numpy(d)):
            nll[r] = torch.nn.functional.softplus(row * sign, beta=1.0, threshold=40.0).clamp_(max=-np.log(1e-300)).numpy()
            if p1 is not None and temps is not None:
                p1[r] = torch.sigmoid(row if temps[r] == 1.0 else row * float(temps[r])).numpy()
    return nll, p1


def cell_sums(values: np.ndarray, rows_of: Sequence[np.ndarray]) -> np.ndarray:
    """``sum_{i in cell q} values[..., i]`` (..., Q) for each cell's rows ``rows_of[q]``: each
    run's sum over its own values (numpy's pairwise sum along a row), so a run's histogram is
    the same whatever the other runs beside it (a matrix product's blocking depends on them).

    >>> cell_sums(np.array([[0.5, 0.25, 1.0]]), [np.array([0, 2]), np.array([1])]).tolist()
    [[1.5, 0.25]]
    """
    out = np.empty((*values.shape[:-1], len(rows_of)))
    for q, rows in enumerate(rows_of):
        out[..., q] = np.ascontiguousarray(np.take(values, rows, axis=-1)).sum(axis=-1)  # (a C-order copy: numpy sums a row pairwise)
    return out


def rows_by_cell(cells: np.ndarray, Q: int) -> list[np.ndarray]:
    """The rows of each of Q cells, from each row's cell ``cells`` (n,)."""
    return [np.flatnonzero(cells == q) for q in range(Q)]


def _group_rates(event: np.ndarray, cond: np.ndarray, onehot_group: np.ndarray) -> np.ndarray:
    """``P(event | cond, group=g)`` of R runs, shape (R, G); NaN for groups without
    conditioning rows.  ``event`` (R, n) bool, ``cond`` (n,) bool, ``onehot_group`` (n, G).

    Counts of 0/1 values are exact in float64 whatever the summation order, so every run gets
    the same value as a mean over its own rows."""
    member = onehot_group * cond[:, None]
    counts = member.sum(axis=0)
    # float32 sums of 0/1 values are exact below 2^24 rows, and twice as fast
    hits = (event.astype(np.float32) @ member.astype(np.float32)).astype(np.float64) if len(cond) < 2**24 else event @ member
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, hits / np.where(counts > 0, counts, 1.0), np.nan)


def _spreads(rates: np.ndarray) -> np.ndarray:
    """Per run: max - min over the finite entries (0 with fewer than two), shape (R,)."""
    finite = np.isfinite(rates)
    hi = np.where(finite, rates, -np.inf).max(axis=1)
    lo = np.where(finite, rates, np.inf).min(axis=1)
    return np.where(finite.sum(axis=1) >= 2, hi - lo, 0.0)


def _binary_rates(y: np.ndarray, pred: np.ndarray, onehot_group: np.ndarray, split: SplitConstants | None = None) -> dict[str, np.ndarray]:
    """Every rate a binary evaluation reports, of R runs, from one product: the counts of
    predicted positives in each (group, label) cell (exact integers in float32 below 2^24
    rows, so each rate is the same integer ratio the definitions give).

    Returns ``positive`` P(pred=1 | g), ``tpr`` P(pred=1 | g, y=1), ``fpr_g`` P(pred=1 | g, y=0)
    and ``correct`` P(pred=y | g), each (R, G) with NaN for an empty condition, and the
    overall ``accuracy``, ``fnr`` and ``fpr`` (R,)."""
    R, n = pred.shape
    G = onehot_group.shape[1]
    exact = n < 2**24
    if split is not None and exact:
        by_label32, cell_n = split.by_label, split.cell_rows
    else:
        by_label = _by_label(y, onehot_group)
        cell_n = by_label.sum(axis=0).reshape(G, 2)  # rows per (group, label)
        by_label32 = by_label.astype(np.float32)
    pos = ((pred.astype(np.float32) @ by_label32).astype(np.float64) if exact
           else (pred == 1) @ by_label).reshape(R, G, 2)  # predicted positives per (group, label)
    fp, tp = pos[..., 0], pos[..., 1]
    neg_n, pos_n = cell_n[:, 0], cell_n[:, 1]
    group_n = neg_n + pos_n

    def ratio(hits: np.ndarray, count: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, hits / np.where(count > 0, count, 1.0), np.nan)

    return {
        "positive": ratio(fp + tp, group_n), "tpr": ratio(tp, pos_n), "fpr_g": ratio(fp, neg_n),
        "correct": ratio(tp + (neg_n - fp), group_n),
        "accuracy": ratio(tp.sum(axis=1) + (neg_n.sum() - fp.sum(axis=1)), np.asarray(float(n))),
        "fnr": ratio(pos_n.sum() - tp.sum(axis=1), pos_n.sum()), "fpr": ratio(fp.sum(axis=1), neg_n.sum()),
    }


def _fairness_many(y: np.ndarray, pred: np.ndarray, onehot_group: np.ndarray, *, n_classes: int,
                   binary: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The fairness metrics of R runs (see :func:`fairness_metrics`); a binary task's from
    :func:`_binary_rates` (``binary``: already computed)."""
    if n_classes != 2:
        everyone = np.ones_like(y, dtype=bool)
        return {"dp_gap": np.max([_spreads(_group_rates(pred == k, everyone, onehot_group)) for k in range(n_classes)], axis=0)}
    rates = binary if binary is not None else _binary_rates(y, pred, onehot_group)
    tpr = _spreads(rates["tpr"])
    return {"dp_gap": _spreads(rates["positive"]), "eop_gap": tpr, "eo_gap": np.maximum(tpr, _spreads(rates["fpr_g"])),
            "fnr": rates["fnr"], "fpr": rates["fpr"]}


def fairness_metrics(y: np.ndarray, pred: np.ndarray, group: np.ndarray, *, n_classes: int, n_groups: int) -> dict[str, float]:
    """Standard group-fairness metrics of hard predictions.

    * ``dp_gap``: max over predicted classes k of (max_g - min_g) P(pred=k | g); for binary
      tasks this is fairlearn's ``demographic_parity_difference``.
    * ``eo_gap``: max(TPR spread, FPR spread) over groups (fairlearn's
      ``equalized_odds_difference``); ``eop_gap``: the TPR spread (equal opportunity).
    * ``fnr`` / ``fpr``: overall false-negative / false-positive rates, positive class 1.
    """
    y = np.asarray(y)
    many = _fairness_many(y, np.asarray(pred)[None], _onehot(np.asarray(group), n_groups), n_classes=n_classes)
    return {k: float(v[0]) for k, v in many.items()}


def _onehot(index: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((len(index), width))
    out[np.arange(len(index)), index] = 1.0
    return out


@dataclass(frozen=True)
class SplitConstants:
    """What an evaluation of a split derives from its labels, groups and constraint cells
    alone: the same at every evaluation of a training run (a 160-run group evaluates each split
    ~80 times, in chunks of runs: ~1 s of a group recomputed these).  :func:`split_constants`
    builds them; the evaluations take them or build their own, with the same values."""

    group_hot: np.ndarray  # (n, G) one-hot groups
    by_label: np.ndarray  # (n, 2G) float32 indicators of the (group, label) cells, label fastest
    cell_rows: np.ndarray  # (G, 2) rows per (group, label)
    cellhot: np.ndarray | None  # (n, Q) one-hot constraint cells (None: no constraint)
    cell_n: np.ndarray | None  # (Q,) rows per constraint cell
    cell_rows_of: list[np.ndarray] | None = None  # the rows of each constraint cell


def split_constants(y: np.ndarray, group: np.ndarray, constraints: ConstraintSet, n_groups: int) -> SplitConstants:
    """:class:`SplitConstants` of a split (``constraints``: the runs' shared partition)."""
    y, group = np.asarray(y), np.asarray(group)
    group_hot = _onehot(group, n_groups)
    by_label = _by_label(y, group_hot)
    cells = None if constraints.is_empty else constraints.cells(y, group)
    cellhot = None if cells is None else _onehot(cells, constraints.Q)
    return SplitConstants(group_hot=group_hot, by_label=by_label.astype(np.float32), cell_rows=by_label.sum(axis=0).reshape(n_groups, 2),
                          cellhot=cellhot, cell_n=None if cellhot is None else cellhot.sum(axis=0),
                          cell_rows_of=None if cells is None else rows_by_cell(cells, constraints.Q))


def _by_label(y: np.ndarray, onehot_group: np.ndarray) -> np.ndarray:
    """(n, 2G) float64 indicators of the (group, label) cells of a binary task, label fastest."""
    n, G = onehot_group.shape
    return np.stack([onehot_group * (y == 0)[:, None], onehot_group * (y == 1)[:, None]], axis=2).reshape(n, 2 * G)


def evaluate(
    logits: np.ndarray,
    y: np.ndarray,
    group: np.ndarray,
    *,
    constraints: ConstraintSet,
    temperature: float,
    group_names: Sequence[str],
    class_names: Sequence[str] | None = None,
    robust: bool = False,
) -> dict[str, Any]:
    """Metrics of one split.

    Returns:
        A flat dict: ``accuracy``, ``loss``, ``constraint_values_hard`` / ``_soft`` (J lists),
        ``constraint_max_hard`` / ``_soft`` (max_j Gamma_j), ``violation_hard`` / ``_soft``
        (max_j Gamma_j - gamma_j), ``satisfied`` (violation_hard <= 0), the fairness
        metrics of :func:`fairness_metrics`, ``group_accuracy`` and ``group_positive_rate``
        (maps group name -> value), ``n``, ``constraints``: per family (see
        :func:`_family_metrics_many`), and with ``robust`` (the DRO runs) the robustness metrics of
        :func:`raco_cli.metrics.robust.robust_metrics` (worst-group / per-class accuracy, F1,
        ROC AUC; classes named by ``class_names``).  Other runs skip them: ROC AUC's rank
        statistic costs ~13 ms per run on Adult's training split, and every metric is mirrored to
        MLflow at every evaluation (a 160-run group: 39 s training, ~160 s MLflow logging).
    """
    return evaluate_many(np.asarray(logits)[None], y, group, constraints=[constraints], temperatures=[temperature],
                         group_names=group_names, class_names=class_names, robust=robust)[0]


def binary_predictions(margin: np.ndarray) -> np.ndarray:
    """The prediction rule of two classes, from the margins ``z_1 - z_0``: class 1 where the
    margin is positive; ties and NaN (inf - inf of a non-finite row) to class 0.  Every
    evaluation of a binary task predicts through this (and :func:`predictions`)."""
    return (np.asarray(margin) > 0).astype(np.int64)


def predictions(logits: np.ndarray) -> np.ndarray:
    """The predicted class of each row of ``logits`` (..., K): two classes by the margin
    (:func:`binary_predictions`), more by the arg-max."""
    z = np.asarray(logits, dtype=np.float64)
    if z.shape[-1] == 2:
        with np.errstate(invalid="ignore"):
            return binary_predictions(z[..., 1] - z[..., 0])
    return z.argmax(axis=-1)


def accuracy_only(logits: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """``n`` and ``accuracy`` of one split by :func:`evaluate`'s prediction rule
    (:func:`predictions`): all that ``privacy.scope=model`` reads of validation (the correct
    count of its noisy selection)."""
    y = np.asarray(y)
    if not len(y):
        return {"n": 0, "accuracy": math.nan}
    return {"n": int(len(y)), "accuracy": float((predictions(logits) == y).mean())}


def evaluate_many(
    logits: np.ndarray,
    y: np.ndarray,
    group: np.ndarray,
    *,
    constraints: Sequence[ConstraintSet],
    temperatures: Sequence[float],
    group_names: Sequence[str],
    class_names: Sequence[str] | None = None,
    robust: bool = False,
) -> list[dict[str, Any]]:
    """:func:`evaluate` of R runs on one split at once (batched training, docs/batched.md).

    Args:
        logits: (R, n, K) logits of every run on the split's rows.
        constraints: one set per run; they may differ only in gamma (same partition and
            weights), as in a sweep group.
        temperatures: tau of each run (the soft constraint values).

    Returns:
        One dict per run, as :func:`evaluate` returns.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.shape[2] == 2:
        with np.errstate(invalid="ignore"):  # inf - inf of a non-finite row: nan, predicted class 0 as argmax does
            margin = logits[:, :, 1] - logits[:, :, 0]
        return evaluate_binary_many(margin, y, group, constraints=constraints,
                                    temperatures=temperatures, group_names=group_names, class_names=class_names, robust=robust)
    y, group = np.asarray(y), np.asarray(group)
    R, n, K = logits.shape
    # class-major (R, K, n): reductions over the short class axis run along contiguous rows
    zt = np.ascontiguousarray(logits.transpose(0, 2, 1))
    pred = zt.argmax(axis=1)  # (R, n)
    p = softmax(zt, axis=1)
    with np.errstate(divide="ignore"):
        nll = -np.log(np.clip(np.take_along_axis(p, np.broadcast_to(y[None, None, :], (R, 1, n)), axis=1)[:, 0], 1e-300, None))
    hists = []
    if not constraints[0].is_empty:
        rows_of = rows_by_cell(constraints[0].cells(y, group), constraints[0].Q)
        temps = np.asarray(temperatures, dtype=np.float64)[:, None, None]
        hard = (pred[:, None, :] == np.arange(K)[None, :, None]).astype(np.float64)
        hists = [cell_sums(probs, rows_of).transpose(0, 2, 1) for probs in (hard, softmax(zt, temps, axis=1))]  # (R, Q, K)
    return _assemble(y, group, pred, nll, hists, p.transpose(0, 2, 1) if robust else None, n_classes=K, constraints=constraints,
                     group_names=group_names, class_names=class_names)


def evaluate_binary_many(
    margin: np.ndarray,
    y: np.ndarray,
    group: np.ndarray,
    *,
    constraints: Sequence[ConstraintSet],
    temperatures: Sequence[float],
    group_names: Sequence[str],
    class_names: Sequence[str] | None = None,
    robust: bool = False,
    split: SplitConstants | None = None,
) -> list[dict[str, Any]]:
    """:func:`evaluate_many` of a binary task from the margins ``z_1 - z_0`` (R, n): the
    softmax of two logits is the logistic function of their difference, so an evaluation
    needs one array per run, not two (``p_1 = 1 / (1 + exp(-tau d))``, the loss
    ``-log p_y = log(1 + exp(-(2y - 1) d))``, the arg-max ``d > 0``, ties to class 0).
    ``split``: the split's :class:`SplitConstants` (built here when None)."""
    d = np.asarray(margin, dtype=np.float64)
    y, group = np.asarray(y), np.asarray(group)
    pred = binary_predictions(d)
    nll, soft = logistic_terms(d, y, None if constraints[0].is_empty else np.asarray(temperatures, dtype=np.float64))
    hists = []
    if soft is not None:
        if split is not None and split.cellhot is not None and split.cell_rows_of is not None:
            cellhot, cell_n, rows_of = split.cellhot, split.cell_n, split.cell_rows_of
        else:
            cells = constraints[0].cells(y, group)
            cellhot, rows_of = _onehot(cells, constraints[0].Q), rows_by_cell(cells, constraints[0].Q)
            cell_n = cellhot.sum(axis=0)  # (Q,) rows per cell: class-0 mass = rows - class-1 mass
        # the hard rates' counts are exact integers whatever the order (one product); the soft
        # rates' sums each run's own (cell_sums)
        for ones in (pred.astype(np.float64) @ cellhot, cell_sums(soft, rows_of)):
            hists.append(np.stack([cell_n - ones, ones], axis=2))  # (R, Q, 2)
    probs = None
    if robust:
        with np.errstate(over="ignore", invalid="ignore"):
            p1 = 1.0 / (1.0 + np.exp(-d))  # class-1 probability at temperature 1 (ROC AUC)
        probs = np.stack([1.0 - p1, p1], axis=2)
    return _assemble(y, group, pred, nll, hists, probs, n_classes=2, constraints=constraints,
                     group_names=group_names, class_names=class_names, split=split)


def _assemble(
    y: np.ndarray, group: np.ndarray, pred: np.ndarray, nll: np.ndarray, hists: list[np.ndarray], probs: np.ndarray | None, *,
    n_classes: int, constraints: Sequence[ConstraintSet], group_names: Sequence[str], class_names: Sequence[str] | None,
    split: SplitConstants | None = None,
) -> list[dict[str, Any]]:
    """The per-run metric dicts from predictions (R, n), per-row losses (R, n), the exact
    hard and soft histograms (R, Q, K) of the split (none without constraints) and the class
    probabilities (R, n, K) at temperature 1 (None: no ROC AUC)."""
    R, n = pred.shape
    K = n_classes
    n_groups = len(group_names)
    loss = nll.mean(axis=1) if n else np.full(R, np.nan)
    values: dict[str, np.ndarray] = {}
    for i, kind in enumerate(("hard", "soft")):
        values[kind] = _gamma_post_many(constraints[0], hists[i]) if hists else np.zeros((R, 0))
    group_hot = split.group_hot if split is not None else _onehot(group, n_groups)
    if K == 2:  # every rate from one product of per-(group, label) counts
        binary = _binary_rates(y, pred, group_hot, split)
        fair = _fairness_many(y, pred, group_hot, n_classes=K, binary=binary)
        accuracy, acc_g, pos_g = binary["accuracy"], binary["correct"], binary["positive"]
    else:
        everyone = np.ones_like(y, dtype=bool)
        fair = _fairness_many(y, pred, group_hot, n_classes=K)
        accuracy = (pred == y).mean(axis=1) if n else np.full(R, np.nan)
        acc_g = _group_rates(pred == y, everyone, group_hot)
        pos_g = _group_rates(pred == (K - 1), everyone, group_hot)
    # robustness metrics only for the runs that asked (probabilities given): every extra metric is
    # mirrored to MLflow at every evaluation, and metric logging is most of a sweep's time
    robust = _robust_many(y, pred, acc_g, n_classes=K, class_names=class_names) if probs is not None else None
    hard, soft = values["hard"], values["soft"]
    gamma = np.stack([c.gamma for c in constraints]) if R else np.zeros((0, hard.shape[1]))  # (R, J)
    # every per-run number as Python floats at once (.tolist()): a float() per value per run
    # was most of the evaluation's Python time
    per_run: dict[str, list[Any]] = {
        "accuracy": accuracy.tolist(), "loss": loss.tolist(),
        "values_hard": hard.tolist(), "values_soft": soft.tolist(),
        "max_hard": _max_rows(hard), "max_soft": _max_rows(soft),
        "violation_hard": _max_rows(hard - gamma), "violation_soft": _max_rows(soft - gamma),
        **{name: v.tolist() for name, v in fair.items()},
    }
    families = _family_metrics_many(constraints[0], hard, soft, gamma) if R else []
    acc_g_list, pos_g_list = _nan_to_none_rows(acc_g), _nan_to_none_rows(pos_g)
    out = []
    for r in range(R):
        m: dict[str, Any] = {"n": int(n), "accuracy": per_run["accuracy"][r], "loss": per_run["loss"][r]}
        for kind in ("hard", "soft"):
            m[f"constraint_values_{kind}"] = per_run[f"values_{kind}"][r]
            m[f"constraint_max_{kind}"] = per_run[f"max_{kind}"][r]
            m[f"violation_{kind}"] = per_run[f"violation_{kind}"][r]
        m["satisfied"] = bool(m["violation_hard"] <= 0.0)
        m.update({name: per_run[name][r] for name in fair})
        m["constraints"] = {family: {**entry[r], "standard": {name: m.get(name) for name in STANDARD_METRICS.get(family, ())}}
                            for family, entry in families}
        m["group_accuracy"] = dict(zip(group_names, acc_g_list[r]))
        m["group_positive_rate"] = dict(zip(group_names, pos_g_list[r]))
        if robust is not None and probs is not None:
            m.update(robust[r])
            m["roc_auc"] = roc_auc(y, probs[r])
        out.append(m)
    return out


def _gamma_post_many(constraints: ConstraintSet, H: np.ndarray) -> np.ndarray:
    """``Gamma_post_j`` (paper eq. 12) of R exact histograms H (R, Q, K) at once, shape (R, J):
    :meth:`ConstraintSet.gamma_post` with ``floor=None`` (an empty subset gives NaN) per run.
    Every sum adds its terms in one fixed order, vectorised over the runs only: a run's values
    are the same whatever the other runs beside it."""
    R, Q, K = H.shape
    J, M, _ = constraints.alpha.shape
    membership, alpha = constraints.membership, constraints.alpha
    num = np.zeros((R, M, K))  # sum_{i in I} H[i, k]
    for m in range(M):
        for q in np.flatnonzero(membership[m]):
            num[:, m] += membership[m, q] * H[:, q]
    denom = np.zeros((R, M))  # |B_I|
    for k in range(K):
        denom += num[:, :, k]
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = num / np.where(denom == 0, np.nan, denom)[:, :, None]
    out = np.zeros((R, J))
    for j in range(J):
        for m, k in zip(*np.nonzero(alpha[j])):
            out[:, j] += rates[:, m, k] * alpha[j, m, k]
    return out


def _max_rows(values: np.ndarray) -> list[float]:
    """Per row: max over the finite entries (0 when there are none: no constraint, or empty
    subsets), as Python floats."""
    if values.shape[1] == 0:
        return [0.0] * values.shape[0]
    finite = np.isfinite(values)
    return np.where(finite.any(axis=1), np.where(finite, values, -np.inf).max(axis=1), 0.0).tolist()


def _nan_to_none_rows(values: np.ndarray) -> list[list[float | None]]:
    """Rows of Python floats, non-finite entries as None (null in summary.json)."""
    return [[v if math.isfinite(v) else None for v in row] for row in values.tolist()]


def _max(values: np.ndarray) -> float:
    """max over the finite entries (0 when there are none: no constraint, or empty subsets)."""
    return _max_rows(np.asarray(values, dtype=np.float64).reshape(1, -1))[0]


def _family_metrics_many(
    constraints: ConstraintSet, hard: np.ndarray, soft: np.ndarray, gamma: np.ndarray
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Per constraint family, per run: ``names``, ``gamma``, ``values_hard`` / ``values_soft``
    (the family's Gamma_j), ``max_hard`` / ``max_soft`` (max_j Gamma_j),
    ``max_violation_hard`` / ``_soft`` (max_j Gamma_j - gamma_j) and ``satisfied`` (hard); the
    caller adds ``standard``: the family's standard metric(s) from :data:`STANDARD_METRICS`
    (binary tasks; null otherwise).  ``hard``, ``soft``, ``gamma``: (R, J); the runs share
    their constraints up to gamma."""
    out = []
    for family in constraints.families:
        idx = constraints.family_indices(family)
        names = [constraints.names[j] for j in idx]
        cols: dict[str, list[Any]] = {"gamma": gamma[:, idx].tolist()}
        for kind, values in (("hard", hard[:, idx]), ("soft", soft[:, idx])):
            cols[f"values_{kind}"] = values.tolist()
            cols[f"max_{kind}"] = _max_rows(values)
            cols[f"max_violation_{kind}"] = _max_rows(values - gamma[:, idx])
        entries = []
        for r in range(hard.shape[0]):
            entry: dict[str, Any] = {"names": list(names), "gamma": cols["gamma"][r]}
            for kind in ("hard", "soft"):
                for key in ("values", "max", "max_violation"):
                    entry[f"{key}_{kind}"] = cols[f"{key}_{kind}"][r]
            entry["satisfied"] = bool(entry["max_violation_hard"] <= 0.0)
            entries.append(entry)
        out.append((family, entries))
    return out


def _robust_many(
    y: np.ndarray, pred: np.ndarray, acc_g: np.ndarray, *, n_classes: int, class_names: Sequence[str] | None,
) -> list[dict[str, Any]]:
    """:func:`raco_cli.metrics.robust.robust_metrics` without ROC AUC for R runs at once, from
    exact class counts (one matrix product instead of a pass per run, group and class: ~1 ms per
    run-evaluation of Adult's training split otherwise) and the group accuracies ``acc_g`` (R, G)."""
    K = n_classes
    names = list(class_names) if class_names is not None else [str(k) for k in range(K)]
    yhot = _onehot(y, K)
    class_n = yhot.sum(axis=0)  # (K,)
    correct = (pred == y).astype(np.float32)
    # float32 sums of 0/1 values are exact below 2^24 rows: the same counts as robust_metrics' means
    hits = (correct @ yhot.astype(np.float32)).astype(np.float64) if len(y) < 2**24 else (pred == y) @ yhot  # (R, K)
    pred_n = np.stack([(pred == k).sum(axis=1) for k in range(K)], axis=1).astype(np.float64)  # (R, K)
    denom = pred_n + class_n
    with np.errstate(invalid="ignore", divide="ignore"):
        f1_k = np.where(denom > 0, 2.0 * hits / np.where(denom > 0, denom, 1.0), 0.0)
    out = []
    for r in range(len(pred)):
        class_acc = {names[k]: (float(hits[r, k] / class_n[k]) if class_n[k] > 0 else None) for k in range(K)}
        present = [v for v in class_acc.values() if v is not None]
        groups = [float(v) for v in acc_g[r] if np.isfinite(v)]
        out.append({
            "worst_group_accuracy": min(groups) if groups else None,
            "class_accuracy": class_acc,
            "worst_class_accuracy": min(present) if present else None,
            "balanced_accuracy": float(np.mean(present)) if present else None,
            "f1": float(f1_k[r, 1]) if K == 2 else float(np.mean(f1_k[r])),
        })
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
    # exact float64 means (the float32 counting of _group_rates is for 0/1 events only)
    per_group = np.array([err[group == g].mean() if (group == g).any() else np.nan for g in range(n_groups)])
    mspe = float(err.mean()) if len(err) else float("nan")
    return {
        "n": int(len(err)),
        "mspe": mspe,
        "loss": mspe,
        "group_mspe": {name: _nan_to_none(v) for name, v in zip(group_names, per_group)},
        "worst_group_mspe": _max(per_group),
        "mspe_gap": float(_spreads(per_group[None, :])[0]),
        "satisfied": True,
    }


def against_gamma(metrics: dict[str, Any], gamma: np.ndarray, families: dict[str, list[int]]) -> dict[str, Any]:
    """One split's constraint metrics re-expressed against other right-hand sides ``gamma``
    (J,): a run trained against ``gamma - margin`` (``constraint.confidence``) reports whether
    it meets the ``gamma`` the user asked for.  ``families``: family -> its constraints' indices.

    >>> m = {"constraint_values_hard": [0.04], "constraint_values_soft": [0.03], "violation_hard": 0.01,
    ...      "violation_soft": 0.0, "satisfied": False, "constraints": {"dp": {"gamma": [0.03]}}}
    >>> out = against_gamma(m, np.array([0.05]), {"dp": [0]})
    >>> out["satisfied"], round(out["violation_hard"], 6), out["constraints"]["dp"]["satisfied"]
    (True, -0.01, True)
    """
    if "constraint_values_hard" not in metrics:
        return metrics
    out = dict(metrics)
    for kind in ("hard", "soft"):
        values = np.asarray(metrics[f"constraint_values_{kind}"], dtype=float)
        out[f"violation_{kind}"] = _max(values - gamma) if len(values) else 0.0
    out["satisfied"] = bool(out["violation_hard"] <= 0.0)
    fams = {}
    for family, entry in (metrics.get("constraints") or {}).items():
        idx = families[family]
        e = dict(entry)
        e["gamma"] = [float(g) for g in gamma[idx]]
        for kind in ("hard", "soft"):
            values = np.asarray(metrics[f"constraint_values_{kind}"], dtype=float)[idx]
            e[f"max_violation_{kind}"] = _max(values - gamma[idx])
        e["satisfied"] = bool(e["max_violation_hard"] <= 0.0)
        fams[family] = e
    if fams:
        out["constraints"] = fams
    return out
