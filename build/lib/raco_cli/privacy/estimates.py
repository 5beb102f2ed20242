"""Private estimates of a table's bounds, level lists and missing-value indicators
(``private`` values of a ``dataset=table`` configuration, :mod:`raco_cli.data.provenance`).

One release per run, from the **training split only**, before the plan (like the DP count of
the training rows and the DP standardisation, :func:`raco_cli.run.prepare.prepare_run`):

* every column to estimate gets a histogram of its training cells, and one record touches
  exactly one count per column (its value's bin or level, or the column's ``missing``
  count), so over the M columns of the release the L2 sensitivity under add/remove of one
  record is sqrt(M);
* every count gets N(0, s^2) with s = sigma sqrt(M): the Gaussian mechanism with noise
  multiplier sigma (``dataset.estimate_noise_multiplier``), ``GaussianDpEvent(sigma)`` in the
  run's DpEvent tree (:func:`estimates_event`);
* a count is *released* when its noisy value reaches the threshold tau (:func:`threshold`).

What is read from the noisy counts (post-processing):

* **numeric bounds** (``dataset.bounds.<col>: private``): the counts are over fixed bins that
  depend on no data, a zero bin (|x| < 2^-32) and sign x octaves [2^k, 2^(k+1)) for
  k = -32..63 (Google's differential privacy library, "approximate bounds"); every bin gets
  noise, released or not.  The bounds are the outer edges of the lowest and the highest bin
  whose noisy count reaches tau (the argmax bin when none does), widened one adjacent bin at a
  time while its noisy count reaches 2 s (a thin but clearly non-empty tail; an empty bin
  passes with probability 2.3 %, and then only widens the range by a factor 2): within a
  factor 2 of the range of the bulk of the column (measured in docs/privacy.md).
  Why not DP quantiles: a quantile needs its own budget per column and a bounded domain to
  start from, which is what is being estimated; the bins need neither.
* **level lists** (``dataset.options.levels.<col>: private``): the keys are the values the
  training rows hold (data-dependent), so the release is the stability-based (Gaussian
  sparse) histogram: noise only on observed values, a value released when its noisy count
  reaches tau (Korolova, Kenthapadi, Mishra, Ntoulas 2009; Gaussian: Wilkins, Kifer, Zhang,
  Rubinstein 2024).  A value held by one record only in the larger of two neighbouring
  datasets is released with probability P(1 + N(0, s^2) >= tau) = Q((tau - 1) / s): for each
  of the M_sparse columns with data-dependent keys, so
  delta_thr = 1 - (1 - Q((tau - 1) / s))^M_sparse (:func:`threshold_delta`).
* **missing-value indicators** (``dataset.options.missing_indicator: private``): a column
  gets one when the noisy count of its missing cells reaches tau (a fixed key: no delta).
* **column types** (``dataset.options.types.<col>: private``, what ``raco data describe``
  writes): the column's histogram has three fixed keys, the counts of its ``missing``,
  ``numeric`` (a finite number) and ``text`` cells, then the numeric cells' bins (fixed keys,
  as for bounds) and the text cells' values (data-dependent keys, as for levels).  A present
  cell adds 1 to two counts (its kind and its bin or value), so such a column weighs 2 in M
  (L2 sensitivity sqrt(2) of its part) and is one of the M_sparse columns.  The type is
  post-processing of the noisy counts (:func:`decide_type`): ``drop`` when neither the numeric
  nor the text count reaches tau; ``numeric`` when the numeric count is the larger (bounds from
  its bins; a cell that is no number is read as missing); else the text values released are
  its levels: none or more than :data:`MAX_TYPE_LEVELS`: ``drop``; one value, with a noisy
  rest of text cells (text count minus the released values' counts, noise std sqrt(2) s) below
  2 sqrt(2) s, the :data:`EXTEND_Z` rule of the bounds: ``drop`` (one value only); two with such
  a rest: ``binary``; else ``categorical`` (its other values: ``<col>=other``).  So the type of a
  column never hangs on one record (one odd value, one duplicate, one non-numeric token) but
  through the accounted noise.

Accounting (docs/privacy.md): replacing the release on the larger dataset by the same
mechanism restricted to the keys both datasets hold changes its output distribution by at
most delta_thr in total variation, and that restricted mechanism is a Gaussian mechanism of
sensitivity sqrt(M) followed by post-processing.  For any composition with the other
releases this gives, for every output set S, P[A(D) in S] <= e^eps P[A(D') in S] +
delta_PLD(eps) + e^eps delta_thr (the e^eps factor in the direction where the smaller
dataset is on the left).  So tau is chosen such that e^eps_target delta_thr = delta / 10
(:data:`DELTA_SHARE`), and the run's epsilon is computed by the PLD accountant at
delta - delta/10 (``MethodSpec.reserved_delta``); with no data-dependent key no delta is
reserved and tau only keeps empty bins from being released (probability < delta/10 e^-eps
per bin).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dp_accounting as dpa
import numpy as np
import pandas as pd
import torch
from scipy.stats import norm

from raco_cli.data.provenance import Estimates
from raco_cli.data.table import PendingColumn, pending_values, sorted_levels
from raco_cli.privacy import releases
from raco_cli.privacy.mechanisms import NoiseSource, gaussian_noise

K_MIN, K_MAX = -32, 64  # octaves [2^k, 2^(k+1)) for k in K_MIN..K_MAX-1, each sign
OCTAVES = K_MAX - K_MIN
MISSING, ZERO = 0, 1  # keys of a numeric column's histogram; then the negative, then the positive octaves
N_KEYS = 2 + 2 * OCTAVES
DELTA_SHARE = 0.1  # the share of delta the thresholding of data-dependent keys may take
EXTEND_Z = 2.0  # a bound widens into the adjacent bin when its noisy count reaches EXTEND_Z noise stds
MAX_TYPE_LEVELS = 50  # a private type with more released text values than this: drop (names, dates, free text)
TYPE_KEYS = ("missing", "numeric", "text")  # the fixed keys that open a private type's histogram


def estimates_event(noise_multiplier: float) -> dpa.DpEvent:
    """The DpEvent of the release (L2 sensitivity sqrt(M), noise std sigma sqrt(M))."""
    return dpa.GaussianDpEvent(noise_multiplier)


def bin_keys(values: np.ndarray) -> np.ndarray:
    """The histogram key of each value: :data:`MISSING` for NaN, :data:`ZERO` for |x| < 2^K_MIN,
    ``2 + i`` for the negative octave ``(-2^(k+1), -2^k]`` with ``k = K_MAX - 1 - i``, and
    ``2 + OCTAVES + j`` for the positive octave ``[2^k, 2^(k+1))`` with ``k = K_MIN + j``
    (magnitudes beyond 2^K_MAX go to the outermost octave).

    >>> bin_keys(np.array([np.nan, 0.0, 1.0, 1.5, 2.0, -1.0])).tolist() == [0, 1, 2 + 96 + 32, 2 + 96 + 32, 2 + 96 + 33, 2 + 63]
    True
    """
    v = np.asarray(values, dtype=np.float64)
    out = np.full(v.shape, ZERO, dtype=np.int64)
    missing = np.isnan(v)
    mag = np.abs(np.where(missing, 0.0, v))
    big = mag >= 2.0**K_MIN
    with np.errstate(divide="ignore"):
        k = np.clip(np.floor(np.log2(np.where(big, mag, 1.0))).astype(np.int64), K_MIN, K_MAX - 1)
    out = np.where(big & (v > 0), 2 + OCTAVES + (k - K_MIN), out)
    out = np.where(big & (v < 0), 2 + (K_MAX - 1 - k), out)
    return np.where(missing, MISSING, out)


def bin_edges(key: int) -> tuple[float, float]:
    """``(lo, hi)`` of a value bin (the zero bin: ``(0, 0)``).

    >>> bin_edges(int(bin_keys(np.array([3.0]))[0])), bin_edges(int(bin_keys(np.array([-3.0]))[0])), bin_edges(ZERO)
    ((2.0, 4.0), (-4.0, -2.0), (0.0, 0.0))
    """
    if key == ZERO:
        return 0.0, 0.0
    if key >= 2 + OCTAVES:
        k = K_MIN + key - 2 - OCTAVES
        return 2.0**k, 2.0 ** (k + 1)
    k = K_MAX - 1 - (key - 2)
    return -(2.0 ** (k + 1)), -(2.0**k)


def _value_order() -> np.ndarray:
    """Value keys from the most negative bin to the largest positive one."""
    return np.array([*range(2, 2 + OCTAVES), ZERO, *range(2 + OCTAVES, N_KEYS)], dtype=np.int64)


VALUE_ORDER = _value_order()


def bounds_from_counts(noisy: np.ndarray, tau: float, transform: str = "none", extend: float | None = None) -> tuple[float, float]:
    """Post-processing of a numeric column's noisy histogram (length :data:`N_KEYS`): the
    outer edges of the lowest and highest value bins whose noisy count reaches ``tau`` (the
    argmax bin when none does), widened one adjacent bin at a time while the next bin's noisy
    count reaches ``extend`` (a clearly non-empty bin of a thin tail), made valid for
    ``transform``.

    >>> counts = np.zeros(N_KEYS); counts[bin_keys(np.array([20.0, 50.0, 70.0]))] = 100
    >>> bounds_from_counts(counts, 50.0), bounds_from_counts(counts, 150.0, extend=50.0)
    ((16.0, 128.0), (16.0, 128.0))
    """
    values = np.asarray(noisy, dtype=np.float64)[VALUE_ORDER]
    hit = np.flatnonzero(values >= tau)
    first, last = (int(hit[0]), int(hit[-1])) if len(hit) else (int(np.argmax(values)),) * 2
    if extend is not None:
        while first > 0 and values[first - 1] >= extend:
            first -= 1
        while last < len(values) - 1 and values[last + 1] >= extend:
            last += 1
    lo, hi = bin_edges(int(VALUE_ORDER[first]))[0], bin_edges(int(VALUE_ORDER[last]))[1]
    if transform == "log1p":
        lo = max(lo, 0.0)
    elif transform == "log":
        lo = max(lo, 2.0**K_MIN)
    if not hi > lo:
        hi = lo + 1.0 if lo >= 0 else 0.0
    return float(lo), float(hi)


def weight(column: PendingColumn) -> int:
    """How many counts of the release one record changes in this column (its share of M)."""
    return 2 if column.kind == "type" else 1


def _kinds(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A private type's cells: ``(missing mask, finite numbers, text cells that are no number)``."""
    present = [t for t in values if t is not None]
    parsed = pd.to_numeric(pd.Series(present, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    finite = np.isfinite(parsed)
    return (np.array([t is None for t in values], dtype=bool), parsed[finite],
            [t for t, ok in zip(present, finite.tolist()) if not ok])


def decide_type(kinds: np.ndarray, text_keys: Sequence[str], text_counts: np.ndarray, tau: float,
                rest_min: float | None = None) -> tuple[str, tuple[str, ...]]:
    """A private column's type from its noisy ``(missing, numeric, text)`` counts and the noisy
    counts of its text values (module docstring): ``(type, released levels)``.  ``rest_min``
    (default tau): the noisy count of text cells outside the released values from which they
    are a part of their own (``<col>=other``): below it one released value is a column of one
    value only (drop), two released values a binary column.

    >>> decide_type(np.array([0.0, 900.0, 5.0]), ["?"], np.array([5.0]), 50.0)
    ('numeric', ())
    >>> decide_type(np.array([0.0, 0.0, 900.0]), ["x", "y"], np.array([899.0, 1.0]), 50.0)
    ('drop', ('x',))
    >>> decide_type(np.array([0.0, 0.0, 900.0]), ["x", "y"], np.array([700.0, 200.0]), 50.0)
    ('binary', ('x', 'y'))
    >>> decide_type(np.array([0.0, 0.0, 1900.0]), ["P", "a", "b"], np.array([1400.0, 250.0, 250.0]), 578.0, rest_min=300.0)
    ('categorical', ('P',))
    """
    _, numeric, text = (float(v) for v in kinds)
    released = tuple(k for k, c in zip(text_keys, text_counts) if c >= tau)
    if max(numeric, text) < tau:
        return "drop", released
    if numeric >= text:
        return "numeric", ()
    if not released or len(released) > MAX_TYPE_LEVELS:
        return "drop", released
    rest = text - float(sum(c for c in text_counts if c >= tau))
    few = rest < (tau if rest_min is None else rest_min)
    if len(released) == 1:
        return ("drop" if few else "categorical"), released
    return ("binary" if len(released) == 2 and few else "categorical"), released


def threshold(std: float, *, eps: float, delta: float, sparse_columns: int) -> float:
    """tau = 1 + s Q^-1(p), with p the per-column chance that a value held by one record is
    released: ``1 - (1 - p)^M_sparse = DELTA_SHARE * delta / e^eps`` (module docstring).

    >>> round(threshold(10.0, eps=1.0, delta=1e-5, sparse_columns=1), 3)
    50.517
    """
    target = DELTA_SHARE * delta / math.exp(eps)
    per_column = -math.expm1(math.log1p(-target) / max(1, sparse_columns))
    return 1.0 + std * float(norm.isf(per_column))


def threshold_delta(tau: float, std: float, sparse_columns: int) -> float:
    """delta_thr: the probability that one of the (at most one per column) values held by a
    single record only is released: ``1 - (1 - Q((tau - 1) / s))^M_sparse``.

    >>> threshold_delta(1.0, 1.0, 1)
    0.5
    """
    if sparse_columns == 0:
        return 0.0
    p = float(norm.sf((tau - 1.0) / std))
    return -math.expm1(sparse_columns * math.log1p(-p))


def reserved_delta(*, eps: float, delta: float, sparse_columns: int) -> float:
    """The delta the run's accountant leaves to the thresholding: e^eps delta_thr = delta/10
    when a level list is estimated, else 0."""
    return DELTA_SHARE * delta if sparse_columns else 0.0


def histograms(columns: Sequence[PendingColumn]) -> list[tuple[tuple[Any, ...], np.ndarray]]:
    """The exact histogram of each column's cells: ``(keys, counts)``, one record adding 1 to
    exactly one count per column (two in a private type's, :func:`weight`: its kind
    ``missing`` / ``numeric`` / ``text``, then its bin or value).  Numeric columns: every key of :func:`bin_keys` (fixed,
    counts may be 0); level columns: ``"missing"`` then the values held, sorted (data-dependent
    keys); indicator-only columns: ``"missing"``."""
    out: list[tuple[tuple[Any, ...], np.ndarray]] = []
    for col in columns:
        if col.kind == "bounds":
            out.append((tuple(range(N_KEYS)), np.bincount(bin_keys(col.values), minlength=N_KEYS).astype(np.float64)))
        elif col.kind == "type":
            missing, finite, text = _kinds(col.values)
            keys = sorted_levels(np.asarray(text, dtype=object))
            index = {k: i for i, k in enumerate(keys)}
            kinds = np.array([missing.sum(), len(finite), len(text)], dtype=np.float64)
            bins = np.bincount(bin_keys(finite), minlength=N_KEYS).astype(np.float64)
            counts = np.bincount([index[t] for t in text], minlength=len(keys)).astype(np.float64)
            out.append(((*TYPE_KEYS, *(("bin", k) for k in range(N_KEYS)), *keys), np.concatenate([kinds, bins, counts])))
        elif col.kind == "levels":
            present = [t for t in col.values if t is not None]
            keys = sorted_levels(np.asarray(present, dtype=object))
            index = {k: i for i, k in enumerate(keys)}
            counts = np.bincount([index[t] for t in present], minlength=len(keys)).astype(np.float64)
            out.append((("missing", *keys), np.concatenate([[len(col.values) - len(present)], counts])))
        else:
            out.append((("missing",), np.array([float(np.sum(col.values))])))
    return out


def noisy_histograms(columns: Sequence[PendingColumn], std: float, source: NoiseSource) -> list[tuple[tuple[Any, ...], np.ndarray]]:
    """:func:`histograms` with N(0, std^2) added to every count (the mechanism; nothing is
    released before :func:`post_process` thresholds it)."""
    return [(keys, counts + _noise(len(counts), std, source)) for keys, counts in histograms(columns)]


def post_process(columns: Sequence[PendingColumn], noisy: Sequence[tuple[tuple[Any, ...], np.ndarray]], tau: float,
                 extend: float | None = None) -> dict[str, Any]:
    """What is released from the noisy histograms: bounds (:func:`bounds_from_counts`, tails
    widened through adjacent bins reaching ``extend``), the values whose noisy count reaches
    ``tau`` (in :func:`sorted_levels` order), and the indicator columns whose noisy missing
    count reaches ``tau``."""
    bounds: dict[str, tuple[float, float]] = {}
    levels: dict[str, tuple[str, ...]] = {}
    indicators: list[str] = []
    types: dict[str, str] = {}
    for col, (keys, counts) in zip(columns, noisy):
        if col.kind == "type":
            n = len(TYPE_KEYS) + N_KEYS
            # the rest of the text cells is the difference of two noisy counts: noise std sqrt(2) s
            kind, lv = decide_type(counts[:3], keys[n:], counts[n:], tau, None if extend is None else math.sqrt(2) * extend)
            types[col.name] = kind
            missing = float(counts[0])
            if kind == "numeric":
                bounds[col.name] = bounds_from_counts(counts[3:n], tau, extend=extend)
                missing += float(counts[2])  # its text cells are read as missing
            elif kind != "drop":
                levels[col.name] = lv
            if col.indicator and kind != "drop" and missing >= tau:
                indicators.append(col.name)
            continue
        if col.kind == "bounds":
            bounds[col.name] = bounds_from_counts(counts, tau, col.transform, extend=extend)
            missing = float(counts[MISSING])
        else:
            missing = float(counts[0])
            if col.kind == "levels":
                levels[col.name] = tuple(k for k, c in zip(keys[1:], counts[1:]) if c >= tau)
        if col.indicator and missing >= tau:
            indicators.append(col.name)
    return {"bounds": bounds, "levels": levels, "indicators": tuple(indicators), "types": types}


def estimate(columns: Sequence[PendingColumn], *, noise_multiplier: float, eps: float, delta: float,
             source: NoiseSource) -> Estimates:
    """The release (module docstring) of the given training cells, through the replay tape."""
    m = sum(weight(c) for c in columns)
    sparse = sum(1 for c in columns if c.kind in ("levels", "type"))
    std = noise_multiplier * math.sqrt(max(m, 1))
    tau = threshold(std, eps=eps, delta=delta, sparse_columns=sparse)
    reserve = reserved_delta(eps=eps, delta=delta, sparse_columns=sparse)

    def compute() -> Estimates:
        released = post_process(columns, noisy_histograms(columns, std, source), tau, extend=EXTEND_Z * std)
        return Estimates(bounds=released["bounds"], levels=released["levels"], indicators=released["indicators"],
                         types=released["types"],
                         noise_multiplier=float(noise_multiplier), columns=m, std=std, threshold=tau, reserved_delta=reserve)

    return releases.release("estimates", compute)


def _noise(n: int, std: float, source: NoiseSource) -> np.ndarray:
    return gaussian_noise((n,), std, source, dtype=torch.float64).cpu().numpy()


def estimate_table(data: Any, *, noise_multiplier: float, eps: float, delta: float, source: NoiseSource) -> Estimates:
    """The private values of a loaded ``dataset=table`` (``data.meta["pending"]``), estimated
    from its training split only (:func:`raco_cli.data.table.pending_values`)."""
    train = np.asarray(data.splits["train"])
    return estimate(pending_values(data, train), noise_multiplier=noise_multiplier, eps=eps, delta=delta, source=source)
