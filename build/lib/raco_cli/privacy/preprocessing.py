"""Differentially private standardisation of numeric features (``dataset.preprocessing=dp``).

The paper standardises every numeric column with the exact mean/std of the training part
(App. E.1), which the training epsilon does not cover.  Mapping each column onto [-1, 1] by
public bounds alone (``dataset.preprocessing=public``) is free but leaves the columns badly
scaled for a fixed number of noisy steps (Adult, eps = 1: about 0.007 test accuracy lost).
``dp`` keeps the public bounds and estimates the standardisation privately:

1. every numeric column is clipped to its public bounds and mapped onto [-1, 1] by the loader
   (no statistic of the data); write ``u = (x + 1) / 2 ∈ [0, 1]``;
2. one Gaussian release of the training sums ``S = Σ_i (u_i, u_i²) ∈ R^{2m}``: a record adds a
   vector of coordinates in [0, 1], so the L2 sensitivity under add/remove of one record is
   ``Δ = √(2m)``, and the noise is ``N(0, (σΔ)² I)`` — the Gaussian mechanism with noise
   multiplier σ, in the run's DpEvent tree as ``GaussianDpEvent(σ)``.  (Centring on the
   public midpoint shrinks Δ but also the second moment by the same factor: no gain.)
3. post-processing: ``mean = S₁ / n``, ``var = S₂ / n − mean²`` clamped below by the standard
   deviation of the noise on ``S₂ / n`` (a variance below that level cannot be told apart from
   the noise; the clamp keeps a near-constant column from being blown up), then every row of
   every split is standardised with them.

Precision: the noise on a mean is ``σ√(2m) / n`` in units of the public range.  A column
whose spread is small against its public bounds needs a smaller σ (Parkinsons: n = 3 745, 19
columns, ``dataset.dp_noise_multiplier: 5``) or tighter public bounds.

``n`` is the run's public training size: under ``privacy.scope=model`` the released DP count
(:mod:`raco_cli.privacy.size`), under ``scope=paper`` the exact number of training rows.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import dp_accounting as dpa
import numpy as np
import torch

from raco_cli.data.types import TabularData
from raco_cli.privacy import releases
from raco_cli.privacy.mechanisms import NoiseSource, gaussian_noise


def numeric_features(data: TabularData) -> int:
    """Number of leading columns of X that are publicly scaled numeric features (0 if none)."""
    count = data.meta.get("numeric_features", 0)
    return int(count) if data.preprocessing == "public" and isinstance(count, int) else 0


def standardization_event(noise_multiplier: float) -> dpa.DpEvent:
    """The DpEvent of the one release of :func:`dp_standardize`."""
    return dpa.GaussianDpEvent(noise_multiplier)


def sensitivity(m: int) -> float:
    """L2 sensitivity of ``Σ_i (u_i, u_i²)`` for ``u ∈ [0, 1]^m`` under add/remove.

    >>> sensitivity(8)
    4.0
    """
    return math.sqrt(2 * m)


def noisy_moments(u: np.ndarray, noise_multiplier: float, source: NoiseSource) -> np.ndarray:
    """``Σ_i (u_i, u_i²) + N(0, (σΔ)²)``, shape (2m,), for rows ``u`` (n, m) in [0, 1].

    >>> g = torch.Generator().manual_seed(0)
    >>> noisy_moments(np.full((4, 1), 0.5), 1e-9, g).round(6).tolist()
    [2.0, 1.0]
    """
    if u.size and (u.min() < 0.0 or u.max() > 1.0):  # the sensitivity bound needs it
        raise ValueError("dp standardisation needs publicly scaled values in [0, 1]")
    sums = np.concatenate([u.sum(axis=0), (u * u).sum(axis=0)]).astype(np.float64)
    std = noise_multiplier * sensitivity(u.shape[1])
    noise = gaussian_noise((sums.size,), std, source, dtype=torch.float64).cpu().numpy()
    return sums + noise


def moments_to_scaling(noisy: np.ndarray, n: float, noise_multiplier: float) -> tuple[np.ndarray, np.ndarray]:
    """Post-processing of the release: per-column (mean, std) of ``u``.

    >>> mean, std = moments_to_scaling(np.array([2.0, 2.0]), 4, 1e-9)
    >>> mean.tolist(), std.round(6).tolist()
    ([0.5], [0.5])
    """
    m = noisy.size // 2
    mean = np.clip(noisy[:m] / n, 0.0, 1.0)
    var_floor = noise_multiplier * sensitivity(m) / n  # std of the noise on S2 / n
    var = np.maximum(noisy[m:] / n - mean * mean, max(var_floor, 1e-12))
    return mean, np.sqrt(var)


def dp_scaling(data: TabularData, *, noise_multiplier: float, source: NoiseSource,
               size: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The release of :func:`dp_standardize` and its post-processing: per-column (mean, std)
    of ``u = (x + 1) / 2`` for the first :func:`numeric_features` columns (module docstring).

    Batched training (docs/batched.md) keeps one public X for the group and applies each
    run's scaling to the rows it gathers (:func:`standardize_columns`), so R runs never hold
    R copies of the features.  ``size``: the run's public training size (None: the exact n)."""
    m = numeric_features(data)
    train = np.asarray(data.splits["train"])
    train_u = unit_columns(np.asarray(data.rows(train))[:, :m])
    noisy = releases.release("preprocessing", lambda: noisy_moments(train_u, noise_multiplier, source))
    return moments_to_scaling(np.asarray(noisy), len(train) if size is None else size, noise_multiplier)


def unit_columns(x: np.ndarray) -> np.ndarray:
    """``u = (x + 1) / 2`` of publicly scaled columns, in float64, clipped to [0, 1] (the
    float32 rounding of the public map can step past its edges)."""
    return np.clip((np.asarray(x, dtype=np.float32).astype(np.float64) + 1.0) / 2.0, 0.0, 1.0)


def standardize_columns(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """The publicly scaled columns ``x`` (..., m) in [-1, 1] standardised by (mean, std) of
    ``u = (x + 1) / 2``, computed in float64 and rounded to float32 (bit for bit what
    :func:`dp_standardize` writes into X).

    >>> standardize_columns(np.array([[0.0]], dtype=np.float32), np.array([0.25]), np.array([0.5])).tolist()
    [[0.5]]
    """
    return ((unit_columns(x) - mean) / std).astype(np.float32)


def scale_rows(X: np.ndarray, mean: np.ndarray, std: np.ndarray, missing: np.ndarray | None = None) -> np.ndarray:
    """A float32 copy of ``X`` whose first ``m = len(mean)`` columns (publicly scaled) are
    standardised (:func:`standardize_columns`): the same arithmetic at training time and in
    ``raco predict`` (:mod:`raco_cli.predictor`), so predictions reproduce bit for bit.
    Cells flagged in ``missing`` (n, m) (``dataset=table``: a missing value, encoded at the
    public midpoint) are set to 0, the DP mean.

    >>> scale_rows(np.array([[0.0, 5.0], [0.0, 1.0]]), np.array([0.25]), np.array([0.5]),
    ...            np.array([[False], [True]])).tolist()
    [[0.5, 5.0], [0.0, 1.0]]
    """
    m = len(mean)
    out = np.array(X, dtype=np.float32, copy=True)
    scaled = standardize_columns(out[:, :m], mean, std)
    if missing is not None:
        scaled[np.asarray(missing, dtype=bool)] = 0.0
    out[:, :m] = scaled
    return out


def dp_standardize(data: TabularData, *, noise_multiplier: float, source: NoiseSource, size: float | None = None) -> TabularData:
    """``data`` with its publicly scaled numeric columns standardised by DP estimates
    (module docstring); the release goes through :func:`raco_cli.privacy.releases.release`."""
    m = numeric_features(data)
    if m == 0:
        return data
    mean, std = dp_scaling(data, noise_multiplier=noise_multiplier, source=source, size=size)
    return apply_scaling(data, mean, std)


def apply_scaling(data: TabularData, mean: np.ndarray, std: np.ndarray) -> TabularData:
    """``data`` with the first ``len(mean)`` columns standardised (:func:`scale_rows`)."""
    m = len(mean)
    X = scale_rows(np.asarray(data.X), mean, std, data.meta.get("numeric_missing"))  # type: ignore[arg-type]
    # the scaling of the public encoding x in [-1, 1]: standardised = ((x + 1) / 2 - mean) / std
    scaling: dict[str, Any] = {
        name: {"mean": float(a), "std": float(s)} for name, a, s in zip(data.feature_names[:m], mean, std)
    }
    return replace(data, X=X, meta={**data.meta, "preprocessing": "dp", "dp_scaling": scaling})
