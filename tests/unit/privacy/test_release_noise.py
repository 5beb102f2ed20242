"""The noise every release actually carries equals what the accountant was told.

For each Gaussian/Laplace release of raco_dp, dp_sgd, dp_fermi and dpse: the run is repeated
at fixed data, fixed initialisation and fixed batches with only the noise seed changing, the
first releases of each kind are read from the release tape (:mod:`raco_cli.privacy.releases`),
and the empirical standard deviation across runs (the exact part is the same in every run)
is compared with the planned one: the noise multiplier of the matching leaf of the method's
DpEvent tree times the release's sensitivity (C for a clipped gradient sum, 1 for a count,
...; for the integer counts, drawn from the discrete Gaussian of integer scale
``discrete_gaussian_for(sigma)`` >= sigma that ``GaussianDpEvent(sigma)`` covers,
:mod:`raco_cli.privacy.discrete`, that scale).  A release whose noise was dropped, scaled by sigma instead of sigma C, or drawn with
another multiplier than the accounted one fails here; counters of releases cannot see that.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.data import synthetic
from raco_cli.methods import dp_fermi, dpse
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.sgda import dp_sgd, raco_dp
from raco_cli.privacy import events, releases
from raco_cli.privacy.discrete import discrete_gaussian_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")
RUNS = 80


@pytest.fixture(scope="module")
def small():
    return synthetic.load(n=600, n_features=4, seed=3)


def _flat(value) -> np.ndarray:
    if isinstance(value, (list, tuple)):
        return np.concatenate([_flat(v) for v in value])
    return torch.as_tensor(value).detach().double().flatten().cpu().numpy()


def first_releases(fit: Callable[[Seeds], None], take: dict[str, int], runs: int = RUNS) -> dict[str, np.ndarray]:
    """``kind -> (runs, coordinates)``: the first ``take[kind]`` releases of each kind in each run.

    Every run has the same initialisation and batches (so the same exact values); only the
    noise seed changes."""
    out: dict[str, list[np.ndarray]] = {kind: [] for kind in take}
    for r in range(runs):
        with releases.recording() as tape:
            fit(Seeds(seed=0, init=11, sampling=12, noise=1000 + r, selection=13, preprocessing=14))
        for kind, n in take.items():
            values = [v for k, v in tape.entries if k == kind][:n]
            assert len(values) == n, f"{kind}: {len(values)} releases, expected at least {n}"
            out[kind].append(np.concatenate([_flat(v) for v in values]))
    return {kind: np.stack(v) for kind, v in out.items()}


def assert_noise_std(draws: np.ndarray, planned: float, *, laplace: bool = False, what: str = "") -> None:
    """Pooled std of the deviations from the per-coordinate mean across runs == ``planned``.

    Tolerance: 5 standard errors of a sample std (relative se sqrt((kurtosis - 1) / (4 N)),
    kurtosis 3 for Gaussian, 6 for Laplace noise)."""
    runs, coords = draws.shape
    dev = draws - draws.mean(axis=0)
    std = math.sqrt((dev**2).sum() / ((runs - 1) * coords))
    n = (runs - 1) * coords
    rtol = 5 * math.sqrt((5 if laplace else 2) / (4 * n))
    assert std == pytest.approx(planned, rel=rtol), f"{what}: noise std {std:.4g}, planned {planned:.4g} (rtol {rtol:.2f})"


def _leaves(event: dpa.DpEvent) -> list[dpa.DpEvent]:
    """Gaussian/Laplace leaves of an event tree, in order."""
    from oracles import event_leaves

    return [leaf.event for leaf in event_leaves(event)]


def _fit(module, data, spec, cons, steps):
    def fit(seeds: Seeds) -> None:
        model = models.build("logreg", input_shape=data.input_shape, n_classes=data.n_classes)
        module.fit(data, model, cons, spec, steps=steps, seeds=seeds, device=torch.device("cpu"), reporter=NullReporter())

    return fit


def test_raco_dp_histogram_and_gradient_noise(small):
    C, sigma, b = 0.25, 1.5, 3.0
    spec = paper_spec(name="raco_dp", batch_size=60, clip_norm=C, noise_multiplier=sigma, hist_noise_multiplier=b,
                      eval_every=10**6, selection="last")  # fmt: skip
    cons = constraints.build("eo", n_classes=2, n_groups=small.n_groups, gamma=0.05)
    laplace, gaussian = _leaves(raco_dp.step_event(spec, 0.1, constrained=True))
    assert isinstance(laplace, dpa.LaplaceDpEvent) and isinstance(gaussian, dpa.GaussianDpEvent)
    draws = first_releases(_fit(raco_dp, small, spec, cons, 1), {"histogram": 1, "gradient": 1})
    # l1 sensitivity 1: Laplace scale b per cell, std sqrt(2) b; l2 sensitivity C: std sigma C
    assert_noise_std(draws["histogram"], math.sqrt(2) * laplace.noise_multiplier, laplace=True, what="histogram")
    assert_noise_std(draws["gradient"], gaussian.noise_multiplier * C, what="gradient")


def test_dp_sgd_gradient_noise(small):
    C, sigma = 4.0, 0.7
    spec = paper_spec(name="dp_sgd", batch_size=60, clip_norm=C, noise_multiplier=sigma, eval_every=10**6, selection="last")
    cons = constraints.build("none", n_classes=2, n_groups=small.n_groups, gamma=0.0)
    (gaussian,) = _leaves(dp_sgd.step_event(spec, 0.1))
    draws = first_releases(_fit(dp_sgd, small, spec, cons, 1), {"gradient": 1})
    assert_noise_std(draws["gradient"], gaussian.noise_multiplier * C, what="gradient")


def test_dp_fermi_count_theta_and_w_noise(small):
    """The group counts (l2 sensitivity 1), the theta gradient (C) and the W gradient (C_W).

    The first W gradient depends on the released proportions (s = 1/sqrt(p)), so its exact
    part varies slightly between runs; with count noise 3 on counts of ~200 that variation
    is below 1 % of the W noise."""
    C, C_w = 0.5, 4.0
    opts = {"lam": 2.0, "clip_norm_w": C_w, "noise_multiplier_w": 3.0, "count_noise_multiplier": 3.0}
    spec = paper_spec(name="dp_fermi", batch_size=60, clip_norm=C, noise_multiplier=2.0, eval_every=10**6,
                      selection="last", options=opts)  # fmt: skip
    cons = constraints.build("dp", n_classes=2, n_groups=small.n_groups, gamma=0.05)
    count, theta, w = _leaves(dp_fermi.run_event(spec, 0.1, 1))
    draws = first_releases(_fit(dp_fermi, small, spec, cons, 1), {"group_counts": 1, "gradient": 1, "gradient_w": 1})
    assert_noise_std(draws["group_counts"], discrete_gaussian_for(count.noise_multiplier) * 1.0, what="group counts")
    assert_noise_std(draws["gradient"], theta.noise_multiplier * C, what="theta gradient")
    assert_noise_std(draws["gradient_w"], w.noise_multiplier * C_w, what="W gradient")


def test_dpse_stage_two_noise(small):
    """allocation=uniform: every group's budget weight is 1, so each group's gradient sum (C)
    and loss sum (loss bound B) carry the stage-2 noise multiplier of the event tree."""
    C, B, T = 0.5, 2.0, 3
    spec = paper_spec(name="dpse", steps=T, clip_norm=C, noise_multiplier=1.0, eval_every=10**6, selection="last",
                      options={"allocation": "uniform", "loss_bound": B, "count_noise_multiplier": 7.0})  # fmt: skip
    cons = constraints.build("none", n_classes=2, n_groups=small.n_groups, gamma=0.0)
    event = dpse.run_event(spec, 1.0, T)
    count, *stage2 = _leaves(event)
    assert len({e.noise_multiplier for e in stage2}) == 1
    k = small.n_groups
    draws = first_releases(_fit(dpse, small, spec, cons, T), {"group_counts": 1, "group_gradient": k, "group_loss": k})
    assert_noise_std(draws["group_counts"], discrete_gaussian_for(count.noise_multiplier), what="group counts")
    assert_noise_std(draws["group_gradient"], stage2[0].noise_multiplier * C, what="group gradient")
    assert_noise_std(draws["group_loss"], stage2[0].noise_multiplier * B, what="group loss")


def test_dpse_stage_one_noise(small):
    """allocation=max: the precursor's noisy X^T X (sensitivity U^2, symmetric noise on the upper
    triangle) and X^T Y (U), and the per-group residual sums (1).  A huge precursor ridge makes
    the precursor ~0, so every residual is 1/2 and the exact residual sums do not vary with
    the precursor's noise."""
    U = 2.0
    spec = paper_spec(name="dpse", steps=1, clip_norm=1.0, noise_multiplier=2.0, eval_every=10**6, selection="last",
                      options={"row_bound": U, "precursor_ridge": 1e12, "count_noise_multiplier": 7.0})  # fmt: skip
    cons = constraints.build("none", n_classes=2, n_groups=small.n_groups, gamma=0.0)
    count, pre_xx, pre_xy, se, *_ = _leaves(dpse.run_event(spec, 1.0, 1))
    take = {"group_counts": 1, "precursor_xx": 1, "precursor_xy": 1, "group_se": 1}
    draws = first_releases(_fit(dpse, small, spec, cons, 1), take)
    d = small.n_features + 1
    xx = draws["precursor_xx"].reshape(-1, d, d)
    np.testing.assert_allclose(xx, xx.transpose(0, 2, 1), rtol=1e-12, atol=1e-9)  # symmetric noise (Analyze Gauss)
    upper = xx[:, np.triu_indices(d)[0], np.triu_indices(d)[1]]
    assert_noise_std(draws["group_counts"], discrete_gaussian_for(count.noise_multiplier), what="group counts")
    assert_noise_std(upper, pre_xx.noise_multiplier * U * U, what="precursor X^T X")
    assert_noise_std(draws["precursor_xy"], pre_xy.noise_multiplier * U, what="precursor X^T Y")
    assert_noise_std(draws["group_se"], se.noise_multiplier, what="residual sums")


def test_the_check_fails_without_noise():
    """The check itself: identical draws (no noise) or a std off by 2x are rejected."""
    rng = np.random.default_rng(0)
    with pytest.raises(AssertionError, match="noise std"):
        assert_noise_std(np.zeros((50, 10)) + rng.normal(size=10), 1.0)
    with pytest.raises(AssertionError, match="noise std"):
        assert_noise_std(rng.normal(0, 2.0, (50, 10)), 1.0)
    assert_noise_std(rng.normal(0, 1.0, (50, 10)), 1.0)


def test_events_used_above_are_the_ones_planned(small):
    """The leaves read above are those the planner composes (no separate tree for the test)."""
    spec = paper_spec(name="raco_dp", batch_size=60, clip_norm=0.25, noise_multiplier=1.5, hist_noise_multiplier=3.0)
    assert raco_dp.step_event(spec, 0.1, constrained=True) == events.raco_step(
        sample_rate=0.1, noise_multiplier=1.5, hist_noise_multiplier=3.0, sampling="independent"
    )
