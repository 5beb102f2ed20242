"""Shared fixtures: offline data mirror, a tiny rigged dataset, markers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

# Property tests: `make test` (and so CI) uses the derandomized "ci" profile, so a landing
# never depends on what a random draw happens to explore; `make test-trust` and plain pytest
# draw new examples every run (the "explore" profile), which is how new edge cases are found.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("RACO_HYPOTHESIS_PROFILE", "explore"))

ROOT = Path(__file__).resolve().parents[1]

# Offline mirror of the real datasets (CI sets RACO_DATA_MIRROR; default: ../shared/datasets).
if not os.environ.get("RACO_DATA_MIRROR"):
    for candidate in (ROOT.parent / "shared" / "datasets", Path("/work/shared/datasets")):
        if candidate.is_dir():
            os.environ["RACO_DATA_MIRROR"] = str(candidate)
            break


def adult_available() -> bool:
    mirror = os.environ.get("RACO_DATA_MIRROR", "")
    return any((Path(root) / "adult" / name).exists() for root in (mirror, ROOT / "datasets") if root
               for name in ("adult.data", "adult.data.gz"))


def pytest_collection_modifyitems(config, items):
    skip_data = pytest.mark.skip(reason="needs the Adult files (set RACO_DATA_MIRROR or run make data)")
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    has_data = adult_available()
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    for item in items:
        if "data" in item.keywords and not has_data:
            item.add_marker(skip_data)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def synthetic():
    """A generated dataset with a known group disparity (fast)."""
    from raco_cli.data import synthetic

    return synthetic.load(n=3000, n_features=6, seed=0)


@pytest.fixture(scope="session")
def adult():
    """The real Adult dataset from the mirror (tests using it are marked ``data``)."""
    from raco_cli import data

    return data.load("adult", data_dir=ROOT / "datasets", mirror=os.environ.get("RACO_DATA_MIRROR"))


@pytest.fixture
def rigged():
    """Hand-checkable rows: 2 groups x 2 labels with known predicted rates.

    group 0: 4 rows, predictions [1, 1, 1, 0] -> P(pred=1 | g0) = 0.75
    group 1: 4 rows, predictions [1, 0, 0, 0] -> P(pred=1 | g1) = 0.25
    """
    y = np.array([1, 1, 0, 0, 1, 0, 0, 1])
    group = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    pred = np.array([1, 1, 1, 0, 1, 0, 0, 0])
    return y, group, pred


@pytest.fixture
def composer():
    """``composer(overrides)`` -> the composed job config of ``conf/`` (Hydra context held open)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from raco_cli.cli.paths import CONF_DIR, register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield lambda overrides=(): compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
