"""The OLS group mixture of the DPSE paper (``papers/dpse-privacy-budget-tailoring.txt``, Section 6).

For each group k in 1..K and each of its rows i (paper, "Setup for Synthetic Experiments")::

    x_ki ~ N(0, I_P),    Y_ki = x_ki^T beta_k + N(0, sigma_k^2)

The paper states the model, K, the group sizes of its experiments (largest 10 000, smallest
500 for Tables 1-3; size ratios 5x-50x for Figure 2), the slopes of Figure 2 and sigma = 1, but
not the feature distribution, P or the slopes of Tables 1-3; ours are stated in
``conf/experiment/dpse_*.yaml`` and docs/dpse.md.

* ``sizes``: training rows per group, or ``null`` for geometric sizes from ``largest`` down to
  ``largest / ratio`` (``n_k = largest * ratio^(-(k-1)/(K-1))``, rounded).
* ``slopes``: one per group; a number b means ``beta_k = b * 1_P`` (the scalar slope when P = 1),
  a list of P numbers is ``beta_k`` itself.
* ``noise``: sigma_k, one number for every group or one per group.
* ``eval_size``: validation and test rows per group, drawn fresh from the same model (the test
  MSPE estimates the population mean squared prediction error of each group).

The features are used as generated: their distribution is public and the paper standardises
nothing, so ``dataset.preprocessing`` has no effect here (no release).  The label is the
real-valued ``target`` (``task=regression``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raco_cli.data.types import TabularData
from raco_cli.errors import ConfigError

MAX_ROWS = 10**7
SEE = "see conf/dataset/group_mixture.yaml"


def _int(key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"dataset.options.{key} must be an integer in [{low}, {high}] (got dataset.options.{key}={value!r}); {SEE}.")
    return value


def _number(key: str, value: Any, *, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
    if not ok or (positive and value <= 0):
        need = "a positive finite number" if positive else "a finite number"
        raise ConfigError(f"dataset.options.{key} must be {need} (got dataset.options.{key}={value!r}); {SEE}.")
    return float(value)


def group_sizes(K: int, largest: int, ratio: float) -> list[int]:
    """Geometric sizes from ``largest`` down to ``largest / ratio``.

    >>> group_sizes(5, 10000, 20)
    [10000, 4729, 2236, 1057, 500]
    >>> group_sizes(2, 10000, 50)
    [10000, 200]
    """
    if K == 1:
        return [largest]
    return [max(1, round(largest * ratio ** (-k / (K - 1)))) for k in range(K)]


def _per_group(key: str, value: Any, K: int) -> list[Any]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != K:
            raise ConfigError(f"dataset.options.{key} must have one entry per group (K={K}, got {len(value)}: {list(value)!r}); {SEE}.")
        return list(value)
    return [value] * K


def _slopes(raw: Any, K: int, P: int) -> np.ndarray:
    if raw is None:
        raise ConfigError(f"dataset.options.slopes must list one slope per group (got null); {SEE}.")
    out = np.zeros((K, P))
    for k, b in enumerate(_per_group("slopes", raw, K)):
        if isinstance(b, Sequence) and not isinstance(b, str):
            if len(b) != P:
                raise ConfigError(f"dataset.options.slopes[{k}] must have P={P} entries (got {list(b)!r}); {SEE}.")
            out[k] = [_number(f"slopes[{k}]", v) for v in b]
        else:
            out[k] = _number(f"slopes[{k}]", b)
    return out


def load(
    *,
    K: int = 2,
    sizes: Sequence[int] | None = None,
    largest: int = 10000,
    ratio: float = 20.0,
    slopes: Sequence[Any] | None = (-10.0, 10.0),
    noise: Any = 1.0,
    P: int = 1,
    eval_size: int = 2000,
    seed: int = 0,
    split_seed: int = 0,
) -> TabularData:
    """Draw the mixture (deterministic in ``seed``; ``split_seed`` is unused: the validation
    and test rows are fresh draws, not a split of the training rows).

    Raises:
        ConfigError: an option out of range (one line naming ``dataset.options.<key>``).
    """
    K = _int("K", K, 1, 1000)
    P = _int("P", P, 1, 10**4)
    eval_size = _int("eval_size", eval_size, 1, MAX_ROWS)
    seed = _int("seed", seed, 0, 2**32 - 1)
    if sizes is None:
        _int("largest", largest, 1, MAX_ROWS)
        if _number("ratio", ratio, positive=True) < 1:
            raise ConfigError(f"dataset.options.ratio must be >= 1 (got dataset.options.ratio={ratio!r}): largest / smallest group; {SEE}.")
        n_train = group_sizes(K, largest, float(ratio))
    else:
        n_train = [_int(f"sizes[{k}]", v, 1, MAX_ROWS) for k, v in enumerate(_per_group("sizes", sizes, K))]
    beta = _slopes(slopes, K, P)
    sigma = np.array([_number(f"noise[{k}]", v, positive=True) for k, v in enumerate(_per_group("noise", noise, K))])
    total = sum(n_train) + 2 * K * eval_size
    if total * P > 5 * 10**7:
        raise ConfigError(f"dataset.options: {total} rows x P={P} is more than 5e7 cells; lower sizes, eval_size or P ({SEE}).")

    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {"X": [], "t": [], "g": [], "split": []}
    for split_id, per_group in enumerate((n_train, [eval_size] * K, [eval_size] * K)):  # train, val, test
        for k, n_k in enumerate(per_group):
            X = rng.standard_normal((n_k, P))
            parts["X"].append(X)
            parts["t"].append(X @ beta[k] + sigma[k] * rng.standard_normal(n_k))
            parts["g"].append(np.full(n_k, k, dtype=np.int64))
            parts["split"].append(np.full(n_k, split_id))
    split = np.concatenate(parts["split"])
    n = len(split)
    return TabularData(
        name="group_mixture",
        X=np.concatenate(parts["X"]).astype(np.float32),
        y=np.zeros(n, dtype=np.int64),
        group=np.concatenate(parts["g"]),
        feature_names=tuple(f"x{j}" for j in range(P)),
        class_names=("target",),
        group_names=tuple(f"group{k + 1}" for k in range(K)),
        splits={name: np.flatnonzero(split == i) for i, name in enumerate(("train", "val", "test"))},
        source=f"generated OLS group mixture (seed={seed})",
        meta={"preprocessing": "none", "slopes": beta.tolist(), "noise": sigma.tolist(), "train_sizes": n_train},
        target=np.concatenate(parts["t"]).astype(np.float64),
    )
