"""DPSE against its paper's ambiguities (docs/dpse.md): the paired DPSE - DPNoSE gap as the noise
vanishes, the per-group-mean objective of Alg. 2 l. 10, the residual clip of Alg. 1 l. 17 and
theta_1 = the precursor.

The noise of every release is scaled by a factor s (``gaussian_noise`` patched): s -> 0 is
rho -> infinity with everything else fixed (the accountant's floor on the noise multiplier keeps a
real rho finite).  With the pooled objective DPSE and DPNoSE are then the same algorithm (their
directions are both the pooled clipped gradient sum over n), so the paired gap must vanish like s;
a gap that stays as s -> 0 is deterministic: it comes from the objective, not from the noise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.errors import ConfigError
from raco_cli.methods import dpse
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.privacy import releases


def _mixture(seed=0, **kw):
    from raco_cli.data import group_mixture

    return group_mixture.load(**{"K": 3, "sizes": [900, 100, 100], "slopes": [0.0, 3.0, 3.5], "eval_size": 300, "seed": seed, **kw})


def _spec(**options):
    opts = {"bgl_penalty": 0.0, "allocation": "sum", "target_bound": 20.0, "count_noise_multiplier": 5.0, **options}
    return paper_spec(name="dpse", steps=40, noise_multiplier=1.0, clip_norm=2.0, lr=0.5, eval_every=40, selection="last",
                      options=opts)


def _fit(data, spec, seed=0):
    cons = constraints.build("none", n_classes=1, n_groups=data.n_groups, gamma=0.0)
    model = models.build("linear", input_shape=data.input_shape, n_classes=1, options={"bias": False})
    return dpse.fit(data, model, cons, spec, steps=spec.steps, seeds=Seeds.from_seed(seed), device=torch.device("cpu"),
                    reporter=NullReporter())


def _group_mspe(res):
    return np.array(list(res.selected_record.metrics["test"]["group_mspe"].values()))


def _scaled_noise(monkeypatch, scale):
    real = dpse.gaussian_noise

    def noise(shape, std, generator, *, dtype=torch.float32):
        return real(shape, std * scale, generator, dtype=dtype)

    monkeypatch.setattr(dpse, "gaussian_noise", noise)


def _paired_gap(monkeypatch, scale, objective, seeds=range(3)):
    """max over seeds and groups of |MSPE(DPSE) - MSPE(DPNoSE)| (same data, same seed)."""
    _scaled_noise(monkeypatch, scale)
    gaps = []
    for seed in seeds:
        data = _mixture(seed)
        a = _group_mspe(_fit(data, _spec(group_objective=objective), seed))
        b = _group_mspe(_fit(data, _spec(allocation="uniform"), seed))
        gaps.append(np.abs(a - b).max())
    return max(gaps)


def test_paired_dpse_dpnose_gap_vanishes_as_rho_grows(monkeypatch):
    """Pooled objective (the paper's Alg. 3 for DPSE, DPGD for DPNoSE): the gap falls with the
    noise scale and is zero (to float error) without noise."""
    gaps = [_paired_gap(monkeypatch, s, "pooled") for s in (1.0, 1e-2, 1e-4)]
    assert gaps[0] > 1e-3  # the test has teeth: with noise the runs differ
    assert gaps[1] < 0.05 * gaps[0] and gaps[2] < 1e-3 * gaps[0] + 1e-6


def test_a_per_group_mean_objective_leaves_a_gap_without_noise(monkeypatch):
    """Alg. 2 l. 10's reading (each group normalised by its own n_k, f the mean over groups): a
    deterministic gap that survives rho -> infinity, with the paper's sign (the large group 1
    worse, the small groups better) -- the shape of the paper's rho-invariant DPSE column."""
    _scaled_noise(monkeypatch, 0.0)
    data = _mixture(0)
    mean_obj = _group_mspe(_fit(data, _spec(group_objective="group_mean")))
    pooled = _group_mspe(_fit(data, _spec(allocation="uniform")))
    assert mean_obj[0] > pooled[0] * 1.05 and (mean_obj[1:] < pooled[1:] * 0.95).all()


def test_residual_clip_delta_noise_covers_its_sensitivity():
    """residual_clip=delta clips the squared residual at Delta = sqrt(B): the stage-1 sum's noise
    is the printed Delta^2 when Delta >= 1 and Delta's own below 1 (where Delta^2 < Delta)."""
    data = _mixture(0, sizes=[300, 100, 100])
    train = data.splits["train"]
    X = torch.as_tensor(data.X[train], dtype=torch.float32)
    Y = torch.as_tensor(data.target[train])[:, None]
    groups = torch.as_tensor(data.group[train])
    counts = torch.bincount(groups).double()
    nm = {"precursor": 1e-3, "se": 1.7}
    for bound, expected_clip, expected_std in ((4.0, 2.0, 1.7 * 4.0), (0.25, 0.5, 1.7 * 0.5)):
        o = dpse.options(_spec(residual_clip="delta"))
        draws = []
        for i in range(150):
            with releases.recording() as tape:
                _, _, info = dpse.precursor_weights(X, Y, groups, counts, o=o, nm=nm, generator=torch.Generator().manual_seed(i),
                                                    regression=True, bound=bound)
            rec = dict(tape.entries)
            Xt = torch.cat([X.double(), torch.ones(len(X), 1, dtype=torch.float64)], dim=1)
            Xt = Xt * torch.clamp(o["row_bound"] / Xt.norm(dim=1, keepdim=True), max=1.0)
            beta = torch.tensor(info["precursor_beta"], dtype=torch.float64)[:, None]
            r = ((Y.double() - Xt @ beta) ** 2).sum(dim=1).clamp(max=expected_clip)
            draws.append(rec["group_se"] - torch.zeros(3, dtype=torch.float64).index_add_(0, groups, r))
        noise = torch.stack(draws).flatten()
        assert float(noise.std()) == pytest.approx(expected_std, rel=0.1)


def test_init_precursor_starts_from_the_released_precursor_and_replays():
    """theta_1 = beta~ solved from the two noisy precursor releases (post-processing): with a
    vanishing step the run ends there, and a run on other training rows fed the same tape ends on
    the same model."""
    data = _mixture(1)
    spec = _spec(init="precursor")
    spec = paper_spec(**{**spec.__dict__, "lr": 1e-12})
    with releases.recording() as tape:
        res = _fit(data, spec)
    rec = dict(tape.entries)
    d = 2  # [x, 1]
    ridge = res.stats["precursor_ridge"]
    beta = torch.linalg.solve(rec["precursor_xx"] + ridge * torch.eye(d, dtype=torch.float64), rec["precursor_xy"])
    assert float(res.state_dict["1.weight"].flatten()[0]) == pytest.approx(float(beta[0, 0]), rel=1e-5)
    other = _mixture(2)  # other rows, same sizes: the tape stands in for every data access
    with releases.replaying(tape):
        again = _fit(other, spec)
    assert torch.equal(again.state_dict["1.weight"], res.state_dict["1.weight"])


@pytest.mark.parametrize("options,message", [
    ({"group_objective": "sum"}, r"^method.options.group_objective must be one of pooled, group_mean"),
    ({"residual_clip": "Delta"}, r"^method.options.residual_clip must be one of delta_squared, delta"),
    ({"init": "zero"}, r"^method.options.init must be one of model, precursor"),
    ({"init": "precursor", "allocation": "uniform"}, r"^method.options.init=precursor needs stage 1"),
])
def test_bad_ambiguity_options_are_one_line_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        dpse.options(_spec(**options))


def test_init_precursor_needs_regression(synthetic):
    cons = constraints.build("none", n_classes=synthetic.n_classes, n_groups=synthetic.n_groups, gamma=0.0)
    with pytest.raises(ConfigError, match=r"^method.options.init=precursor needs task=regression"):
        dpse.validate(_spec(init="precursor"), cons, synthetic)


def test_group_mean_dpnose_releases_per_group():
    """DPNoSE on the per-group-mean objective cannot release one pooled sum: one release per
    group and step, each at the whole step budget (parallel composition: a record is in one)."""
    data = _mixture(0)
    res = _fit(data, _spec(allocation="uniform", group_objective="group_mean"))
    assert res.releases["gaussian_gradient"] == 40 and not dpse.pooled(_spec(allocation="uniform", group_objective="group_mean"))
    assert math.isfinite(float(_group_mspe(res).mean()))


def test_tailoring_adds_noise_to_the_shared_fit():
    """The structural argument of docs/dpse.md: with sum_k rho_k fixed, group k's gradient noise
    has variance nm_k^2 = nm_stage2^2 / w_k and the shared fit moves with their sum, so DPSE's
    summed stage-2 noise is at least K^2 / (1 - tau/rho) times DPNoSE's one pooled release, and
    more the less even the weights: tailoring adds noise for every group, it cannot remove any."""
    data = _mixture(0)
    tailored = _fit(data, _spec()).stats
    pooled_nm = list(_fit(data, _spec(allocation="uniform")).stats["noise_multipliers"].values())
    w = np.array(list(tailored["budget_weights"].values()))
    nm = np.array(list(tailored["noise_multipliers"].values()))
    k, stage2_share = data.n_groups, 1.0 - 0.2  # tau = se_share * rho
    assert w.sum() == pytest.approx(1.0) and w.max() > 1.5 * w.min()  # the paper's sum rule, really tailored
    np.testing.assert_allclose(nm**2 * w, pooled_nm[0] ** 2 / stage2_share)
    assert (nm**2).sum() / pooled_nm[0] ** 2 > k**2 / stage2_share
