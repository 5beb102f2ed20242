"""DPSE: budget split and accounting (parallel composition), stage 1, refusals."""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
import torch

from raco_cli import constraints, models
from raco_cli.errors import ConfigError, UnsupportedError
from raco_cli.methods import dpse
from raco_cli.methods.base import MethodSpec, NullReporter, Seeds
from raco_cli.methods.planning import plan
from raco_cli.privacy import accountant


def _spec(**kw):
    base = dict(name="dpse", steps=50, noise_multiplier=4.0, clip_norm=1.0, lr=1.0, eval_every=10)
    opts = kw.pop("options", {})
    return MethodSpec(**{**base, **kw}, options=opts)


def test_the_run_is_one_gaussian_of_the_run_noise_multiplier():
    """rho adds over Gaussians: stage 1 (tau) + stage 2 (mu) = 1 / (2 sigma_run^2), for any T and split."""
    for share, T in ((0.2, 50), (0.5, 7)):
        spec = _spec(steps=T, options={"se_share": share, "count_noise_multiplier": 1e9})
        tau, mu = dpse.budget_split(spec)
        assert tau + mu == pytest.approx(1 / (2 * 4.0**2)) and tau == pytest.approx(share * (tau + mu))
        eps = accountant.epsilon(dpse.run_event(spec, 1.0, T), 1e-5)
        assert eps == pytest.approx(accountant.epsilon(dpa.GaussianDpEvent(4.0), 1e-5), rel=1e-6)
    # the event tree lists each release a worst-case record takes part in
    ev = dpse.run_event(_spec(), 1.0, 50)
    kinds = [type(e).__name__ for e in ev.events]
    assert kinds == ["GaussianDpEvent"] * 4 + ["SelfComposedDpEvent"] and ev.events[-1].count == 50


def test_uniform_allocation_has_no_stage_one():
    spec = _spec(options={"allocation": "uniform"})
    assert dpse.budget_split(spec) == (0.0, pytest.approx(1 / 32))
    assert len(dpse.run_event(spec, 1.0, 50).events) == 2  # counts + stage 2


def test_plan_calibrates_the_noise_to_the_budget():
    spec = _spec(calibrate_noise=True)
    p = plan(dpse, spec, n_train=1000, eps=1.0, delta=1e-5, constrained=False)
    assert p.sample_rate == 1.0 and p.steps == 50
    assert 0.99 <= p.eps_planned <= 1.0


def test_stage_one_weights_follow_the_residuals():
    """A group the precursor fits badly gets the larger standard error and the full budget (w = 1)."""
    gen = torch.Generator().manual_seed(0)
    n = 6000
    X = torch.randn(n, 3, generator=gen)
    groups = (torch.rand(n, generator=gen) < 0.3).long()
    logit = 3 * X[:, 0]
    noisy = torch.rand(n, generator=gen) < 0.5  # group 1: labels are coin flips (residual ~ 1/4)
    y = torch.where((groups == 1) & noisy, torch.randint(0, 2, (n,), generator=gen), (torch.rand(n, generator=gen) < torch.sigmoid(logit)).long())
    counts = torch.bincount(groups, minlength=2).double()
    o = dpse.options(_spec())
    nm = {"precursor": 1e-3, "se": 1e-3}  # (almost) noiseless
    Y = torch.nn.functional.one_hot(y, 2)
    w, s, info = dpse.precursor_weights(X, Y, groups, counts, o=o, nm=nm, generator=torch.Generator().manual_seed(1))
    assert info["se_fallback"] == 0.0
    assert float(w.max()) == 1.0 and float(w[1]) == 1.0 and float(w[0]) < 1.0
    assert 0 < float(s[0]) < float(s[1]) <= 1.0


def test_fit_reports_per_group_budgets_and_survives_noise(synthetic):
    cons = constraints.build("none", n_classes=2, n_groups=2, gamma=0.0)
    model = models.build("logreg", input_shape=synthetic.input_shape, n_classes=2)
    spec = _spec(steps=15, noise_multiplier=3.0)
    res = dpse.fit(synthetic, model, cons, spec, steps=15, seeds=Seeds.from_seed(0), device=torch.device("cpu"), reporter=NullReporter())
    w = [res.stats["budget_weights"]["group0"], res.stats["budget_weights"]["group1"]]
    assert max(w) == 1.0 and min(w) > 0
    nm2 = dpse.noise_multipliers(spec, 15)["stage2"]
    for g, wg in zip(("group0", "group1"), w):
        assert res.stats["noise_multipliers"][g] == pytest.approx(nm2 / math.sqrt(wg))
    assert res.releases == {"gaussian_count": 1, "gaussian_precursor": 2, "gaussian_group_se": 1,
                            "gaussian_gradient": 15, "gaussian_group_loss": 15}
    assert all(torch.isfinite(v).all() for v in res.state_dict.values())
    assert all(abs(float(v)) <= 5.0 for p in res.state_dict.values() for v in p.flatten())  # the box C_P


def test_refusals():
    dp = constraints.build("dp", n_classes=2, n_groups=2, gamma=0.05)
    none = constraints.build("none", n_classes=2, n_groups=2, gamma=0.0)
    with pytest.raises(UnsupportedError) as exc:
        dpse.validate(_spec(), dp)
    assert str(exc.value) == (
        "method=dpse does not model the rate constraint 'dp' (its fairness notion is bounded group loss, "
        "set by method.options.bgl_penalty and bgl_eta). Use constraint=none."
    )
    with pytest.raises(ConfigError, match=r"^method.steps must be set for dpse"):
        dpse.validate(_spec(steps=None), none)
    with pytest.raises(ConfigError, match=r"^method.options.se_share must be in \(0, 1\)"):
        dpse.validate(_spec(options={"se_share": 1.0}), none)
