"""CIFAR-10 (Krizhevsky 2009) from the official "python version" pickle batches.

Files (``datasets/cifar10/cifar-10-batches-py/`` or the mirror), each checked against its
published MD5 *before* it is unpickled: ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``,
each a pickled dict with ``b"data"`` (10 000 x 3 072 uint8: 1 024 red, 1 024 green, 1 024 blue
values, row-major 32 x 32) and ``b"labels"`` (10 000 ints in 0..9).  Unpickling allows only the
numpy reconstructors such a batch needs (a file that names any other global is rejected).

The archive ``cifar-10-python.tar.gz`` is not unpacked by raco: see :data:`MANUAL`.  Rows are
(3, 32, 32) images scaled to [0, 1]; the official test batch is the test split, validation 15 %
of the training batches.  ``dataset.options.st=true``: CIFAR10-ST, only the last 100 training
images of each of the classes 0-4 are kept (:mod:`raco_cli.data.images`); the group of a row is
its class.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from pathlib import Path

import numpy as np

from raco_cli.data import images, sources
from raco_cli.data.types import TabularData
from raco_cli.errors import ConfigError, DataIntegrityError

FOLDER = "cifar-10-batches-py"
MANUAL = (
    "Download and unpack the python version of CIFAR-10 into datasets/cifar10/ (or $RACO_DATA_MIRROR/cifar10/): "
    "mkdir -p datasets/cifar10 && curl -L https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz | tar xz -C datasets/cifar10"
)
MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
FILES = tuple(sources.RemoteFile(f"{FOLDER}/{name}", md5=md5, manual_hint=MANUAL) for name, md5 in MD5.items())
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
ST_KEEP = 100  # CIFAR10-ST: last 100 training images of each of the first five classes
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
            ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle's interface
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 batch")
        return super().find_class(module, name)


def parse_batch(content: bytes, *, path: str) -> tuple[np.ndarray, np.ndarray]:
    """``(images (n, 3, 32, 32) uint8, labels (n,))`` of one pickled batch.

    Raises:
        DataIntegrityError: not a CIFAR-10 batch (one line).
    """
    bad = f"{path} is not a valid CIFAR-10 python batch"
    try:
        batch = _BatchUnpickler(io.BytesIO(content), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise DataIntegrityError(f"{bad} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}). {MANUAL}") from None
    data = batch.get(b"data") if isinstance(batch, dict) else None
    labels = batch.get(b"labels") if isinstance(batch, dict) else None
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or labels is None:
        raise DataIntegrityError(f"{bad} (expected b'data' uint8 (n, 3072) and b'labels'). {MANUAL}")
    y = np.asarray(labels, dtype=np.int64)
    if len(y) != len(data) or (len(y) and not 0 <= y.min() <= y.max() <= 9):
        raise DataIntegrityError(f"{bad} ({len(data)} images, {len(y)} labels, labels must be 0..9). {MANUAL}")
    return data.reshape(-1, 3, 32, 32), y


def load(*, data_dir: Path, mirror: str | None = None, allow_download: bool = True, split_seed: int = 0, st: bool = False,
         verify_checksums: bool = True, split: str = "stratified") -> TabularData:
    """Load CIFAR-10 (or CIFAR10-ST).

    Raises:
        DataNotFoundError: a batch is missing (the message says how to get it).
        DataIntegrityError / ConfigError: one line each.
    """
    for key, value in (("st", st), ("verify_checksums", verify_checksums)):
        if not isinstance(value, bool):
            raise ConfigError(f"dataset.options.{key} must be true or false (got dataset.options.{key}={value!r}).")
    parts, paths = [], []
    for spec in FILES:
        spec = spec if verify_checksums else dataclasses.replace(spec, md5=None)
        stream, path = sources.open_file("cifar10", spec, data_dir=data_dir, mirror=mirror, allow_download=allow_download)
        parts.append(parse_batch(stream.read(), path=str(path)))
        paths.append(str(path))
    pixels = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    n_train = sum(len(p[1]) for p in parts[:5])
    train_rows, test_rows = np.arange(n_train), np.arange(n_train, len(y))
    if st:
        if split == "record":
            images.refuse_record_split_of_st("cifar10")
        train_rows = images.last_per_class(y, train_rows, range(5), ST_KEEP)
    splits = (images.record_pool_split(images.pixel_hashes(pixels, y, seed=split_seed), train_rows, test_rows) if split == "record"
              else images.pool_split(y, y, train_rows, test_rows, seed=split_seed))
    pixels, y, group, splits = images.compact(pixels, y, y.copy(), splits)
    return TabularData(
        name="cifar10", X=images.PixelStore(pixels), y=y, group=group, feature_names=("image[3x32x32]",), class_names=CLASSES,
        group_names=CLASSES, splits=splits, source=", ".join(paths), meta={"st": st},
    )
