"""Fashion-MNIST (Xiao, Rasul, Vollgraf 2017, Zalando Research): MNIST's format and splits.

The four idx-ubyte gzip files in ``datasets/fashion_mnist/`` (or the mirror), checked against
the published MD5s of the archives (:mod:`raco_cli.data.mnist` reads them).  Ten clothing
classes; ``dataset.options.st=true`` applies the MNIST-ST construction (classes 0-4 vs 5-9).
"""

from __future__ import annotations

from pathlib import Path

from raco_cli.data import images, mnist
from raco_cli.data.types import TabularData

URLS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/")
MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
FILES = mnist.remote_files(MD5, URLS)
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


def load(*, data_dir: Path, mirror: str | None = None, allow_download: bool = True, split_seed: int = 0, st: bool = False,
         imratio: float = 0.1, verify_checksums: bool = True, split: str = "stratified") -> TabularData:
    """Load Fashion-MNIST (or its -ST construction)."""
    imratio = images.check_st_options(st, imratio, dataset="fashion_mnist", verify_checksums=verify_checksums)
    arrays = mnist.read("fashion_mnist", FILES, data_dir=data_dir, mirror=mirror, allow_download=allow_download,
                        verify_checksums=verify_checksums)
    return mnist.build("fashion_mnist", *arrays[:4], class_names=CLASSES, st=st, imratio=imratio, split_seed=split_seed, source=arrays[4], split=split)
