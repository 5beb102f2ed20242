"""DPSE: budget split and accounting (parallel composition), stage 1, refusals."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.errors import ConfigError, UnsupportedError
from raco_cli.methods import dpse
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.planning import plan
from raco_cli.privacy import accountant


def _analytic_gaussian_eps(sigma: float, delta: float) -> float:
    """eps of the Gaussian mechanism (sensitivity 1, noise multiplier sigma) at delta, from the
    exact curve delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma)
    (Balle and Wang 2018, Theorem 8)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def excess(e: float) -> float:
        return norm.cdf(1 / (2 * sigma) - e * sigma) - math.exp(e) * norm.cdf(-1 / (2 * sigma) - e * sigma) - delta

    return float(brentq(excess, 0.0, 200.0, xtol=1e-10))


def _spec(**kw):
    base = dict(name="dpse", steps=50, noise_multiplier=4.0, clip_norm=1.0, lr=1.0, eval_every=10)
    opts = kw.pop("options", {})
    return paper_spec(**{**base, **kw}, options=opts)


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
    # every group's releases (stage 1, then 2 x 15 Gaussians at its realised noise multiplier)
    # are one Gaussian mechanism (rho adds); by the analytic Gaussian mechanism's closed form,
    # not the accountant, the worst group's eps is the planned one and no group's exceeds it
    nm = dpse.noise_multipliers(spec, 15)
    stage1 = nm["count"] ** -2 + 2 * nm["precursor"] ** -2 + nm["se"] ** -2
    eps_groups = [_analytic_gaussian_eps((stage1 + 30 * res.stats["noise_multipliers"][g] ** -2) ** -0.5, 1e-5)
                  for g in ("group0", "group1")]
    planned = accountant.epsilon(dpse.run_event(spec, 1.0, 15), 1e-5)
    assert max(eps_groups) == pytest.approx(planned, rel=2e-3) and min(eps_groups) <= max(eps_groups)
    assert all(e <= planned * (1 + 2e-3) for e in eps_groups)
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


# --- task=regression (the paper's setting) ---------------------------------------------------------


def _mixture(**kw):
    from raco_cli.data import group_mixture

    return group_mixture.load(**{"K": 2, "sizes": [600, 150], "slopes": [0.0, 4.0], "eval_size": 50, "seed": 0, **kw})


def _reg_spec(**kw):
    opts = {"bgl_penalty": 0.0, "allocation": "sum", "target_bound": 20.0, **kw.pop("options", {})}
    base = dict(name="dpse", steps=20, noise_multiplier=2.0, clip_norm=2.0, lr=0.5, eval_every=20, selection="last")
    return paper_spec(**{**base, **kw}, options=opts)


def _fit(data, spec, seed=0):
    cons = constraints.build("none", n_classes=1, n_groups=data.n_groups, gamma=0.0)
    model = models.build("linear", input_shape=data.input_shape, n_classes=1, options={"bias": False})
    return dpse.fit(data, model, cons, spec, steps=spec.steps, seeds=Seeds.from_seed(seed), device=torch.device("cpu"), reporter=NullReporter())


def test_without_the_penalty_each_step_is_one_gradient_release_with_the_whole_step_budget():
    """Alg. 3: no loss release, so a step's budget mu/T goes to the gradient (rho = 1/(2 nm^2))."""
    for allocation in ("sum", "max", "uniform"):
        spec = _reg_spec(options={"allocation": allocation, "count_noise_multiplier": 1e9})
        tau, mu = dpse.budget_split(spec)
        nm = dpse.noise_multipliers(spec, 20)["stage2"]
        assert 20 / (2 * nm**2) == pytest.approx(mu)
        ev = dpse.run_event(spec, 1.0, 20)
        assert isinstance(ev.events[-1].event, dpa.GaussianDpEvent)  # not Composed[gradient, loss]
        assert accountant.epsilon(ev, 1e-5) == pytest.approx(accountant.epsilon(dpa.GaussianDpEvent(2.0), 1e-5), rel=1e-6)
    # the paper's normalisation is accounted at the worst case w = 1, exactly as max
    assert dpse.run_event(_reg_spec(), 1.0, 20) == dpse.run_event(_reg_spec(options={"allocation": "max"}), 1.0, 20)


def test_regression_stage_one_weights_follow_the_squared_residuals():
    """The group the pooled precursor fits badly (slope 4 vs 0) gets the larger s_k; the paper's
    normalisation makes the squares sum to 1, ours makes the largest 1."""
    data = _mixture(sizes=[3000, 1000])
    train = data.splits["train"]
    X = torch.as_tensor(data.X[train], dtype=torch.float32)
    Y = torch.as_tensor(data.target[train])[:, None]
    groups = torch.as_tensor(data.group[train])
    counts = torch.bincount(groups).double()
    nm = {"precursor": 1e-3, "se": 1e-3}
    for allocation in ("sum", "max"):
        o = dpse.options(_reg_spec(options={"allocation": allocation}))
        w, s, info = dpse.precursor_weights(X, Y, groups, counts, o=o, nm=nm, generator=torch.Generator().manual_seed(0),
                                            regression=True, bound=4.0)
        assert info["se_fallback"] == 0.0 and float(s[1]) > float(s[0]) > 0
        assert float(s.max()) <= 2.0  # sqrt of a mean of residuals clipped at B = 4
        assert float(w.sum() if allocation == "sum" else w.max()) == pytest.approx(1.0)
        assert float(w[1] / w[0]) == pytest.approx(float(s[1] ** 2 / s[0] ** 2))


def test_regression_fit_releases_and_reports_budgets():
    data = _mixture()
    res = _fit(data, _reg_spec())
    assert res.releases == {"gaussian_count": 1, "gaussian_precursor": 2, "gaussian_group_se": 1,
                            "gaussian_gradient": 20, "gaussian_group_loss": 0}
    assert sum(res.stats["budget_weights"].values()) == pytest.approx(1.0)
    m = res.selected_record.metrics["test"]
    assert set(m["group_mspe"]) == {"group1", "group2"} and m["mspe"] > 0
    pooled = _fit(data, _reg_spec(options={"allocation": "uniform"}))  # DPNoSE: one release per step, no stage 1
    assert pooled.releases == {"gaussian_count": 1, "gaussian_precursor": 0, "gaussian_group_se": 0,
                               "gaussian_gradient": 20, "gaussian_group_loss": 0}
    bgl = _fit(data, _reg_spec(options={"bgl_penalty": 1.0}))
    assert bgl.releases["gaussian_group_loss"] == 20 and bgl.stats["penalty_active_fraction"] == 1.0
    shares = bgl.stats["penalized_groups"]  # read from the noisy losses: mostly the badly fitted group
    assert shares["group2"] > 0.5 and sum(shares.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("allocation", ["uniform", "sum"])
def test_gradient_noise_has_the_planned_scale(allocation):
    """The noise of every stage-2 release (release minus the exact clipped sum, the model held still
    by a tiny step) has std nm_k * C with nm_k = nm / sqrt(w_k): pooled for DPNoSE, per group for DPSE."""
    from raco_cli.privacy import releases

    data = _mixture(sizes=[400, 100], P=4, slopes=[[0, 0, 0, 0], [1, 2, 3, 4]])
    spec = _reg_spec(steps=150, lr=1e-12, options={"allocation": allocation})
    with releases.recording() as tape:
        res = _fit(data, spec)
    kind = "gradient" if allocation == "uniform" else "group_gradient"
    draws = [v[0].flatten() for k, v in tape.entries if k == kind]
    model = models.build("linear", input_shape=data.input_shape, n_classes=1, options={"bias": False})
    model.load_state_dict(res.state_dict)
    from raco_cli.methods import training
    from raco_cli.methods.gradients import engine_for

    engine = engine_for(model, micro_batch=64, loss="squared")
    train = np.asarray(data.splits["train"])
    rows = training.Rows(data, train, data.group[train], torch.device("cpu"))
    nm = dpse.noise_multipliers(spec, 150)["stage2"]
    if allocation == "uniform":
        exact = [engine.clipped_sum(**rows.batch(torch.arange(len(train)), labels=True), reg_scale=0.0, temperature=1.0, clip_norm=2.0).grads[0].flatten()]
        stds = [nm * 2.0]
    else:
        idx = [torch.as_tensor(np.flatnonzero(data.group[train] == k)) for k in range(2)]
        exact = [engine.clipped_sum(**rows.batch(i, labels=True), reg_scale=0.0, temperature=1.0, clip_norm=2.0).grads[0].flatten() for i in idx]
        stds = [res.stats["noise_multipliers"][g] * 2.0 for g in ("group1", "group2")]
        assert stds[0] > stds[1]  # the badly fitted group gets more budget, less noise
    groups = len(exact)
    for k in range(groups):
        noise = torch.stack([d - exact[k] for d in draws[k::groups]])
        assert float(noise.std()) == pytest.approx(stds[k], rel=0.15)
        assert abs(float(noise.mean())) < 4 * stds[k] / math.sqrt(noise.numel())


def test_stage_one_releases_have_the_planned_noise():
    """The precursor's X^T X (symmetric, sensitivity U^2) and X^T Y (U V) and the group sums of
    squared residuals (B): each recorded release minus its exact value has std nm * sensitivity."""
    from raco_cli.privacy import releases

    data = _mixture(sizes=[300, 100], P=3, slopes=[[0, 0, 0], [1, 2, 3]])
    train = data.splits["train"]
    X = torch.as_tensor(data.X[train], dtype=torch.float32)
    Y = torch.as_tensor(data.target[train])[:, None]
    groups = torch.as_tensor(data.group[train])
    counts = torch.bincount(groups).double()
    o = dpse.options(_reg_spec(options={"row_bound": 2.0, "target_bound": 3.0}))
    nm = {"precursor": 0.7, "se": 1.3}
    U, V, B = 2.0, 3.0, 4.0
    Xt = torch.cat([X.double(), torch.ones(len(X), 1, dtype=torch.float64)], dim=1)
    Xt = Xt * torch.clamp(U / Xt.norm(dim=1, keepdim=True), max=1.0)
    noise: dict[str, list[torch.Tensor]] = {"precursor_xx": [], "precursor_xy": [], "group_se": []}
    for i in range(150):
        with releases.recording() as tape:
            dpse.precursor_weights(X, Y, groups, counts, o=o, nm=nm, generator=torch.Generator().manual_seed(i),
                                   regression=True, bound=B)
        rec = dict(tape.entries)
        ridge = 3.0 * nm["precursor"] * U * U * math.sqrt(4)  # the automatic public ridge, d = 4
        beta = torch.linalg.solve(rec["precursor_xx"] + ridge * torch.eye(4, dtype=torch.float64), rec["precursor_xy"])
        r = ((Y.double() - Xt @ beta) ** 2).sum(dim=1).clamp(max=B)
        exact_s = torch.zeros(2, dtype=torch.float64).index_add_(0, groups, r)
        noise["precursor_xx"].append(torch.triu(rec["precursor_xx"] - Xt.t() @ Xt)[torch.triu(torch.ones(4, 4)) > 0])
        noise["precursor_xy"].append((rec["precursor_xy"] - Xt.t() @ Y.double().clamp(-V, V)).flatten())
        noise["group_se"].append(rec["group_se"] - exact_s)
    for kind, std in (("precursor_xx", 0.7 * U * U), ("precursor_xy", 0.7 * U * V), ("group_se", 1.3 * B)):
        assert float(torch.cat(noise[kind]).std()) == pytest.approx(std, rel=0.12), kind
