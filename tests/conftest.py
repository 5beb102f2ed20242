"""Shared fixtures: offline data mirror, a tiny rigged dataset, markers."""

from __future__ import annotations

import functools
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


DATA_DIR = ROOT / "datasets"


def running_in_ci() -> bool:
    """CI sets ``CI=true`` (GitHub Actions, GitLab, .ci/run): there every data test must run."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing_data(message: str) -> None:
    """Skip a test whose dataset is absent; in CI fail it (a missing mirror must not turn the
    data tests into silent skips and leave CI green)."""
    if running_in_ci():
        pytest.fail(f"{message} (CI=true: data tests do not skip)", pytrace=False)
    pytest.skip(message)


@functools.cache
def dataset_present(name: str) -> bool:
    """Every file of the dataset is found where its loader looks (datasets/<name>/ or the mirror)."""
    from raco_cli.data import registry, sources

    files = getattr(registry.get(name).loader(), "FILES", ())
    mirror = os.environ.get("RACO_DATA_MIRROR") or None
    return bool(files) and all(sources.locate(name, f, data_dir=DATA_DIR, mirror=mirror) is not None for f in files)


def _data_names(item) -> list[str]:
    names = [n for mark in item.iter_markers("data") for n in mark.args]
    if any(not mark.args for mark in item.iter_markers("data")):
        raise pytest.UsageError(f"{item.nodeid}: write @pytest.mark.data('<dataset>', ...) naming the datasets it needs")
    return names


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    for item in items:
        _data_names(item)  # a bare data marker is a usage error, found at collection
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


def pytest_runtest_setup(item):
    """``@pytest.mark.data('credit')``: the test needs that dataset (checked per dataset)."""
    missing = [name for name in _data_names(item) if not dataset_present(name)]
    if missing:
        missing_data(f"needs the dataset(s) {', '.join(missing)}: set RACO_DATA_MIRROR or run make data DATASET={missing[0]}")


@pytest.fixture(scope="session")
def data_sources() -> tuple[Path, str | None]:
    """``(data_dir, mirror)`` where the loaders look for real datasets in the tests."""
    return DATA_DIR, os.environ.get("RACO_DATA_MIRROR") or None


@pytest.fixture
def mirror_dir(request):
    """``mirror_dir(name)``: the dataset's folder in the offline mirror, for tests that read the
    mirror's files themselves (missing -> skip, or fail in CI)."""

    def folder(name: str) -> Path:
        mirror = os.environ.get("RACO_DATA_MIRROR")
        path = Path(mirror) / name if mirror else None
        if path is None or not path.is_dir():
            missing_data(f"reads the offline mirror's copy of {name}: set RACO_DATA_MIRROR (a directory with {name}/)")
        assert path is not None
        return path

    return folder


@pytest.fixture
def one_torch_thread():
    """Tests that repeat many tiny runs: one torch thread (a pool of threads on tensors of a few
    hundred entries only waits for itself, and much longer on a loaded machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["batched", "one_run"])
def engine(request, monkeypatch):
    """Which SGDA engine a logistic-regression run trains on: ``batched`` (every linear run on
    the CPU, alone as a group of one: methods/batched.py) or ``one_run`` (the loop of other
    models and of accelerators, methods/sgda/core.py; forced here by ``COMPILED_SCAN = False``)."""
    from raco_cli.methods import batched

    if request.param == "one_run":
        monkeypatch.setattr(batched, "COMPILED_SCAN", False)
    return request.param


@pytest.fixture
def dual_inputs(monkeypatch):
    """The noisy histograms (Q, K) each step's post-processing reads (denominators, regularizer
    weights, dual gradient), from either engine: ``ConstraintTensors.step`` (the one-run loop)
    or ``batched_scan.dual_step`` (the batched engine, one histogram per run)."""
    import torch

    from raco_cli.constraints.rate import ConstraintTensors
    from raco_cli.methods import batched_scan

    seen: list = []
    one, many = ConstraintTensors.step, batched_scan.dual_step

    def spy(self, H, lam, *, floor):
        seen.append(H.clone())
        return one(self, H, lam, floor=floor)

    def spy_many(membership, alpha, H, lam, floors, gamma):
        seen.extend(torch.from_numpy(h.copy()) for h in H)
        return many(membership, alpha, H, lam, floors, gamma)

    monkeypatch.setattr(ConstraintTensors, "step", spy)
    monkeypatch.setattr(batched_scan, "dual_step", spy_many)
    return seen


@pytest.fixture
def zero_gradient_sums(monkeypatch):
    """Every clipped gradient sum zero, in both engines (the one-run loop's closed-form engine
    and the batched engine's compiled pass): a private update is then pure noise."""
    import torch

    from raco_cli.methods import batched_scan
    from raco_cli.methods.gradients import ClippedSum, LinearEngine
    from raco_cli.methods.group_rows import GroupSum

    def zero_sum(self, X, y=None, c=None, **kw):
        z = torch.zeros((), dtype=torch.long)
        return ClippedSum([torch.zeros_like(p) for p in self.params], z, z.float(), z)

    def zero_sums(self, weights, reg_temp, temperature, clip):
        zeros = torch.zeros(self.R, dtype=torch.long)
        return GroupSum(grad_w=torch.zeros(self.R, self.K, self.d), grad_b=torch.zeros(self.R, self.K), clipped=zeros,
                        norm_sum=zeros.float(), nonfinite=zeros)

    monkeypatch.setattr(LinearEngine, "clipped_sum", zero_sum)
    monkeypatch.setattr(batched_scan.Scan, "clipped_sums", zero_sums)


@pytest.fixture(scope="session")
def synthetic():
    """A generated dataset with a known group disparity (fast)."""
    from raco_cli.data import synthetic

    return synthetic.load(n=3000, n_features=6, seed=0)


@pytest.fixture(scope="session")
def adult():
    """The real Adult dataset from the mirror (tests using it are marked ``data``)."""
    from raco_cli import data

    return data.load("adult", data_dir=DATA_DIR, mirror=os.environ.get("RACO_DATA_MIRROR") or None)


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

    from raco_cli.cli.paths import CONF_DIR
    from raco_cli.cli.plugins import register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield lambda overrides=(): compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
