"""Split protocol and preprocessing shared by every tabular dataset (paper Section 6, App. E.1).

1. Split: 25 % test, then 15 % of the rest validation, stratified by label x group, with a
   fixed split seed (the same rows every run, whatever the training seed).
2. Preprocess: numeric columns standardised with the mean/std of the *training part only*;
   categorical columns one-hot encoded over a fixed vocabulary (the public schema of the
   dataset when known, else the values seen in the training part; unseen values map to
   all-zero columns).

Standardisation statistics are computed without privacy, as in the paper and in DP-FERMI;
the documentation says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

from raco_cli.data.types import TabularData
from raco_cli.errors import DataIntegrityError

TEST_FRACTION = 0.25
VAL_FRACTION = 0.15


@dataclass(frozen=True)
class ColumnSpec:
    """How the feature columns of a table are encoded.

    Attributes:
        numeric: columns standardised with train mean/std.
        categorical: column -> vocabulary (ordered category values). ``None`` means the
            vocabulary is the sorted set of values seen in the training part.
        passthrough: numeric columns used as they are (already scaled, e.g. 0/1 flags).
    """

    numeric: Sequence[str] = ()
    categorical: Mapping[str, Sequence[object] | None] = field(default_factory=dict)
    passthrough: Sequence[str] = ()


def stratified_split(
    y: np.ndarray,
    group: np.ndarray,
    *,
    seed: int,
    test_fraction: float = TEST_FRACTION,
    val_fraction: float = VAL_FRACTION,
) -> dict[str, np.ndarray]:
    """Split row indices into train/val/test, stratified by the (label, group) cell.

    Cells too small to stratify (fewer than 2 rows) are merged into one stratum.

    Returns:
        ``{"train", "val", "test"}`` -> sorted int64 index arrays.
    """
    n = len(y)
    idx = np.arange(n)
    strata = _strata(y, group)
    rest, test = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=strata)
    train, val = train_test_split(
        rest, test_size=val_fraction, random_state=seed, stratify=_strata(y[rest], group[rest])
    )
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def _strata(y: np.ndarray, group: np.ndarray) -> np.ndarray:
    cells = y.astype(np.int64) * (int(group.max()) + 1) + group.astype(np.int64)
    values, counts = np.unique(cells, return_counts=True)
    rare = set(values[counts < 4].tolist())
    if rare:
        cells = np.where(np.isin(cells, list(rare)), -1, cells)
        if np.sum(cells == -1) < 4:  # still too small: fall back to label-only strata
            cells = np.where(cells == -1, y, cells)
    return cells


def encode_features(
    df: pd.DataFrame, columns: ColumnSpec, train_rows: np.ndarray
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Encode feature columns, fitting every statistic on ``train_rows`` only.

    Returns:
        X of shape (n, d) float32 and the d feature names.
    """
    blocks: list[np.ndarray] = []
    names: list[str] = []
    train = df.iloc[train_rows]
    for col in columns.numeric:
        values = pd.to_numeric(df[col], errors="raise").to_numpy(dtype=np.float64)
        mean = float(train[col].astype(np.float64).mean())
        std = float(train[col].astype(np.float64).std(ddof=0))
        blocks.append(((values - mean) / (std if std > 0 else 1.0))[:, None])
        names.append(col)
    for col in columns.passthrough:
        blocks.append(pd.to_numeric(df[col], errors="raise").to_numpy(dtype=np.float64)[:, None])
        names.append(col)
    for col, vocab in columns.categorical.items():
        cats = list(vocab) if vocab is not None else sorted(train[col].unique().tolist())
        values = df[col].to_numpy()
        onehot = np.stack([values == c for c in cats], axis=1).astype(np.float64)
        blocks.append(onehot)
        names.extend(f"{col}={c}" for c in cats)
    if not blocks:
        raise DataIntegrityError("No feature columns configured.")
    X = np.concatenate(blocks, axis=1).astype(np.float32)
    if not np.isfinite(X).all():
        raise DataIntegrityError("Non-finite feature values after preprocessing.")
    return X, tuple(names)


def build_tabular(
    name: str,
    df: pd.DataFrame,
    *,
    y: np.ndarray,
    group: np.ndarray,
    columns: ColumnSpec,
    class_names: Sequence[str],
    group_names: Sequence[str],
    split_seed: int,
    source: str,
    meta: Mapping[str, object] | None = None,
    splits: Mapping[str, np.ndarray] | None = None,
) -> TabularData:
    """Split, encode and wrap a cleaned table into :class:`TabularData`.

    ``splits`` overrides the shared stratified split (a loader whose label depends on the
    training part computes the split first, see ``parkinsons``).
    """
    y = np.asarray(y, dtype=np.int64)
    group = np.asarray(group, dtype=np.int64)
    if splits is None:
        splits = stratified_split(y, group, seed=split_seed)
    X, feature_names = encode_features(df.reset_index(drop=True), columns, splits["train"])
    return TabularData(
        name=name,
        X=X,
        y=y,
        group=group,
        feature_names=feature_names,
        class_names=tuple(class_names),
        group_names=tuple(group_names),
        splits=splits,
        source=source,
        meta=dict(meta or {}),
    )


def require_columns(df: pd.DataFrame, required: Sequence[str], *, dataset: str, path: str) -> None:
    """Fail with one line when a table lacks expected columns (wrong or truncated file)."""
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataIntegrityError(
            f"{path} is not a valid '{dataset}' file: missing columns {missing}. "
            f"Delete it and fetch it again with: make data DATASET={dataset}"
        )
