"""Datasets: one loader per dataset, all returning :class:`TabularData`."""

from raco_cli.data.registry import DATASETS, get, load
from raco_cli.data.types import SPLITS, TabularData

__all__ = ["DATASETS", "SPLITS", "TabularData", "get", "load"]
