"""``method.lr_dual=auto`` (raco_cli.run.prepare.suggested_lr_dual): the dual step at which the
histograms' Laplace noise moves lambda by about DUAL_WALK (one sd) over the run.  Checked against
a Monte-Carlo walk of the dual driven by noisy histograms computed here, not by raco's step."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from raco_cli.constraints.families import demographic_parity
from raco_cli.constraints.rate import ConstraintSet
from raco_cli.methods.sgda import raco_dp, sgda
from raco_cli.run.prepare import DUAL_WALK, suggested_lr_dual


def _cons() -> ConstraintSet:
    return ConstraintSet.build(demographic_parity(n_classes=2, n_groups=2, gamma=0.05), n_classes=2, n_groups=2)


def _plan(batch: int, n: float, steps: int, b: float = 12.0) -> SimpleNamespace:
    return SimpleNamespace(spec=SimpleNamespace(hist_noise_multiplier=b), sample_rate=batch / n, steps=steps)


def _walk_sd(cons: ConstraintSet, cells: np.ndarray, plan: SimpleNamespace, lr_dual: float, reps: int = 4000) -> float:
    """sd over runs of lr_dual * sum_t (Gamma(H_t) - E Gamma): H_t the expected (group, class)
    counts of a Poisson batch plus Laplace(b) noise on every count (the released histogram),
    rates read as counts / max(total, 1) clipped to [0, 1] (constraints.rate)."""
    rng = np.random.default_rng(0)
    p = 0.3  # each group's predicted positive share: every true gap is 0, so only noise moves lambda
    expected = plan.sample_rate * cells[:, None] * np.array([1 - p, p])[None, :]  # (Q, K)
    H = expected[None, None] + rng.laplace(0.0, plan.spec.hist_noise_multiplier, size=(reps, plan.steps, *expected.shape))
    denom = np.maximum(np.einsum("mq,rtqk->rtm", cons.membership, H), 1.0)
    rates = (np.einsum("mq,rtqk->rtmk", cons.membership, H) / denom[..., None]).clip(0.0, 1.0)
    gam = np.einsum("rtmk,jmk->rtj", rates, cons.alpha)
    walk = lr_dual * (gam - gam.mean(axis=(0, 1))).sum(axis=1)  # (reps, J)
    return float(walk.std(axis=0).max())


@pytest.mark.parametrize("cells,batch,steps", [
    (np.array([1300.0, 218.0]), 128, 65),  # Hdma-like: 14 rows of the small group per batch
    (np.array([3200.0, 545.0]), 256, 98),  # Parkinsons-sized
    (np.array([19300.0, 9500.0]), 1024, 417),  # Adult-sized
])  # fmt: skip
def test_the_dual_walk_driven_by_histogram_noise_has_about_the_planned_sd(cells, batch, steps):
    cons = _cons()
    plan = _plan(batch, cells.sum(), steps)
    lr = suggested_lr_dual(SimpleNamespace(scope="model"), raco_dp, plan, cons, cells)
    assert 0.0 < lr < 1.0
    sd = _walk_sd(cons, cells, plan, lr)
    # the delta method ignores the clipping of rates to [0, 1] (which only shrinks the noise of a
    # small group's rate: 0.10 and 0.15 here on the small tables) and the denominator's noise,
    # and bounds each class's count separately (margin.noise_sd is an upper bound): the walk is
    # at most DUAL_WALK, and the same order where no rate is clipped (0.18 here: not vacuous)
    assert sd <= 1.1 * DUAL_WALK, sd
    if cells.min() > 5000:
        assert sd >= 0.4 * DUAL_WALK, sd
    # the fixed step 1.0 it replaces: a walk of several units of lambda on the small table
    if cells.min() < 1000:
        assert _walk_sd(cons, cells, plan, 1.0, reps=500) > 1.0


def test_smaller_groups_get_a_smaller_dual_step_and_no_noise_keeps_one():
    cons, model = _cons(), SimpleNamespace(scope="model")
    small = suggested_lr_dual(model, raco_dp, _plan(128, 1518, 65), cons, np.array([1300.0, 218.0]))
    large = suggested_lr_dual(model, raco_dp, _plan(128, 1518, 65), cons, np.array([1300.0, 436.0]))
    assert small < large < 1.0
    huge = np.array([1e7, 1e7])
    assert suggested_lr_dual(model, raco_dp, _plan(10**6, 2e7, 400), cons, huge) == 1.0  # capped at 1
    cells = np.array([1300.0, 218.0])
    assert suggested_lr_dual(SimpleNamespace(scope="paper"), raco_dp, _plan(128, 1518, 65), cons, cells) == 1.0  # the figures' value
    assert suggested_lr_dual(model, sgda, _plan(128, 1518, 65), cons, cells) == 1.0  # exact histograms: no noise
    assert suggested_lr_dual(model, raco_dp, _plan(128, 1518, 65, b=0.0), cons, cells) == 1.0
    assert suggested_lr_dual(model, raco_dp, _plan(128, 1518, 65), cons, None) == 1.0
