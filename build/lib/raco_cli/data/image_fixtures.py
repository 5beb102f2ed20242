"""Small generated files in the exact upstream formats of MNIST / Fashion-MNIST (idx-ubyte,
gzip) and CIFAR-10 (pickled python batches), for tests and smoke runs without the real files.

    python -m raco_cli.data.image_fixtures mnist /tmp/mirror      # /tmp/mirror/mnist/*.gz
    python -m raco_cli.data.image_fixtures cifar10 /tmp/mirror    # /tmp/mirror/cifar10/cifar-10-batches-py/*
"""

from __future__ import annotations

import gzip
import pickle
import struct
import sys
from pathlib import Path

import numpy as np


def idx_bytes(array: np.ndarray) -> bytes:
    """An idx-ubyte file: magic 0x0800 + ndim, the dimensions (big-endian int32), the values."""
    array = np.asarray(array, dtype=np.uint8)
    return struct.pack(">I", 0x0800 + array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape) + array.tobytes()


def _digit_images(labels: np.ndarray, rng: np.random.Generator, size: int = 28) -> np.ndarray:
    """Noise plus a bright block whose position encodes the class (learnable, like digits)."""
    out = rng.integers(0, 60, size=(len(labels), size, size)).astype(np.uint8)
    for i, c in enumerate(labels):
        r, col = 2 + (c // 5) * 12, 2 + (c % 5) * 5
        out[i, r : r + 10, col : col + 4] = 250
    return out


def write_mnist(root: Path | str, *, dataset: str = "mnist", n_train: int = 600, n_test: int = 200, seed: int = 0) -> Path:
    """``<root>/<dataset>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``, MNIST's layout."""
    rng = np.random.default_rng(seed)
    base = Path(root) / dataset
    base.mkdir(parents=True, exist_ok=True)
    for part, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        (base / f"{part}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(_digit_images(labels, rng)), mtime=0))
        (base / f"{part}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(labels), mtime=0))
    return base


def write_cifar10(root: Path | str, *, per_batch: int = 120, seed: int = 0) -> Path:
    """``<root>/cifar10/cifar-10-batches-py/{data_batch_1..5,test_batch}``: pickled dicts with
    bytes keys (``b"batch_label"``, ``b"labels"``, ``b"data"`` uint8 (n, 3072), ``b"filenames"``)."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "cifar10" / "cifar-10-batches-py"
    base.mkdir(parents=True, exist_ok=True)
    for name in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"):
        labels = rng.integers(0, 10, per_batch)
        planes = np.stack([_digit_images(labels, rng, size=32)] * 3, axis=1)  # (n, 3, 32, 32)
        batch = {b"batch_label": name.encode(), b"labels": [int(v) for v in labels],
                 b"data": planes.reshape(per_batch, 3072), b"filenames": [f"img_{i}.png".encode() for i in range(per_batch)]}
        (base / name).write_bytes(pickle.dumps(batch, protocol=2))
    return base


if __name__ == "__main__":  # pragma: no cover
    kind, target = sys.argv[1], sys.argv[2]
    print(write_cifar10(target) if kind == "cifar10" else write_mnist(target, dataset=kind))
