"""Histogram noise is drawn independently for every cell (q, k), for every constraint family.

The public reference code draws one Laplace variable per cell q and shares it across the
predicted-class axis k for EO/FNR histograms: the released ``H[q, k] - H[q, k']`` is then
noise-free and leaks.  These tests record the noisy histograms a real RaCO-DP run releases
(what the dual/primal post-processing reads, the ``dual_inputs`` fixture) and check that
the noise in every pair of cells is uncorrelated; they fail on the broken shared variant.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.sgda import raco_dp

SCALE = 1e4  # Laplace scale >> any exact count of a ~50-row batch: the released H is ~pure noise
STEPS = 200  # fast suite; the slow variant below runs 1500 steps for every family


def released_histograms(seen: list, data, family: str, options: dict | None = None, steps: int = STEPS) -> np.ndarray:
    """The noisy histograms (steps, Q*K) a raco_dp run feeds to its post-processing (``seen``:
    the ``dual_inputs`` fixture)."""
    cons = constraints.build(family, n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.05, options=options)
    model = models.build("logreg", input_shape=data.input_shape, n_classes=data.n_classes)
    spec = paper_spec(name="raco_dp", batch_size=50, noise_multiplier=1.0, hist_noise_multiplier=SCALE, clip_norm=1.0,
                      lr_dual=0.0, eval_every=10**6, selection="last")  # fmt: skip
    raco_dp.fit(data, model, cons, spec, steps=steps, seeds=Seeds.from_seed(0), device=torch.device("cpu"), reporter=NullReporter())
    return torch.stack(seen).reshape(len(seen), -1).numpy()


def assert_independent_cells(draws: np.ndarray, K: int = 2) -> None:
    """Every cell carries Laplace(SCALE) noise (std sqrt(2) b), no two cells are correlated,
    and the difference of two classes of one cell is as noisy as two independent draws."""
    n = len(draws)
    # Laplace kurtosis 6: the sample std has relative sd ~ sqrt(5 / (4 n)); allow 5 of them
    rtol = 5 * math.sqrt(5 / (4 * n))
    np.testing.assert_allclose(draws.std(axis=0), math.sqrt(2) * SCALE, rtol=rtol)
    corr = np.corrcoef(draws.T)[~np.eye(draws.shape[1], dtype=bool)]
    # the sample correlation of independent cells has sd ~1/sqrt(n): allow 5 of them
    assert np.abs(corr).max() < 5 / math.sqrt(n), f"correlated histogram noise: max |corr| = {np.abs(corr).max():.3f}"
    per_cell = draws.reshape(n, -1, K)
    diff = per_cell[:, :, 0] - per_cell[:, :, 1]  # what the shared-draw defect leaves noise-free
    np.testing.assert_allclose(diff.std(axis=0), 2 * SCALE, rtol=rtol)


CASES = [("eo", None)]  # fnr, eop, ... run in the slow variant; fnr also inside the combination below
ALL_CASES = [("eo", None), ("fnr", None), ("fnr", {"positive_class": 1}), ("fpr", None), ("eop", None), ("dp", None)]


@pytest.mark.parametrize("family,options", CASES)
def test_released_histogram_noise_is_independent_per_cell(engine, dual_inputs, synthetic, family, options):
    draws = released_histograms(dual_inputs, synthetic, family, options)
    cons = constraints.build(family, n_classes=2, n_groups=synthetic.n_groups, gamma=0.05)
    assert draws.shape == (STEPS, cons.Q * cons.K)  # every (cell, class) entry released
    assert_independent_cells(draws)


@pytest.mark.slow
@pytest.mark.parametrize("family,options", ALL_CASES)
def test_released_histogram_noise_is_independent_per_cell_long(dual_inputs, synthetic, family, options):
    draws = released_histograms(dual_inputs, synthetic, family, options, steps=1500)
    assert_independent_cells(draws)


def test_the_check_catches_noise_shared_across_the_class_axis(engine, dual_inputs, synthetic):
    """The reference code's defect (one draw per cell q, broadcast over the class axis k: the
    audit's broken mechanism of that name, in both engines) fails the check."""
    from raco_cli.audit.faults import histogram_mechanism

    with histogram_mechanism("broken_shared_class_noise"):
        draws = released_histograms(dual_inputs, synthetic, "eo")
    with pytest.raises(AssertionError, match="correlated histogram noise"):
        assert_independent_cells(draws)
    # the leak itself: H[q, 0] - H[q, 1] carries no noise at all (only the exact batch counts)
    Q = draws.shape[1] // 2
    diff = draws.reshape(STEPS, Q, 2)[:, :, 0] - draws.reshape(STEPS, Q, 2)[:, :, 1]
    assert np.abs(diff).max() < 1000 < SCALE


def test_combination_noise_is_independent_per_cell(engine, dual_inputs, synthetic):
    """dp+fnr: one histogram over the common refinement (label x group), every cell noised."""
    seen = dual_inputs
    parts = [constraints.part_spec("dp", {"gamma": 0.05}, key="c"), constraints.part_spec("fnr", {"gamma": 0.2}, key="c")]
    cons = constraints.build_parts(parts, n_classes=2, n_groups=synthetic.n_groups)
    model = models.build("logreg", input_shape=synthetic.input_shape, n_classes=2)
    spec = paper_spec(name="raco_dp", batch_size=50, noise_multiplier=1.0, hist_noise_multiplier=SCALE, clip_norm=1.0,
                      lr_dual=0.0, eval_every=10**6, selection="last")  # fmt: skip
    raco_dp.fit(synthetic, model, cons, spec, steps=STEPS, seeds=Seeds.from_seed(1), device=torch.device("cpu"), reporter=NullReporter())
    draws = torch.stack(seen).reshape(len(seen), -1).numpy()
    assert draws.shape == (STEPS, 4 * 2)  # Q = 4 (label x group), K = 2
    assert_independent_cells(draws)
