"""DP-FERMI: closed-form gradients against autograd, the ERMI maximiser, accounting, refusals."""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from specs import paper_spec
from torch import nn

from raco_cli import constraints, models
from raco_cli.constraints.rate import ConstraintSet, RateConstraint, RateTerm
from raco_cli.errors import ConfigError, UnsupportedError
from raco_cli.methods import dp_fermi
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.gradients import LinearEngine
from raco_cli.privacy import accountant


def _psi(F, g, W, s):
    """psi_i written directly from the trace form of the paper (eq. 2), one row at a time."""
    k, _ = W.shape
    out = []
    for i in range(len(F)):
        e_s = torch.nn.functional.one_hot(g[i], k).to(F.dtype)
        quad = torch.trace(W @ torch.diag(F[i]) @ W.t())
        cross = torch.trace(W @ torch.outer(F[i], e_s) @ torch.diag(s))  # W E[yhat s^T] P_s^{-1/2}
        out.append(-quad + 2 * cross - 1)
    return torch.stack(out)


def _setup(seed=0, b=7, k=3, n_cls=2, d=5):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(b, d, generator=gen, dtype=torch.float64)
    y = torch.randint(0, n_cls, (b,), generator=gen)
    g = torch.randint(0, k, (b,), generator=gen)
    W = torch.randn(k, n_cls, generator=gen, dtype=torch.float64)
    p = torch.rand(k, generator=gen, dtype=torch.float64) + 0.2
    s = 1.0 / torch.sqrt(p / p.sum())
    return X, y, g, W, s


def test_closed_form_psi_matches_the_trace_form():
    X, _, g, W, s = _setup()
    F = torch.softmax(torch.randn(len(X), 2, dtype=torch.float64), dim=1)
    direct = _psi(F, g, W, s)
    closed = (F * dp_fermi.psi_cell_weights(W, s).index_select(0, g)).sum(dim=1) - 1
    torch.testing.assert_close(closed, direct)


@pytest.mark.parametrize("clip", [1e-3, 0.5, 1e6])
def test_w_gradient_sum_matches_autograd_with_clipping(clip):
    X, _, g, W, s = _setup(seed=1)
    F = torch.softmax(torch.randn(len(X), 2, dtype=torch.float64), dim=1)
    expected, expected_clipped = torch.zeros_like(W), 0
    for i in range(len(X)):
        Wi = W.clone().requires_grad_(True)
        (gi,) = torch.autograd.grad(_psi(F[i : i + 1], g[i : i + 1], Wi, s).sum(), Wi)
        expected += gi * min(1.0, clip / float(gi.norm()))
        expected_clipped += int(float(gi.norm()) > clip)
    got, n_clipped = dp_fermi.w_gradient_sum(F, g, W, s, clip)
    torch.testing.assert_close(got, expected)
    assert int(n_clipped) == expected_clipped
    assert expected_clipped == {1e-3: len(X), 1e6: 0}.get(clip, expected_clipped)  # the extremes clip all / none


def test_theta_gradient_of_the_engine_matches_autograd():
    X, y, g, W, s = _setup(seed=2)
    X, W, s = X.float(), W.float(), s.float()
    lam, clip = 1.7, 0.8
    layer = nn.Linear(X.shape[1], 2)
    got = LinearEngine(layer).clipped_sum(
        X, y, dp_fermi.psi_cell_weights(W, s).index_select(0, g), reg_scale=lam, temperature=1.0, clip_norm=clip
    ).grads
    expected = [torch.zeros_like(p) for p in layer.parameters()]
    for i in range(len(X)):
        layer.zero_grad()
        z = layer(X[i : i + 1])
        obj = nn.functional.cross_entropy(z, y[i : i + 1]) + lam * _psi(torch.softmax(z, dim=1), g[i : i + 1], W, s).sum()
        grads = torch.autograd.grad(obj, list(layer.parameters()))
        norm = float(torch.sqrt(sum((gr**2).sum() for gr in grads)))
        for acc, gr in zip(expected, grads):
            acc += gr * min(1.0, clip / norm)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_max_over_w_is_the_ermi_of_the_soft_predictions():
    """W*[r, j] = P(j, r) / (sqrt(p_r) p_j) maximises mean psi; the maximum is the ERMI."""
    gen = torch.Generator().manual_seed(3)
    n, k = 4000, 2
    g = torch.randint(0, k, (n,), generator=gen)
    F = torch.softmax(torch.randn(n, 2, generator=gen, dtype=torch.float64) + 1.5 * g[:, None] * torch.tensor([0.0, 1.0], dtype=torch.float64), dim=1)
    p = torch.bincount(g, minlength=k).double() / n
    s = 1 / torch.sqrt(p)
    Pjr = torch.stack([F[g == r].sum(0) / n for r in range(k)])  # (k, l): P(yhat = j, s = r)
    pj = F.mean(0)
    W_star = Pjr / (torch.sqrt(p)[:, None] * pj[None, :])
    ermi = (Pjr**2 / (p[:, None] * pj[None, :])).sum() - 1
    mean_psi = lambda W: ((F * dp_fermi.psi_cell_weights(W, s).index_select(0, g)).sum(1) - 1).mean()  # noqa: E731
    assert float(mean_psi(W_star)) == pytest.approx(float(ermi), rel=1e-9)
    G, _ = dp_fermi.w_gradient_sum(F, g, W_star, s, 1e9)
    assert float(G.abs().max()) < 1e-9 * n  # stationary
    W = torch.zeros_like(W_star)  # projected ascent converges to W*
    for _ in range(300):
        G, _ = dp_fermi.w_gradient_sum(F, g, W, s, 1e9)
        W = dp_fermi.project_ball(W + 0.5 * G / n, 100.0)
    torch.testing.assert_close(W, W_star, rtol=1e-6, atol=1e-8)
    # the full two-class ERMI of a binary task is Var_r(P(1|r)) * (1/p_0 + 1/p_1) (notes, section 1)
    rate = torch.stack([F[g == r, 1].mean() for r in range(k)])
    var = (p * (rate - (p * rate).sum()) ** 2).sum()
    assert float(ermi) == pytest.approx(float(var * (1 / pj[0] + 1 / pj[1])), rel=1e-9)


def _spec(**opts):
    return paper_spec(name="dp_fermi", batch_size=100, noise_multiplier=3.0, clip_norm=1.0, options=opts)


def test_events_two_gaussians_on_one_sample_plus_private_counts():
    spec = _spec(lam=1.0, noise_multiplier_w=4.0, count_noise_multiplier=50.0)
    ev = dp_fermi.run_event(spec, 0.02, 100)
    assert ev == dpa.ComposedDpEvent([
        dpa.GaussianDpEvent(50.0),
        dpa.SelfComposedDpEvent(
            dpa.PoissonSampledDpEvent(0.02, dpa.ComposedDpEvent([dpa.GaussianDpEvent(3.0), dpa.GaussianDpEvent(4.0)])), 100
        ),
    ])
    # the joint release equals one subsampled Gaussian with sigma = (3^-2 + 4^-2)^-1/2 = 2.4
    joint = dpa.ComposedDpEvent([dpa.GaussianDpEvent(50.0), dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(2.4)), 100)])
    assert accountant.epsilon(ev, 1e-5) == pytest.approx(accountant.epsilon(joint, 1e-5), rel=1e-6)
    # public proportions: no count release; lam = 0: DP-SGD
    assert dp_fermi.run_event(_spec(group_proportions=[0.6, 0.4]), 0.02, 100) == dpa.SelfComposedDpEvent(
        dp_fermi.step_event(_spec(), 0.02), 100
    )
    assert dp_fermi.run_event(_spec(lam=0.0), 0.02, 100) == dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(3.0)), 100
    )


def test_lambda_zero_is_dp_sgd(synthetic):
    from raco_cli.methods.sgda import dp_sgd

    cons = constraints.build("dp", n_classes=2, n_groups=2, gamma=0.05)
    out = []
    for mod, spec in ((dp_fermi, _spec(lam=0.0)), (dp_sgd, paper_spec(name="dp_sgd", batch_size=100, noise_multiplier=3.0, clip_norm=1.0))):
        model = models.build("logreg", input_shape=synthetic.input_shape, n_classes=2)
        res = mod.fit(synthetic, model, cons, spec, steps=30, seeds=Seeds.from_seed(0), device=torch.device("cpu"), reporter=NullReporter())
        out.append(res)
    for k in out[0].state_dict:
        torch.testing.assert_close(out[0].state_dict[k], out[1].state_dict[k])
    assert out[0].releases == {"gaussian_gradient": 30, "gaussian_gradient_w": 0, "gaussian_count": 0}


def test_group_proportions_private_and_public():
    gen = torch.Generator().manual_seed(0)
    groups = np.array([0] * 700 + [1] * 300)
    p, n_rel = dp_fermi.group_proportions(groups, 2, dp_fermi.options(_spec(count_noise_multiplier=5.0)), gen)
    assert n_rel == 1 and p.sum() == pytest.approx(1.0) and abs(p[0] - 0.7) < 0.05
    p, n_rel = dp_fermi.group_proportions(groups, 2, dp_fermi.options(_spec(group_proportions=[2, 2])), gen)
    assert n_rel == 0 and list(p) == [0.5, 0.5]


def test_refusals():
    cons = constraints.build("dp", n_classes=2, n_groups=2, gamma=0.05)
    eo_like = ConstraintSet.build(
        [RateConstraint("tpr", (RateTerm(frozenset({(1, 0)}), 1, 1.0), RateTerm(frozenset({(1, 1)}), 1, -1.0)), 0.05, family="eo")],
        n_classes=2, n_groups=2,
    )
    with pytest.raises(UnsupportedError, match=r"^method=dp_fermi does not model the rate constraint family 'eo'"):
        dp_fermi.validate(_spec(), eo_like)
    with pytest.raises(ConfigError, match=r"method.options.lam must be >= 0"):
        dp_fermi.validate(_spec(lam=-1.0), cons)
    with pytest.raises(ConfigError, match=r"group_proportions must be 'private' or a list"):
        dp_fermi.validate(_spec(group_proportions="census"), cons)


def test_unknown_option_is_one_line():
    cons = constraints.build("dp", n_classes=2, n_groups=2, gamma=0.05)
    with pytest.raises(ConfigError) as exc:
        dp_fermi.validate(_spec(gamma=0.05), cons)
    assert str(exc.value) == (
        "Unknown key method.options.gamma for method dp_fermi. Allowed: clip_norm_w, count_floor, "
        "count_noise_multiplier, group_proportions, lam, noise_multiplier_w, w_radius."
    )


def test_w_gradient_drops_rows_with_non_finite_probabilities():
    """An infinite logit makes softmax NaN; that row is dropped from the W gradient as the theta
    path drops it (a NaN in the released sum would be an unbounded sensitivity)."""
    torch.manual_seed(0)
    z = torch.randn(6, 2)
    z[2, 0] = float("inf")
    F = torch.softmax(z, dim=1)
    assert not torch.isfinite(F[2]).all()
    g = torch.tensor([0, 1, 0, 1, 1, 0])
    W, s = torch.randn(2, 2), torch.tensor([1.3, 1.7])
    G, _ = dp_fermi.w_gradient_sum(F, g, W, s, clip_norm=0.5)
    keep = torch.tensor([0, 1, 3, 4, 5])
    G_kept, _ = dp_fermi.w_gradient_sum(F[keep], g[keep], W, s, clip_norm=0.5)
    assert torch.isfinite(G).all() and torch.allclose(G, G_kept)
