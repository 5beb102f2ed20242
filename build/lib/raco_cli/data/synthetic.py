"""A small generated dataset with a known group disparity (tests, smoke runs, tutorials).

Rows are drawn from a logistic model whose intercept depends on the group, so an
unconstrained classifier shows a demographic-parity gap that a constraint can close.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from raco_cli.data.tabular import ColumnSpec, build_tabular
from raco_cli.data.types import TabularData
from raco_cli.errors import ConfigError


def load(
    *,
    n: int = 4000,
    n_features: int = 8,
    n_groups: int = 2,
    n_classes: int = 2,
    seed: int = 0,
    split_seed: int = 0, split: str = "stratified",
    preprocessing: str = "empirical",
    bounds: Mapping[str, object] | None = None,
) -> TabularData:
    """Generate the synthetic table (deterministic in ``seed``).

    Raises:
        ConfigError: an option out of range (one line naming ``dataset.options.<key>``).
    """
    # upper bounds keep a typo from allocating gigabytes (n x n_features float64 cells)
    for key, value, low, high in (("n", n, 100, 10**7), ("n_features", n_features, 1, 10**4),
                                  ("n_groups", n_groups, 1, 1000), ("n_classes", n_classes, 2, 1000),
                                  ("seed", seed, 0, 2**32 - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(
                f"dataset.options.{key} must be an integer >= {low} (got dataset.options.{key}={value!r}); "
                "see conf/dataset/synthetic.yaml."
            )
        if value > high:
            raise ConfigError(
                f"dataset.options.{key} must be <= {high} (got dataset.options.{key}={value!r}); "
                "see conf/dataset/synthetic.yaml."
            )
    if n * n_features > 5 * 10**7:
        raise ConfigError(
            f"dataset.options.n x dataset.options.n_features must be <= 5e7 (got {n} x {n_features}); "
            "a larger synthetic table takes gigabytes. Lower one of them."
        )
    rng = np.random.default_rng(seed)
    group = rng.choice(n_groups, size=n, p=_group_shares(n_groups))
    Z = rng.normal(size=(n, n_features))
    Z[:, 0] += 0.8 * group  # a feature correlated with the group
    W = rng.normal(size=(n_features, n_classes))
    logits = Z @ W + 1.5 * (group[:, None] == 0) * np.eye(n_classes)[-1]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = np.array([rng.choice(n_classes, p=row) for row in p])
    names = [f"x{i}" for i in range(n_features)]
    df = pd.DataFrame(Z, columns=names)
    if preprocessing == "public" and not bounds:
        # the generating distribution is public: N(0, 1) (x0 shifted by at most 0.8)
        bounds = dict.fromkeys(names, [-5.0, 5.0])
    return build_tabular(
        "synthetic",
        df,
        y=y,
        group=group,
        columns=ColumnSpec(numeric=names),
        class_names=tuple(f"class{k}" for k in range(n_classes)),
        group_names=tuple(f"group{g}" for g in range(n_groups)),
        split_seed=split_seed,
        split=split,
        preprocessing=preprocessing,
        bounds=bounds,
        source=f"generated (seed={seed})",
    )


def _group_shares(n_groups: int) -> np.ndarray:
    w = np.arange(n_groups, 0, -1, dtype=float)  # a majority group and smaller minorities
    return w / w.sum()
