"""Dataset name registry: loaders are imported lazily, by name."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raco_cli.data.types import TabularData
from raco_cli.errors import unknown_name


@dataclass(frozen=True)
class DatasetEntry:
    """What the registry knows about a dataset without loading it.

    Attributes:
        name: registry key (``dataset=<name>``).
        module: module holding ``load(...)`` and, for downloadable data, ``FILES``.
        description: one line for ``raco data list``.
        origin: where the data comes from (publisher / URL).
        needs_files: False for generated datasets.
    """

    name: str
    module: str
    description: str
    origin: str
    needs_files: bool = True

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
            "synthetic",
            "raco_cli.data.synthetic",
            "generated logistic data with a group disparity (tests and smoke runs)",
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
) -> TabularData:
    """Load a dataset by name with the shared split protocol."""
    entry = get(name)
    kwargs = dict(options or {})
    if entry.needs_files:
        kwargs.update(data_dir=Path(data_dir), mirror=mirror, allow_download=allow_download)
    return entry.loader().load(split_seed=split_seed, **kwargs)
