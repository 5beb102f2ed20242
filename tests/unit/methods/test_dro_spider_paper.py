"""The SPIDER methods as the DP-DRO paper sets them: adaptive correction clip norms, the noise of
each release family, full refreshes, Theorem 7's phase, clip fractions, the normalised step,
the bounded dual and the clipped references.

Expected values are computed here from first principles (the formulas of the paper and of the
allocation rule, written out again), not by the functions under test, and every release the
loop makes is compared with them and with the accounted DpEvent tree: the noise a release gets
is ``multiplier x its clip norm``, its batch is drawn at the accounted rate, and the clip norm of
a correction is ``max(floor, scale |iterate difference|)`` of the released iterates.
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, methods, models
from raco_cli.errors import ConfigError
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.dro import common as dro_common
from raco_cli.methods.planning import plan, run_event
from raco_cli.objectives import ObjectiveSpec
from raco_cli.privacy import accountant

KL = ObjectiveSpec("dro", divergence="kl", rho=0.5, lam=1.0)
STEPS, PHASE, B = 12, 5, 64


@pytest.fixture(scope="module")
def small():
    from raco_cli.data import synthetic

    return synthetic.load(n=600, n_features=4, seed=5)


def _spec(name, data, **kw):
    options = {**({"phase": PHASE} if "spider" in name else {}), **kw.pop("options", {})}
    base = dict(name=name, batch_size=B, steps=STEPS, max_steps=STEPS, eval_every=1, lr=0.3, lr_dual=0.05, objective=KL,
                selection="last", scope="paper", clip_norm=1.0, noise_multiplier=2.0, hist_noise_multiplier=None,
                calibrate_noise=False, options=options)
    base.update(kw)
    if not methods.get(name).PRIVATE:
        base.update(noise_multiplier=None)
    return paper_spec(**base)


def _fit(name, data, spec, seed=0):
    cons = constraints.build("none", n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.05)
    model = models.build("logreg", input_shape=data.input_shape, n_classes=data.n_classes)
    return methods.get(name).fit(data, model, cons, spec, steps=spec.steps, seeds=Seeds.from_seed(seed), device=torch.device("cpu"),
                                 reporter=NullReporter())


def _observe(monkeypatch):
    """Every release: (kind, Poisson rate of its batch, clip norm, noise std); every step's
    iterate (x_t, before the step) and every recorded dual block (eval_every=1)."""
    seen: dict = {"releases": [], "x": [], "dual": [], "rate": None}
    sample, gaussian, step, record = (dro_common.DroRun.sample, dro_common.DroRun.gaussian, dro_common.DroRun.step,
                                      dro_common.DroRun.record)

    def on_sample(self, rate, *, primal=False):
        seen["rate"] = rate
        return sample(self, rate, primal=primal)

    def on_gaussian(self, release, sums, *, clip=None):
        c = release.clip if clip is None else clip
        stds = []
        real = dro_common.gaussian_noise

        def noise(shape, std, g, *, dtype=torch.float32):
            stds.append(std)
            return real(shape, std, g, dtype=dtype)

        dro_common.gaussian_noise = noise
        try:
            out = gaussian(self, release, sums, clip=clip)
        finally:
            dro_common.gaussian_noise = real
        seen["releases"].append((release.kind, seen["rate"], c, stds[0] if stds else None))
        return out

    def on_step(self, direction, *, max_step=0.0):
        seen["x"].append(torch.cat([p.detach().double().flatten().clone() for p in self.engine.params]))
        return step(self, direction, max_step=max_step)

    def on_record(self, t, dual):
        seen["dual"].append(torch.tensor(dual, dtype=torch.float64))
        return record(self, t, dual)

    monkeypatch.setattr(dro_common.DroRun, "sample", on_sample)
    monkeypatch.setattr(dro_common.DroRun, "gaussian", on_gaussian)
    monkeypatch.setattr(dro_common.DroRun, "step", on_step)
    monkeypatch.setattr(dro_common.DroRun, "record", on_record)
    return seen


def _expected_multiplier(z, rate, count, rule):
    """The allocation rules of docs/dro.md, written out again."""
    if rule == "theorem":  # Theorem 5 per family: z max(1, r sqrt(k))
        return z * max(1.0, rate * math.sqrt(count))
    if rate == 1.0:  # equal mu-GDP shares: a full-batch family of k Gaussians is sqrt(k)/sigma-GDP
        return z * math.sqrt(count)
    # r sqrt(k (exp(1/sigma^2) - 1)) = 1/z
    return 1.0 / math.sqrt(math.log(1.0 + 1.0 / (z**2 * rate**2 * count)))


def _leaves(event):
    """(Poisson rate, noise multiplier, count) of every Gaussian leaf, in tree order."""
    from oracles import event_leaves

    leaves = event_leaves(event)
    assert all(isinstance(leaf.event, dpa.GaussianDpEvent) for leaf in leaves)
    return [(leaf.rate, leaf.event.noise_multiplier, leaf.count) for leaf in leaves]


DOUBLE = ("gaussian_dual_refresh", "gaussian_x_refresh", "gaussian_dual_diff", "gaussian_x_diff")
RECURSIVE = ("gaussian_v_refresh", "gaussian_u_refresh", "gaussian_s", "gaussian_v_diff", "gaussian_u_diff", "gaussian_s")


@pytest.mark.parametrize("name,rule", [("dp_double_spider", "equal"), ("dp_double_spider", "theorem"),
                                        ("dp_recursive_spider", "equal"), ("dp_recursive_spider", "theorem")])
def test_every_release_gets_its_accounted_noise_at_its_accounted_rate(small, monkeypatch, name, rule):
    """Full refreshes (every row, rate 1) every q steps, corrections at B/n; each family's
    multiplier from its own rate and count; the loop's noise std / clip norm equals the
    accounted leaf's multiplier, and its batch rate the leaf's rate."""
    spec = _spec(name, small, options={"noise_allocation": rule})
    n = len(small.splits["train"])
    q = B / n
    n_ref = math.ceil(STEPS / PHASE)
    z = spec.noise_multiplier
    s_rate = min(1.0, 128.0 * q / B)  # line 16's batch: options.s_batch_size = 128
    expected = {  # kind -> (rate, multiplier)
        "gaussian_dual_refresh": (1.0, _expected_multiplier(z, 1.0, n_ref, rule)),
        "gaussian_x_refresh": (1.0, _expected_multiplier(z, 1.0, n_ref, rule)),
        "gaussian_v_refresh": (1.0, _expected_multiplier(z, 1.0, n_ref, rule)),
        "gaussian_u_refresh": (1.0, _expected_multiplier(z, 1.0, n_ref, rule)),
        "gaussian_dual_diff": (q, _expected_multiplier(z, q, STEPS - n_ref, rule)),
        "gaussian_x_diff": (q, _expected_multiplier(z, q, STEPS - n_ref, rule)),
        "gaussian_v_diff": (q, _expected_multiplier(z, q, STEPS - n_ref, rule)),
        "gaussian_u_diff": (q, _expected_multiplier(z, q, STEPS - n_ref, rule)),
        "gaussian_s": (s_rate, _expected_multiplier(z, s_rate, STEPS, rule)),
    }
    # the accounted tree: refresh steps then correction steps, leaves in release order
    order = DOUBLE if name == "dp_double_spider" else RECURSIVE
    leaves = _leaves(run_event(methods.get(name), spec, q, STEPS, constrained=False))
    assert len(leaves) == len(order)
    for i, (kind, (rate, sigma, count)) in enumerate(zip(order, leaves)):
        assert rate == pytest.approx(expected[kind][0]) and sigma == pytest.approx(expected[kind][1], rel=1e-9), kind
        assert count == (n_ref if i < len(order) // 2 else STEPS - n_ref), kind
    # the loop
    seen = _observe(monkeypatch)
    res = _fit(name, small, spec)
    counts: dict[str, int] = {}
    for kind, rate, clip, std in seen["releases"]:
        counts[kind] = counts.get(kind, 0) + 1
        assert rate == pytest.approx(expected[kind][0]), kind
        assert std == pytest.approx(expected[kind][1] * clip, rel=1e-9), kind
    assert counts == {k: v for k, v in res.releases.items() if v}
    assert counts.get("gaussian_x_refresh", counts.get("gaussian_v_refresh")) == n_ref
    assert res.stats["mean_batch_size"] > n_ref * n / STEPS  # the refreshes hold every row


def test_correction_clip_is_max_of_floor_and_scale_times_the_iterate_difference(small, monkeypatch):
    """Theorem 6's C_2, C_4 follow |x_t - x_{t-1}| and the dual difference: here
    ``max(floor, min(refresh C, scale |(x_t, eta) - (x_{t-1}, eta')|))`` from the released iterates."""
    floor, scale = 0.02, 3.0
    spec = _spec("dp_double_spider", small, options={"diff_clip_norm": floor, "diff_clip_scale": scale,
                                                     "dual_diff_clip_norm": floor, "dual_diff_clip_scale": scale})
    seen = _observe(monkeypatch)
    _fit("dp_double_spider", small, spec)
    xs, duals = seen["x"], seen["dual"]  # x_t before step t; dual at t (record 0 is the start)
    by_step: list[list] = [[] for _ in range(STEPS)]
    t = -1
    for kind, _, clip, _ in seen["releases"]:
        if kind.startswith("gaussian_dual"):
            t += 1
        by_step[t].append((kind, clip))
    floor_used = scaled_used = 0
    for t, rel in enumerate(by_step):
        (k_dual, c_dual), (k_x, c_x) = rel
        if t % PHASE == 0:
            assert (k_dual, c_dual, k_x, c_x) == ("gaussian_dual_refresh", 10.0, "gaussian_x_refresh", 1.0)
            continue
        dx = float((xs[t] - xs[t - 1]).norm())
        d_dual = float((duals[t] - duals[t - 1]).norm())  # (eta_t, lambda_t) - (eta_{t-1}, lambda_{t-1})
        d_next = float((duals[t + 1] - duals[t]).norm())  # the x correction pairs (x_t, eta_{t+1}) with (x_{t-1}, eta_t)
        assert c_dual == pytest.approx(max(floor, min(10.0, scale * math.hypot(dx, d_dual))), rel=1e-5)
        assert c_x == pytest.approx(max(floor, min(1.0, scale * math.hypot(dx, d_next))), rel=1e-5)
        floor_used += c_x == floor
        scaled_used += c_x > floor
    assert scaled_used > 0  # the test reaches the scaled branch


@pytest.mark.parametrize("name,keys", [
    ("dp_double_spider", {"diff_clip_scale": "gaussian_x_diff", "dual_diff_clip_scale": "gaussian_dual_diff"}),
    ("dp_recursive_spider", {"diff_clip_scale": "gaussian_v_diff", "lambda_diff_clip_scale": "gaussian_u_diff"}),
])
def test_adaptive_correction_clip_is_capped_at_the_refresh_clip(small, monkeypatch, name, keys):
    """The cap breaks the loop larger step -> larger clip -> more noise -> larger step: with a
    huge scale every correction clips at its block's refresh C (x: method.clip_norm 1.0; the
    dual / lambda block: its refresh clip norm 10.0) and its noise std follows that C."""
    spec = _spec(name, small, options={key: 1e6 for key in keys})
    seen = _observe(monkeypatch)
    _fit(name, small, spec)
    ceiling = {kind: (1.0 if kind in ("gaussian_x_diff", "gaussian_v_diff") else 10.0) for kind in keys.values()}
    clips = {(k, c) for k, _, c, _ in seen["releases"] if k in ceiling}
    assert clips == set(ceiling.items())


def test_fixed_correction_clips_with_scale_zero(small, monkeypatch):
    spec = _spec("dp_double_spider", small, options={"diff_clip_scale": 0.0, "dual_diff_clip_scale": 0.0, "diff_clip_norm": 0.7,
                                                     "dual_diff_clip_norm": 0.3})
    seen = _observe(monkeypatch)
    _fit("dp_double_spider", small, spec)
    clips = {(k, c) for k, _, c, _ in seen["releases"] if k.endswith("_diff")}
    assert clips == {("gaussian_dual_diff", 0.3), ("gaussian_x_diff", 0.7)}


def test_calibration_spends_the_budget_with_per_family_noise(small):
    """z is the one calibrated number: the plan meets eps (within 1 %), every family's
    multiplier follows from z, and a larger budget buys less noise everywhere."""
    m = methods.get("dp_double_spider")
    n = len(small.splits["train"])
    spec = _spec("dp_double_spider", small, calibrate_noise=True)
    p1 = plan(m, spec, n_train=n, eps=1.0, delta=n**-1.1, constrained=False)
    p5 = plan(m, spec, n_train=n, eps=5.0, delta=n**-1.1, constrained=False)
    assert 0.99 <= p1.eps_planned <= 1.0 and accountant.supports(p1.event)
    s1, s5 = [sig for _, sig, _ in _leaves(p1.event)], [sig for _, sig, _ in _leaves(p5.event)]
    assert all(a > b for a, b in zip(s1, s5))


def test_phase_auto_is_theorem_7_and_the_run_resolves_it():
    """q = (n eps / sqrt(d log(1/delta)))^(2/3), rounded, from public sizes; a non-private
    reference takes SPIDER's sqrt(n)."""
    n, d = 28828, 206
    delta = n**-1.1
    for eps, q in ((0.5, 45), (1.0, 71), (5.0, 207)):
        assert round((n * eps / math.sqrt(d * math.log(1 / delta))) ** (2 / 3)) == q
        spec = paper_spec(name="dp_double_spider", objective=KL, steps=1000)
        resolved = methods.get("dp_double_spider").resolve(spec, n_train=n, eps=eps, delta=delta, dim=d)
        assert resolved.options["phase"] == q
    ref = methods.get("spider").resolve(paper_spec(name="spider", objective=KL, clip_norm=None, noise_multiplier=None),
                                        n_train=10000, eps=1.0, delta=1e-5, dim=d)
    assert ref.options["phase"] == 100
    fixed = paper_spec(name="dp_recursive_spider", objective=KL, options={"phase": 9})
    assert methods.get("dp_recursive_spider").resolve(fixed, n_train=n, eps=1.0, delta=delta, dim=d) is fixed
    with pytest.raises(ConfigError, match=r"^method.options.phase=auto is resolved by `raco train`"):
        run_event(methods.get("dp_double_spider"), paper_spec(name="dp_double_spider", objective=KL, steps=10), 0.01, 10,
                  constrained=False)


@pytest.mark.parametrize("key,value,message", [
    ("phase", 0, r"method.options.phase must be auto or an integer >= 1 \(got method.options.phase=0\)"),
    ("refresh_batch_factor", "half", r"method.options.refresh_batch_factor must be full or a number > 0"),
    ("noise_allocation", "fair", r"method.options.noise_allocation must be one of equal, theorem, configured"),
    ("diff_clip_scale", -1.0, r"method.options.diff_clip_scale must be >= 0"),
    ("clipped", "yes", r"method.options.clipped must be true or false"),
])
def test_bad_options_are_one_line_errors(key, value, message):
    with pytest.raises(ConfigError, match="^" + message):
        methods.get("dp_double_spider").validate(paper_spec(name="dp_double_spider", objective=KL, options={key: value}), None)


def test_clip_fraction_is_recorded_per_release(small):
    # a huge clip norm with noise would blow the iterates up: the clipped reference, no noise
    loose = _fit("spider", small, _spec("spider", small, clip_norm=1e6, options={
        "dual_clip_norm": 1e6, "diff_clip_norm": 1e6, "dual_diff_clip_norm": 1e6, "clipped": True}))
    assert set(loose.stats["clip_fraction_by_release"]) == set(DOUBLE)
    assert all(v == 0.0 for v in loose.stats["clip_fraction_by_release"].values())
    tight = _fit("dp_double_spider", small, _spec("dp_double_spider", small, clip_norm=1e-6, options={
        "dual_clip_norm": 1e-6, "diff_clip_norm": 1e-6, "dual_diff_clip_norm": 1e-6, "diff_clip_scale": 0.0,
        "dual_diff_clip_scale": 0.0}))
    assert all(v == 1.0 for v in tight.stats["clip_fraction_by_release"].values())
    assert tight.stats["clip_norm_by_release"]["gaussian_x_diff"] == pytest.approx(1e-6)


def test_normalised_step_and_bounded_dual(small, monkeypatch):
    """|x_{t+1} - x_t| <= max_step; |eta| <= eta_bound and lambda0 <= lambda <= lambda_max."""
    seen = _observe(monkeypatch)
    spec = _spec("dp_double_spider", small, lr=50.0, lr_dual=5.0, lambda_max=1.2, options={"max_step": 0.01, "eta_bound": 0.05})
    _fit("dp_double_spider", small, spec)
    steps = [float((b - a).norm()) for a, b in zip(seen["x"], seen["x"][1:])]
    # the cap binds at this lr; the parameters are float32, so the difference of two iterates of
    # norm ~1 carries their rounding (~1e-7 |x|), about 1e-5 of a 0.01 step
    assert max(steps) <= 0.01 * (1 + 1e-4) and max(steps) > 0.009
    duals = torch.stack(seen["dual"])
    assert duals[:, 0].abs().max() <= 0.05 + 1e-12 and duals[:, 1].max() <= 1.2 + 1e-12 and duals[:, 1].min() >= KL.lambda0


@pytest.mark.parametrize("name,options", [("spider", {"variant": "double"}), ("spider", {"variant": "recursive"}), ("sgda", {})])
def test_clipped_references_clip_without_noise(small, name, options):
    """options.clipped: the non-private references clip every estimator as the private methods
    do (clip fractions recorded), with no release and no noise: two seeds' first steps differ
    only through sampling; unclipped they record no clip statistics."""
    spec = _spec(name, small, clip_norm=1e-3, options={**options, "clipped": True} if name == "spider" else
                 {"clipped": True, "dual_clip_norm": 1e-3})
    res = _fit(name, small, spec)
    assert not any(res.releases.values())
    assert res.stats["clip_fraction_by_release"] and max(res.stats["clip_fraction_by_release"].values()) > 0.5
    assert all(torch.isfinite(v).all() for v in res.state_dict.values())
    plain = _fit(name, small, _spec(name, small, clip_norm=None, options=options))
    assert plain.stats["clip_fraction_by_release"] == {}
    with pytest.raises(ConfigError, match=r"^method.clip_norm must be set for method"):
        _fit(name, small, _spec(name, small, clip_norm=None, options={**options, "clipped": True}))


def test_noise_ratio_of_the_benchmarks():
    """The noise-dominance ratio sqrt(d log(1/delta)) / (n eps) the docs quote."""
    n = 28828
    assert round(dro_common.noise_ratio(n=n, eps=0.5, delta=n**-1.1, dim=206), 4) == 0.0033
    assert np.isclose(dro_common.noise_ratio(n=100, eps=1.0, delta=math.exp(-1.0), dim=100), 0.1)
