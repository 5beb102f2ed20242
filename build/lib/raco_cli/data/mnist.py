"""MNIST (LeCun, Cortes, Burges) from the four published idx-ubyte gzip files.

Files (``datasets/mnist/`` or ``$RACO_DATA_MIRROR/mnist/``), checked against the published MD5s
of the *gzip archives* (the only checksums the publishers give), so they are kept compressed:
``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``, ``t10k-images-idx3-ubyte.gz``,
``t10k-labels-idx1-ubyte.gz``.  idx format: a big-endian header (magic 0x00000803 for uint8
images with 3 dimensions, 0x00000801 for uint8 labels; then the dimensions as int32), then
the values, row-major.

Rows are (1, 28, 28) images scaled to [0, 1].  The official test set is the test split;
validation is 15 % of the official training set (stratified).  ``dataset.options.st=true``:
MNIST-ST (:mod:`raco_cli.data.images`).  :mod:`raco_cli.data.fashion_mnist` reads the same
format.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raco_cli.data import images, sources
from raco_cli.data.types import TabularData
from raco_cli.errors import DataIntegrityError

URLS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/")
# published MD5s of the .gz files (as torchvision checks them)
MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
NAMES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def remote_files(md5: dict[str, str], urls: Sequence[str]) -> tuple[sources.RemoteFile, ...]:
    return tuple(sources.RemoteFile(name, urls=tuple(u + name for u in urls), archive_md5=md5[name]) for name in NAMES)


FILES = remote_files(MD5, URLS)


def parse_idx(content: bytes, *, dims: int, path: str, dataset: str) -> np.ndarray:
    """An idx-ubyte array (uint8, ``dims`` dimensions) from its bytes.

    Raises:
        DataIntegrityError: wrong magic number, dimensions or length (one line).

    >>> parse_idx(b"\\x00\\x00\\x08\\x01\\x00\\x00\\x00\\x02\\x07\\x03", dims=1, path="x", dataset="mnist").tolist()
    [7, 3]
    """
    header = 4 + 4 * dims
    bad = f"{path} is not a valid idx-ubyte file for '{dataset}'"
    if len(content) < header:
        raise DataIntegrityError(f"{bad} (truncated header). Delete it and fetch it again with: make data DATASET={dataset}")
    magic = struct.unpack(">I", content[:4])[0]
    if magic != 0x0800 + dims:
        raise DataIntegrityError(f"{bad} (magic number {magic:#010x}, expected {0x0800 + dims:#010x}: uint8 with {dims} dimensions). "
                                 f"Delete it and fetch it again with: make data DATASET={dataset}")
    shape = struct.unpack(">" + "I" * dims, content[4:header])
    size = int(np.prod(shape))
    if len(content) != header + size:
        raise DataIntegrityError(f"{bad} (header says {size} values, the file has {len(content) - header}). "
                                 f"Delete it and fetch it again with: make data DATASET={dataset}")
    return np.frombuffer(content, dtype=np.uint8, offset=header).reshape(shape)


def read(dataset: str, files: Sequence[sources.RemoteFile], *, data_dir: Path, mirror: str | None, allow_download: bool,
         verify_checksums: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Train images and labels, test images and labels, and where they were read from."""
    import dataclasses

    arrays, paths = [], []
    for spec in files:
        spec = spec if verify_checksums else dataclasses.replace(spec, archive_md5=None)
        stream, path = sources.open_file(dataset, spec, data_dir=data_dir, mirror=mirror, allow_download=allow_download)
        arrays.append(parse_idx(stream.read(), dims=3 if "images" in spec.name else 1, path=str(path), dataset=dataset))
        paths.append(str(path))
    x_train, y_train, x_test, y_test = arrays
    for x, y, part in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
        if len(x) != len(y) or (len(y) and int(y.max()) > 9):
            raise DataIntegrityError(f"{dataset}: the {part} images ({len(x)}) and labels ({len(y)}) do not match, or a label is "
                                     f"outside 0..9. Delete the files and fetch them again with: make data DATASET={dataset}")
    return x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64), ", ".join(paths)


def build(dataset: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, *, class_names: Sequence[str],
          st: bool, imratio: float, split_seed: int, source: str, split: str = "stratified") -> TabularData:
    """Splits (official test; 15 % validation) and the optional -ST construction."""
    pixels = np.concatenate([x_train, x_test])[:, None, :, :]
    original = np.concatenate([y_train, y_test])
    train_rows, test_rows = np.arange(len(y_train)), np.arange(len(y_train), len(original))
    rng = np.random.default_rng(split_seed)
    if split == "record" and st:
        images.refuse_record_split_of_st(dataset)
    if st:
        y = (original >= 5).astype(np.int64)
        pool = images.subsample_positives(y, train_rows, imratio, rng)
        splits = images.pool_split(y, original, pool, images.balance(y, test_rows, rng), seed=split_seed)
        labels: Sequence[str] = images.ST_CLASS_NAMES
    else:
        y = original
        splits = (images.record_pool_split(images.pixel_hashes(pixels, original, seed=split_seed), train_rows, test_rows) if split == "record"
                  else images.pool_split(y, original, train_rows, test_rows, seed=split_seed))
        labels = class_names
    pixels, y, original, splits = images.compact(pixels, y, original, splits)
    return TabularData(
        name=dataset, X=images.PixelStore(pixels), y=y, group=original, feature_names=(f"image[1x{pixels.shape[2]}x{pixels.shape[3]}]",),
        class_names=tuple(labels), group_names=tuple(class_names), splits=splits, source=source,
        meta={"st": st, "imratio": imratio if st else None},
    )


def load(*, data_dir: Path, mirror: str | None = None, allow_download: bool = True, split_seed: int = 0, st: bool = False,
         imratio: float = 0.1, verify_checksums: bool = True, split: str = "stratified") -> TabularData:
    """Load MNIST (or MNIST-ST); ``verify_checksums=false`` skips the archive MD5s (re-packaged copies).

    Raises:
        DataNotFoundError / DataIntegrityError / ConfigError: one line each.
    """
    imratio = images.check_st_options(st, imratio, dataset="mnist", verify_checksums=verify_checksums)
    arrays = read("mnist", FILES, data_dir=data_dir, mirror=mirror, allow_download=allow_download, verify_checksums=verify_checksums)
    return build("mnist", *arrays[:4], class_names=tuple(str(d) for d in range(10)), st=st, imratio=imratio, split_seed=split_seed,
                 source=arrays[4], split=split)
