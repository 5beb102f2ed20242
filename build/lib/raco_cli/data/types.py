"""The one typed dataset object every loader returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from raco_cli.errors import DataIntegrityError

SPLITS = ("train", "val", "test")
TASKS = ("classification", "regression")


class FeatureStore(Protocol):
    """Row-indexable features: a numpy array, or a lazy store (e.g. images on disk)."""

    shape: tuple[int, ...]

    def __getitem__(self, idx: np.ndarray) -> np.ndarray: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class TabularData:
    """Features, labels, sensitive groups and split indices of one dataset.

    Attributes:
        name: registry key of the dataset.
        X: features, shape (n, d) float32 (or a lazy :class:`FeatureStore` for images).
        y: labels in ``0..n_classes-1``, shape (n,) int64.
        group: sensitive-attribute index in ``0..n_groups-1``, shape (n,) int64.
        feature_names: one name per column of X (``d`` names; image stores name their shape).
        class_names: name of each label value.
        group_names: name of each sensitive group.
        splits: row indices of ``train``, ``val`` and ``test`` (disjoint, sorted).
        source: where the raw files were read from (for logs and ``raco data info``).
        target: real-valued labels, shape (n,) float64, for ``task=regression`` (None for
            classification).  A regression table has one "class" (``class_names`` of length
            1, the single model output) and ``y`` all zeros, so splitting and the group
            machinery work unchanged; the squared loss and the metrics read ``target``.
    """

    name: str
    X: FeatureStore
    y: np.ndarray
    group: np.ndarray
    feature_names: tuple[str, ...]
    class_names: tuple[str, ...]
    group_names: tuple[str, ...]
    splits: Mapping[str, np.ndarray]
    source: str = ""
    meta: Mapping[str, object] = field(default_factory=dict)
    target: np.ndarray | None = None

    @property
    def task(self) -> str:
        """``regression`` when the table has a real-valued ``target``, else ``classification``."""
        return "classification" if self.target is None else "regression"

    @property
    def preprocessing(self) -> str:
        """How numeric features were scaled: ``public`` bounds or ``empirical`` statistics
        (images and generated data: ``none``)."""
        return str(self.meta.get("preprocessing", "none"))

    def __post_init__(self) -> None:
        n = len(self.y)
        if len(self.X) != n or len(self.group) != n:
            raise DataIntegrityError(
                f"Dataset '{self.name}': X has {len(self.X)} rows, y {n}, group {len(self.group)};"
                " all must be equal."
            )
        if n == 0:
            raise DataIntegrityError(f"Dataset '{self.name}' has no rows.")
        for arr, what, k in ((self.y, "label", self.n_classes), (self.group, "group", self.n_groups)):
            if arr.min() < 0 or arr.max() >= k:
                raise DataIntegrityError(
                    f"Dataset '{self.name}': {what} values must lie in 0..{k - 1} "
                    f"(got {arr.min()}..{arr.max()})."
                )
        if self.target is not None:
            if self.target.shape != (n,) or not np.isfinite(self.target).all():
                raise DataIntegrityError(
                    f"Dataset '{self.name}': target must be {n} finite real values (got shape {self.target.shape})."
                )
            if self.n_classes != 1:
                raise DataIntegrityError(
                    f"Dataset '{self.name}': a regression table has one output (class_names of length 1, got {self.n_classes})."
                )
        if set(self.splits) != set(SPLITS):
            raise DataIntegrityError(
                f"Dataset '{self.name}': splits must be {SPLITS} (got {tuple(self.splits)})."
            )
        seen = np.concatenate([np.asarray(self.splits[s]) for s in SPLITS])
        if len(np.unique(seen)) != len(seen):
            raise DataIntegrityError(f"Dataset '{self.name}': splits overlap.")
        for s in SPLITS:
            if len(self.splits[s]) == 0:
                raise DataIntegrityError(f"Dataset '{self.name}': split '{s}' is empty.")

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def n_groups(self) -> int:
        return len(self.group_names)

    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example (``(d,)`` for tables, ``(C, H, W)`` for images)."""
        return tuple(self.X.shape[1:])

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Features of the given rows (materialises lazily stored examples)."""
        return np.asarray(self.X[idx])

    def group_sizes(self, split: str) -> dict[str, int]:
        """Number of rows of each sensitive group in a split."""
        counts = np.bincount(self.group[self.splits[split]], minlength=self.n_groups)
        return {name: int(c) for name, c in zip(self.group_names, counts)}

    def label_counts(self, split: str) -> dict[str, int]:
        """Number of rows of each class in a split."""
        counts = np.bincount(self.y[self.splits[split]], minlength=self.n_classes)
        return {name: int(c) for name, c in zip(self.class_names, counts)}

    def subset(self, n_max: int, seed: int = 0) -> TabularData:
        """A copy that keeps at most ``n_max`` rows of each split (for smoke runs and tests).

        Rows are drawn uniformly without replacement within each split; features are
        not re-fitted (they were fitted on the full training part).
        """
        rng = np.random.default_rng(seed)
        keep = {
            s: np.sort(rng.choice(ix, size=min(n_max, len(ix)), replace=False))
            for s, ix in self.splits.items()
        }
        allrows = np.concatenate([keep[s] for s in SPLITS])
        order = np.argsort(allrows)
        allrows = allrows[order]
        remap = {old: new for new, old in enumerate(allrows)}
        new_splits = {s: np.array([remap[i] for i in keep[s]], dtype=np.int64) for s in SPLITS}
        X = self.X[allrows] if isinstance(self.X, np.ndarray) else _SubStore(self.X, allrows)
        return TabularData(
            name=self.name,
            X=X,
            y=self.y[allrows],
            group=self.group[allrows],
            feature_names=self.feature_names,
            class_names=self.class_names,
            group_names=self.group_names,
            splits=new_splits,
            source=self.source,
            # per-row arrays in meta (e.g. dataset=table's missing-value masks) follow the rows
            meta={**{k: v[allrows] if isinstance(v, np.ndarray) and _per_row(v, len(self.y)) else v
                     for k, v in self.meta.items()}, "subset": n_max},
            target=None if self.target is None else self.target[allrows],
        )


def _per_row(value: np.ndarray, n: int) -> bool:
    return value.ndim >= 1 and value.shape[0] == n


class _SubStore:
    """A row subset of a lazy feature store."""

    def __init__(self, base: FeatureStore, rows: np.ndarray) -> None:
        self._base, self._rows = base, rows
        self.shape = (len(rows), *base.shape[1:])

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        return self._base[self._rows[idx]]

    def __len__(self) -> int:
        return len(self._rows)
