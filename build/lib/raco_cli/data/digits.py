"""scikit-learn's bundled 8x8 handwritten digits (UCI Optical Recognition of Handwritten
Digits, test part): 1 797 images, real data available offline.

Rows are (1, 8, 8) images with pixel values 0..16 scaled to [0, 1] (no statistic of the
data).  Splits: the shared protocol (25 % test, 15 % of the rest validation, stratified by
label x group).  ``dataset.options.st=true`` builds digits-ST, the MNIST-ST construction of the
DP-DRO paper (:mod:`raco_cli.data.images`): label 1 = digits 5-9, positives in the training
pool subsampled to ``imratio``, balanced test; the group of a row is its digit.  Without
``st`` the task is the ten digits, and the group is the digit as well.
"""

from __future__ import annotations

import numpy as np

from raco_cli.data import images
from raco_cli.data.tabular import split_rows, stratified_split
from raco_cli.data.types import TabularData


def load(*, st: bool = False, imratio: float = 0.1, split_seed: int = 0, split: str = "stratified") -> TabularData:
    """Load digits (or digits-ST).

    Raises:
        ConfigError: a bad ``st`` / ``imratio`` (one line).
    """
    from sklearn.datasets import load_digits

    imratio = images.check_st_options(st, imratio, dataset="digits")
    raw = load_digits()
    pixels = np.asarray(raw.images, dtype=np.uint8)[:, None, :, :]  # values 0..16
    digit = np.asarray(raw.target, dtype=np.int64)
    rng = np.random.default_rng(split_seed)
    if split == "record" and st:
        images.refuse_record_split_of_st("digits")
    if not st:
        splits = split_rows(digit, digit, seed=split_seed, how=split, hashes=images.pixel_hashes(pixels, digit, seed=split_seed)
                            if split == "record" else None)
        y, class_names = digit, tuple(str(d) for d in range(10))
    else:
        y = (digit >= 5).astype(np.int64)
        first = stratified_split(y, digit, seed=split_seed)  # test part: 25 %, then balanced
        pool = images.subsample_positives(y, np.concatenate([first["train"], first["val"]]), imratio, rng)
        splits = images.pool_split(y, digit, pool, images.balance(y, first["test"], rng), seed=split_seed)
        class_names = images.ST_CLASS_NAMES
    pixels, y, digit, splits = images.compact(pixels, y, digit, splits)
    return TabularData(
        name="digits",
        X=images.PixelStore(pixels, scale=16.0),
        y=y,
        group=digit,
        feature_names=("image[1x8x8]",),
        class_names=class_names,
        group_names=tuple(f"digit {d}" for d in range(10)),
        splits=splits,
        source="sklearn.datasets.load_digits (bundled)",
        meta={"st": st, "imratio": imratio if st else None},
    )
