"""Label- or group-imbalanced variants of any dataset (``dataset.imbalance``).

* ``label_ratio: r``: in the training pool (train and validation splits) the rows of label 1
  are subsampled so that they are a fraction r of it (the -ST constructions' ``imratio``);
* ``group_ratio: r``: the same for the rows of sensitive group ``minority_group`` (default 1).

The test split keeps the dataset's own distribution, so worst-group and per-class accuracy
measure how the minority fares.  Rows are drawn without replacement with ``dataset.split_seed``;
which rows are dropped depends only on labels and groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from raco_cli.data.types import SPLITS, TabularData
from raco_cli.errors import ConfigError

KEYS = ("label_ratio", "group_ratio", "minority_group")


def check(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``dataset.imbalance`` (one line per problem)."""
    out = {"label_ratio": None, "group_ratio": None, "minority_group": 1}
    for key, value in spec.items():
        if key not in KEYS:
            raise ConfigError(f"Unknown key dataset.imbalance.{key}. Allowed: {', '.join('dataset.imbalance.' + k for k in KEYS)}.")
        out[key] = value
    for key in ("label_ratio", "group_ratio"):
        v = out[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1):
            raise ConfigError(f"dataset.imbalance.{key} must be null or in (0, 1) (got dataset.imbalance.{key}={v!r}); "
                              "the fraction of the training pool kept for the minority.")
    g = out["minority_group"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 0:
        raise ConfigError(f"dataset.imbalance.minority_group must be a group index >= 0 (got dataset.imbalance.minority_group={g!r}).")
    return out


def _subsample(mask: np.ndarray, rows: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    minority, majority = rows[mask[rows]], rows[~mask[rows]]
    k = min(len(minority), int(round(ratio * len(majority) / (1.0 - ratio))))
    return np.sort(np.concatenate([majority, rng.choice(minority, size=k, replace=False)]))


def imbalanced(data: TabularData, spec: Mapping[str, Any], *, seed: int = 0) -> TabularData:
    """``data`` with the training and validation splits subsampled as ``spec`` says.

    >>> from raco_cli.data import synthetic
    >>> d = imbalanced(synthetic.load(n=2000, seed=0), {"label_ratio": 0.1})
    >>> round(float(d.y[d.splits["train"]].mean()), 2)
    0.1
    """
    o = check(spec)
    if o["label_ratio"] is None and o["group_ratio"] is None:
        return data
    if o["group_ratio"] is not None and o["minority_group"] >= data.n_groups:
        raise ConfigError(f"dataset.imbalance.minority_group={o['minority_group']} is not a group of '{data.name}' "
                          f"(groups: {', '.join(data.group_names)}).")
    rng = np.random.default_rng(seed)
    splits = {s: np.asarray(data.splits[s]) for s in SPLITS}
    for split in ("train", "val"):
        rows = splits[split]
        if o["label_ratio"] is not None:
            rows = _subsample(data.y == 1, rows, o["label_ratio"], rng)
        if o["group_ratio"] is not None:
            rows = _subsample(data.group == o["minority_group"], rows, o["group_ratio"], rng)
        splits[split] = rows
    from dataclasses import replace

    return replace(data, splits=splits, meta={**data.meta, "imbalance": {k: v for k, v in o.items() if v is not None}})
