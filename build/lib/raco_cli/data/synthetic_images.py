"""Generated face-like images with a group disparity (tests, smoke runs, benchmarks of the
image path without the CelebA files).

Each row is a (3, S, S) float32 image of Gaussian noise; label 1 ("smiling") draws a bright
horizontal bar in the lower half, group 1 tints channel 0.  Labels depend on the group
(P(y=1 | g=0) = 0.6, P(y=1 | g=1) = 0.35), so an unconstrained classifier has a
demographic-parity gap that a constraint can close.  With ``lazy=true`` (default) the images
are generated per requested row from ``(seed, row)``, like a streaming image store: the
training loop then takes its lazy-store path (``data.rows(idx)`` per batch), as for CelebA.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from raco_cli.data.tabular import stratified_split
from raco_cli.data.types import FeatureStore, TabularData
from raco_cli.errors import ConfigError


class SyntheticImageStore:
    """Row-indexable images of shape (3, size, size), generated deterministically per row."""

    def __init__(self, y: np.ndarray, group: np.ndarray, show: np.ndarray, size: int, seed: int) -> None:
        self._y, self._group, self._show = y, group, show
        self._size, self._seed = int(size), int(seed)
        self.shape = (len(y), 3, self._size, self._size)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        rows = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        S = self._size
        out = np.empty((len(rows), 3, S, S), dtype=np.float32)
        lo, hi = int(0.6 * S), max(int(0.6 * S) + 1, int(0.75 * S))
        for j, i in enumerate(rows):
            img = 0.5 * np.random.default_rng((self._seed, int(i))).standard_normal((3, S, S), dtype=np.float32)
            if self._show[i]:
                img[:, lo:hi, S // 4 : 3 * S // 4] += 1.0
            if self._group[i] == 1:
                img[0] += 0.8
            out[j] = img
        return out


def load(*, n: int = 600, size: int = 32, lazy: bool = True, seed: int = 0, split_seed: int = 0) -> TabularData:
    """Generate the dataset (deterministic in ``seed``); shared split protocol (25 % test,
    15 % of the rest validation, stratified by label x group).

    Raises:
        ConfigError: an option out of range (one line naming ``dataset.options.<key>``).
    """
    for key, value, low, high in (("n", n, 40, 10**6), ("size", size, 8, 512), ("seed", seed, 0, 2**32 - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(
                f"dataset.options.{key} must be an integer in [{low}, {high}] (got dataset.options.{key}={value!r}); "
                "see conf/dataset/synthetic_images.yaml."
            )
    if not isinstance(lazy, bool):
        raise ConfigError(f"dataset.options.lazy must be true or false (got dataset.options.lazy={lazy!r}).")
    rng = np.random.default_rng(seed)
    group = (rng.random(n) < 0.45).astype(np.int64)
    y = (rng.random(n) < np.where(group == 0, 0.6, 0.35)).astype(np.int64)
    show = np.where(rng.random(n) < 0.9, y, 1 - y).astype(bool)  # 10 % label noise
    store = SyntheticImageStore(y, group, show, size, seed)
    X = cast(FeatureStore, store if lazy else store[np.arange(n)])
    return TabularData(
        name="synthetic_images",
        X=X,
        y=y,
        group=group,
        feature_names=(f"image[3x{size}x{size}]",),
        class_names=("not_smiling", "smiling"),
        group_names=("female", "male"),
        splits=stratified_split(y, group, seed=split_seed),
        source=f"generated (seed={seed}, size={size})",
    )
