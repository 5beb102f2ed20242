"""Dataset name registry: loaders are imported lazily, by name."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raco_cli.data.types import TabularData
from raco_cli.errors import ConfigError, unknown_name


@dataclass(frozen=True)
class DatasetEntry:
    """What the registry knows about a dataset without loading it.

    Attributes:
        name: registry key (``dataset=<name>``).
        module: module holding ``load(...)`` and, for downloadable data, ``FILES``.
        description: one line for ``raco data list``.
        origin: where the data comes from (publisher / URL).
        needs_files: False for generated datasets and the user's own table.
        user_file: the data is the user's own file (``dataset=table``: ``dataset.options.path``).
    """

    name: str
    module: str
    description: str
    origin: str
    needs_files: bool = True
    user_file: bool = False

    def loader(self) -> Any:
        return importlib.import_module(self.module)


DATASETS: dict[str, DatasetEntry] = {
    e.name: e
    for e in (
        DatasetEntry(
            "adult",
            "raco_cli.data.adult",
            "UCI Adult: income >50K, sensitive sex (45 222 rows, 102 features)",
            "https://archive.ics.uci.edu/dataset/2/adult",
        ),
        DatasetEntry(
            "credit",
            "raco_cli.data.credit",
            "UCI Default of Credit Card Clients: default, sensitive sex (30 000 rows, 85 features)",
            "https://archive.ics.uci.edu/dataset/350/default+of+credit+card+clients",
        ),
        DatasetEntry(
            "parkinsons",
            "raco_cli.data.parkinsons",
            "UCI Parkinsons Telemonitoring: total_UPDRS > train median, sensitive sex (5 875 rows, 19 features)",
            "https://archive.ics.uci.edu/dataset/189/parkinsons+telemonitoring",
        ),
        DatasetEntry(
            "heart",
            "raco_cli.data.heart",
            "BRFSS 2015 heart disease indicators: HeartDiseaseorAttack, sensitive Sex (253 680 rows, 21 features)",
            "https://www.kaggle.com/datasets/alexteboul/heart-disease-health-indicators-dataset (manual: Kaggle login)",
        ),
        DatasetEntry(
            "acs_employment",
            "raco_cli.data.acs",
            "folktables ACSEmployment: ESR == 1, sensitive RAC1P (9 groups); default 2018 1-Year AL",
            "https://www2.census.gov/programs-surveys/acs/data/pums/ via folktables",
        ),
        DatasetEntry(
            "celeba",
            "raco_cli.data.celeba",
            "CelebA aligned faces: attribute (default Smiling), sensitive Male (202 599 images, official splits)",
            "http://mmlab.ie.cuhk.edu.hk/projects/CelebA.html (manual: Google Drive)",
        ),
        DatasetEntry(
            "digits",
            "raco_cli.data.digits",
            "scikit-learn's bundled 8x8 digits (1 797 images; options st/imratio: digits-ST, 0-4 vs 5-9 imbalanced)",
            "sklearn.datasets.load_digits (bundled with scikit-learn, no download)",
            needs_files=False,
        ),
        DatasetEntry(
            "mnist",
            "raco_cli.data.mnist",
            "MNIST handwritten digits (70 000 28x28 images; options st/imratio: MNIST-ST)",
            "https://ossci-datasets.s3.amazonaws.com/mnist/ (idx-ubyte gz, the files of yann.lecun.com/exdb/mnist)",
        ),
        DatasetEntry(
            "fashion_mnist",
            "raco_cli.data.fashion_mnist",
            "Fashion-MNIST clothing images (70 000 28x28 images; options st/imratio: the -ST construction)",
            "https://github.com/zalandoresearch/fashion-mnist (idx-ubyte gz)",
        ),
        DatasetEntry(
            "cifar10",
            "raco_cli.data.cifar10",
            "CIFAR-10 (60 000 32x32 colour images; option st: CIFAR10-ST, last 100 of classes 0-4)",
            "https://www.cs.toronto.edu/~kriz/cifar.html (python version; manual: unpack the tar.gz)",
        ),
        DatasetEntry(
            "table",
            "raco_cli.data.table",
            "your own CSV (plain or gzip) or Parquet file: dataset.options.path, label, sensitive (docs/your-own-data.md)",
            "dataset.options.path",
            needs_files=False,
            user_file=True,
        ),
        DatasetEntry(
            "synthetic",
            "raco_cli.data.synthetic",
            "generated logistic data with a group disparity (tests and smoke runs)",
            "generated",
            needs_files=False,
        ),
        DatasetEntry(
            "group_mixture",
            "raco_cli.data.group_mixture",
            "generated OLS group mixture of the DPSE paper: real-valued label (task=regression), K groups",
            "generated",
            needs_files=False,
        ),
        DatasetEntry(
            "synthetic_images",
            "raco_cli.data.synthetic_images",
            "generated (3, S, S) images with a group disparity (image-model tests and smoke runs)",
            "generated",
            needs_files=False,
        ),
    )
}


def get(name: str) -> DatasetEntry:
    """Registry entry of a dataset.

    Raises:
        ConfigError: unknown name (the message lists the available ones).
    """
    try:
        return DATASETS[name]
    except KeyError:
        raise unknown_name("dataset", name, DATASETS) from None


def load(
    name: str,
    *,
    data_dir: Path,
    mirror: str | None = None,
    allow_download: bool = True,
    split_seed: int = 0,
    options: Mapping[str, Any] | None = None,
    preprocessing: str = "empirical",
    bounds: Mapping[str, Any] | None = None,
    split: str = "stratified",
) -> TabularData:
    """Load a dataset by name with the shared split protocol.

    ``preprocessing``/``bounds``: ``dataset.preprocessing`` (public | empirical) and
    ``dataset.bounds``, for loaders that scale numeric features (ignored by the others).
    ``split``: ``dataset.split`` (:data:`raco_cli.data.tabular.SPLITS`); a loader without the
    choice has a per-record split of its own (an official partition, generated rows).
    """
    entry = get(name)
    kwargs = dict(options or {})
    loader = entry.loader().load
    params = inspect.signature(loader).parameters
    allowed = sorted(
        p for p in params
        if p not in ("data_dir", "mirror", "allow_download", "split_seed", "preprocessing", "bounds", "split")
    )
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ConfigError(
            f"Unknown key dataset.options.{unknown[0]} for dataset '{name}'. "
            f"Allowed: {', '.join(allowed) or 'none'} (see conf/dataset/{name}.yaml)."
        )
    if entry.needs_files:
        kwargs.update(data_dir=Path(data_dir), mirror=mirror, allow_download=allow_download)
    if "preprocessing" in params:
        kwargs.update(preprocessing=preprocessing, bounds=dict(bounds or {}))
    if "split" in params:
        kwargs.update(split=split)
    return loader(split_seed=split_seed, **kwargs)
