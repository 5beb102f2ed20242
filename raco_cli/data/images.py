"""What the image datasets share: a uint8 pixel store, the -ST imbalanced constructions of
the DP-DRO paper (Section 5.1), and the split of datasets with an official test set.

* MNIST-ST (and the same construction for Fashion-MNIST and scikit-learn's digits): a binary
  task, classes 0-4 -> label 0 and 5-9 -> label 1; in the training pool (train + validation)
  the positives are subsampled so that they are a fraction ``imratio`` of it; the test split is
  balanced (imratio = 0.5: the larger class subsampled to the size of the smaller).
  The sensitive group of every row is its original class, so ``worst_group_accuracy`` is the
  worst accuracy over the ten original classes.
* CIFAR10-ST: of the first five classes only the *last* 100 training images of each are
  kept (in file order); the other classes and the test set are unchanged.

Validation rows are 15 % of the training pool, stratified by label x group (the shared
protocol's fraction); the official test set is the test split.  Every subsample is seeded by
``dataset.split_seed``, and only labels decide which rows are kept (never features).
"""

from __future__ import annotations

import numpy as np

from raco_cli.data.tabular import VAL_FRACTION, hash_uniforms, label_group_strata, word_hashes
from raco_cli.errors import ConfigError

ST_CLASS_NAMES = ("0-4", "5-9")


class PixelStore:
    """uint8 pixels (n, C, H, W) read as float32 in [0, 1] per requested row (``x / scale``):
    a quarter of the memory of float32 features (CIFAR-10: 184 MB instead of 737 MB)."""

    def __init__(self, pixels: np.ndarray, scale: float = 255.0) -> None:
        self.pixels, self.scale = pixels, float(scale)
        self.shape: tuple[int, ...] = tuple(pixels.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        return self.pixels[idx].astype(np.float32) / np.float32(self.scale)


def check_st_options(st: object, imratio: object, *, dataset: str, verify_checksums: object = True) -> float:
    """Validate ``dataset.options.st`` / ``imratio`` / ``verify_checksums`` (one line each)."""
    if not isinstance(verify_checksums, bool):
        raise ConfigError(f"dataset.options.verify_checksums must be true or false (got dataset.options.verify_checksums={verify_checksums!r}).")
    if not isinstance(st, bool):
        raise ConfigError(f"dataset.options.st must be true or false (got dataset.options.st={st!r}); "
                          f"the imbalanced -ST construction (conf/dataset/{dataset}.yaml).")
    if isinstance(imratio, bool) or not isinstance(imratio, (int, float)) or not 0 < imratio <= 0.5:
        raise ConfigError(f"dataset.options.imratio must be in (0, 0.5] (got dataset.options.imratio={imratio!r}); "
                          "the fraction of positives (classes 5-9) kept in the training pool.")
    return float(imratio)


def subsample_positives(y: np.ndarray, rows: np.ndarray, imratio: float, rng: np.random.Generator) -> np.ndarray:
    """Rows of ``rows`` kept so that positives (y = 1) are a fraction ``imratio`` of them (all
    negatives kept; positives drawn without replacement).

    >>> y = np.array([0] * 90 + [1] * 60)
    >>> kept = subsample_positives(y, np.arange(150), 0.1, np.random.default_rng(0))
    >>> int((y[kept] == 1).sum()), len(kept)
    (10, 100)
    """
    neg, pos = rows[y[rows] == 0], rows[y[rows] == 1]
    k = min(len(pos), int(round(imratio * len(neg) / (1.0 - imratio))))
    return np.sort(np.concatenate([neg, rng.choice(pos, size=k, replace=False)]))


def balance(y: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows of ``rows`` with the larger class subsampled to the smaller's size (imratio 0.5)."""
    neg, pos = rows[y[rows] == 0], rows[y[rows] == 1]
    m = min(len(neg), len(pos))
    return np.sort(np.concatenate([rng.choice(neg, size=m, replace=False), rng.choice(pos, size=m, replace=False)]))


def last_per_class(y: np.ndarray, rows: np.ndarray, classes: range, keep: int) -> np.ndarray:
    """CIFAR10-ST: of ``classes`` keep only the last ``keep`` rows (in ``rows`` order).

    >>> last_per_class(np.array([0, 1, 0, 0, 1]), np.arange(5), range(1), 2).tolist()
    [1, 2, 3, 4]
    """
    out = [rows[~np.isin(y[rows], list(classes))]]
    for c in classes:
        out.append(rows[y[rows] == c][-keep:])
    return np.sort(np.concatenate(out))


def pool_split(y: np.ndarray, group: np.ndarray, pool: np.ndarray, test: np.ndarray, *, seed: int) -> dict[str, np.ndarray]:
    """train / val (15 % of ``pool``, stratified by label x group) and the given test rows."""
    from sklearn.model_selection import train_test_split

    train, val = train_test_split(pool, test_size=VAL_FRACTION, random_state=seed, stratify=label_group_strata(y[pool], group[pool]))
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def record_pool_split(hashes: np.ndarray, pool: np.ndarray, test: np.ndarray) -> dict[str, np.ndarray]:
    """train / val of ``pool`` from each row's own hash (``dataset.split=record``: a row is
    validation when ``h / 2^64 < VAL_FRACTION``, whatever the other rows) and the given test rows
    (an official test set is a per-record partition already)."""
    u = hash_uniforms(np.asarray(hashes, dtype=np.uint64)[pool])
    return {"train": np.sort(pool[u >= VAL_FRACTION]), "val": np.sort(pool[u < VAL_FRACTION]), "test": np.sort(test)}


def pixel_hashes(pixels: np.ndarray, labels: np.ndarray, *, seed: int) -> np.ndarray:
    """A uint64 hash of every image's own pixels (uint8) and label, keyed by ``seed``: the
    record of an image dataset (``dataset.split=record``)."""
    flat = np.asarray(pixels, dtype=np.uint8).reshape(len(pixels), -1)
    padded = np.zeros((len(flat), -(-flat.shape[1] // 8) * 8 + 8), dtype=np.uint8)
    padded[:, : flat.shape[1]] = flat
    words = padded.view(np.uint64).copy()
    words[:, -1] = np.asarray(labels, dtype=np.int64).astype(np.uint64)  # the label's own word
    return word_hashes(words, seed=seed)


def refuse_record_split_of_st(dataset: str) -> None:
    """The -ST constructions subsample a class by the counts of the whole file: no record split."""
    raise ConfigError(f"dataset.split=record cannot split {dataset} with dataset.options.st=true: the -ST construction subsamples "
                      "a class by the counts of the whole file (the DP-DRO paper's benchmark), so one image moves others; use "
                      "privacy.scope=paper (dataset.split=auto: stratified) or st=false.")


def compact(pixels: np.ndarray, y: np.ndarray, group: np.ndarray, splits: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Keep only the rows of the splits (the -ST constructions drop rows), renumbered."""
    rows = np.sort(np.concatenate(list(splits.values())))
    position = np.full(len(y), -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    return pixels[rows], y[rows], group[rows], {k: position[v] for k, v in splits.items()}
