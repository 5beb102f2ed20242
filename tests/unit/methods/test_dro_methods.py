"""The DRO methods: estimators against autograd, per-release sensitivity, random iterate, budget.

* Estimators: with full batches and no noise, the SPIDER recursions telescope, so every
  direction a method steps along equals the exact gradient of its objective at the current
  iterate (autograd on the whole training split), refresh or correction alike.
* Sensitivity: on a transcript fixed by one dataset, every noisy release of every private method
  moves by at most its clipping norm C when one (adversarial) record is added: the noise
  ``sigma C`` is calibrated to that.  Clipping the batch mean, as Algorithm 2 is printed, fails it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, methods, models
from raco_cli.data.types import TabularData
from raco_cli.errors import UnsupportedError
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.dro import common as dro_common
from raco_cli.methods.planning import plan
from raco_cli.objectives import ObjectiveSpec
from raco_cli.objectives.dro import Compositional, DualForm
from raco_cli.privacy import accountant

KL = ObjectiveSpec("dro", divergence="kl", rho=0.5, lam=1.0)
CHI2 = ObjectiveSpec("dro", divergence="chi2", lam=0.8)


@pytest.fixture(scope="module")
def small():
    from raco_cli.data import synthetic

    return synthetic.load(n=400, n_features=4, seed=3)


def _fit(name, data, *, steps, objective=KL, seed=0, **kw):
    m = methods.get(name)
    base = dict(name=name, batch_size=len(data.splits["train"]), steps=steps, max_steps=steps, eval_every=1, lr=0.3,
                lr_dual=0.05, objective=objective, selection="last", scope="paper")
    if not m.PRIVATE:
        base.update(clip_norm=None, noise_multiplier=None, hist_noise_multiplier=None)
    else:
        base.update(clip_norm=1.0, noise_multiplier=1.0, hist_noise_multiplier=None)
    base.update(kw)
    spec = paper_spec(**base)
    cons = constraints.build("none", n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.05)
    model = models.build("logreg", input_shape=data.input_shape, n_classes=data.n_classes)
    return m.fit(data, model, cons, spec, steps=steps, seeds=Seeds.from_seed(seed), device=torch.device("cpu"), reporter=NullReporter())


def _train_tensors(data):
    idx = np.asarray(data.splits["train"])
    return torch.as_tensor(data.X[idx], dtype=torch.float64), torch.as_tensor(data.y[idx])


def _capture(monkeypatch):
    """Record (x_t, direction_t) of every step and the dual of every evaluation."""
    steps: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    duals: list[list[float]] = []
    step, record = dro_common.DroRun.step, dro_common.DroRun.record

    def on_step(self, direction, *, max_step=0.0):
        steps.append(([p.detach().double().clone() for p in self.engine.params], [d.detach().double().clone() for d in direction]))
        return step(self, direction, max_step=max_step)

    def on_record(self, t, dual):
        duals.append(list(dual))
        return record(self, t, dual)

    monkeypatch.setattr(dro_common.DroRun, "step", on_step)
    monkeypatch.setattr(dro_common.DroRun, "record", on_record)
    return steps, duals


def _loss(W, b, X, y):
    return torch.nn.functional.cross_entropy(X @ W.t() + b, y, reduction="none")


def test_double_spider_directions_are_exact_gradients(small, monkeypatch):
    """Algorithm 2 with full batches: v_t = grad_x L(x_t, eta_{t+1}) and the dual step uses
    grad L(x_t, eta_t), through the refresh (t = 0) and eleven corrections (phase 12)."""
    steps, duals = _capture(monkeypatch)
    _fit("spider", small, steps=12, options={"variant": "double", "phase": 12, "refresh_batch_factor": 1.0})
    X, y = _train_tensors(small)
    form = DualForm.of(KL)
    for t, ((W, b), (vW, vb)) in enumerate(steps):
        eta_t, lam_t = duals[t]
        eta_n, lam_n = duals[t + 1]
        Wr, br = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
        value = lam_n * form.psi.conjugate((_loss(Wr, br, X, y) - eta_n) / lam_n).mean()
        gW, gb = torch.autograd.grad(value, [Wr, br])
        torch.testing.assert_close(vW, gW, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(vb, gb, atol=1e-5, rtol=1e-4)
        e = torch.tensor(eta_t, dtype=torch.float64, requires_grad=True)
        lt = torch.tensor(lam_t, dtype=torch.float64, requires_grad=True)
        L = lt * form.psi.conjugate((_loss(W, b, X, y) - e) / lt).mean() + e + lt * KL.rho
        d_eta, d_lam = torch.autograd.grad(L, [e, lt])
        assert eta_n == pytest.approx(eta_t - 0.05 * lam_t * float(d_eta), abs=1e-6)
        assert lam_n == pytest.approx(max(KL.lambda0, lam_t - 0.05 * lam_t * float(d_lam)), abs=1e-6)


def test_recursive_spider_direction_is_the_gradient_of_eq5(small, monkeypatch):
    """Algorithm 3 with full batches, exact s (beta = 1) and the shift on: z_t = grad Psi(w_t)."""
    steps, duals = _capture(monkeypatch)
    _fit("spider", small, steps=8, options={"variant": "recursive", "phase": 4, "refresh_batch_factor": 1.0,
                                            "s_batch_size": float(len(small.splits["train"])), "storm_beta": 1.0})
    X, y = _train_tensors(small)
    comp = Compositional.of(KL)
    for t, ((W, b), (zW, zb)) in enumerate(steps):
        (lam_t,), (lam_n,) = duals[t], duals[t + 1]
        Wr, br = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
        lt = torch.tensor(lam_t, dtype=torch.float64, requires_grad=True)
        psi = lt * torch.logsumexp(_loss(Wr, br, X, y) / lt, dim=0) - lt * math.log(len(y)) + lt * KL.rho
        gW, gb, g_lam = torch.autograd.grad(psi, [Wr, br, lt])
        torch.testing.assert_close(zW, gW, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(zb, gb, atol=1e-5, rtol=1e-4)
        assert lam_n == pytest.approx(max(comp.lambda0, lam_t - 0.05 * lam_t * float(g_lam)), rel=1e-6)


def test_sgda_first_direction_uses_the_refreshed_ratios(small, monkeypatch):
    steps, duals = _capture(monkeypatch)
    _fit("sgda", small, steps=1, objective=CHI2, options={"lr_ratio": 0.5})
    X, y = _train_tensors(small)
    (W, b), (vW, vb) = steps[0]
    Wr, br = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
    ell = _loss(Wr, br, X, y)
    r = DualForm.of(CHI2).psi.ascent(torch.ones(len(y), dtype=torch.float64), ell.detach() - 0.0, CHI2.lam, 0.5)
    gW, gb = torch.autograd.grad((r * ell).mean(), [Wr, br])
    torch.testing.assert_close(vW, gW, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(vb, gb, atol=1e-5, rtol=1e-4)


def _neighbour(data: TabularData) -> TabularData:
    """data plus one adversarial training record (far-out features, a label against the trend)."""
    x = np.full((1, data.X.shape[1]), 25.0, dtype=np.float32)
    splits = {k: np.asarray(v) for k, v in data.splits.items()}
    splits["train"] = np.append(splits["train"], len(data.y))
    return TabularData(name=data.name, X=np.concatenate([data.X, x]), y=np.append(data.y, 0), group=np.append(data.group, 1),
                       feature_names=data.feature_names, class_names=data.class_names, group_names=data.group_names, splits=splits)


PRIVATE_CASES = [
    ("dp_double_spider", KL, {"phase": 3}),  # the defaults: full refreshes, adaptive correction clips, theorem noise
    ("dp_double_spider", CHI2, {"phase": 3, "refresh_batch_factor": 4.0, "diff_clip_scale": 0.5, "dual_diff_clip_scale": 0.0}),
    ("dp_double_spider", KL, {"phase": 3, "diff_clip_scale": 0.0, "dual_diff_clip_scale": 0.0, "diff_clip_norm": 1.0,
                              "dual_diff_clip_norm": 5.0, "noise_allocation": "configured", "max_step": 0.05}),
    ("dp_recursive_spider", KL, {"phase": 3}),
    ("dp_recursive_spider", KL, {"phase": 3, "storm": False, "shift": False, "refresh_batch_factor": 4.0}),
    ("dp_sgda", KL, {}),
    ("dp_private_diff", KL, {"phase": 3}),
    ("dp_private_diff", ObjectiveSpec("dro", divergence="cvar", alpha=0.2), {"phase": 3, "noise_allocation": "theorem"}),
]


@pytest.mark.parametrize("name,objective,options", PRIVATE_CASES, ids=[f"{c[0]}-{c[1].divergence}-{i}" for i, c in enumerate(PRIVATE_CASES)])
def test_every_release_moves_by_at_most_its_clip_norm(small, monkeypatch, name, objective, options):
    """Same transcript (the releases of the run on D), one more record: |S' - S| <= C per release."""
    recorded: list[tuple[str, list[torch.Tensor], float]] = []
    observed: list[tuple[str, list[torch.Tensor], float]] = []
    mode = {"replay": False}

    def full_batch(self, sample_rate, *, primal=False):
        idx = torch.arange(self.n)
        b = self.rows.batch(idx, labels=True)
        return idx, b["X"], b["y"]

    def release(self, rel, sums, *, clip=None):
        c = rel.clip if clip is None else clip
        self.counts[rel.kind] = self.counts.get(rel.kind, 0) + 1
        if not mode["replay"]:
            recorded.append((rel.kind, [s.clone() for s in sums], c))
            return sums
        kind, values, _ = recorded[len(observed)]
        assert kind == rel.kind
        observed.append((rel.kind, [s.clone() for s in sums], c))
        return [v.clone() for v in values]  # continue on D's transcript

    init = dro_common.DroRun.__init__
    public = {}

    def same_public_size(self, *args, **kw):
        # the neighbour has one more row; the training size the rates and normalisers use is
        # public (q = B / n), so both runs use D's
        init(self, *args, **kw)
        if mode["replay"]:
            self.size = public["n"]
            self.q = min(1.0, self.spec.batch_size / self.size)
        public.setdefault("n", self.size)

    monkeypatch.setattr(dro_common.DroRun, "__init__", same_public_size)
    monkeypatch.setattr(dro_common.DroRun, "sample", full_batch)
    monkeypatch.setattr(dro_common.DroRun, "gaussian", release)
    # the releases are divided by expected batch sizes (factor x) B, public constants of both runs
    # while every Poisson rate is below 1; the batches themselves are all rows (full_batch)
    B = len(small.splits["train"]) // 8
    _fit(name, small, steps=7, objective=objective, lr=0.5, options=options, batch_size=B)
    mode["replay"] = True
    _fit(name, _neighbour(small), steps=7, objective=objective, lr=0.5, options=options, batch_size=B)
    assert len(observed) == len(recorded) > 0
    moved = []
    for (kind, a, c), (_, b, c2) in zip(recorded, observed):
        assert c == pytest.approx(c2)  # the clip norm is a function of the transcript only
        d = math.sqrt(sum(float(((x - z) ** 2).sum()) for x, z in zip(a, b)))
        assert d <= c * (1 + 1e-5) + 1e-9, (kind, d, c)
        moved.append(d / c)
    assert max(moved) > 0.5  # the adversarial record does move the releases (the test has teeth)


@pytest.mark.parametrize("name", ["dp_double_spider", "dp_recursive_spider", "dp_sgda", "dp_private_diff"])
def test_calibrated_noise_meets_the_budget_for_fixed_steps(small, name):
    m = methods.get(name)
    spec = paper_spec(name=name, batch_size=64, steps=50, calibrate_noise=True, clip_norm=1.0, noise_multiplier=1.0,
                      hist_noise_multiplier=None, objective=KL, options={"phase": 10} if "spider" in name else {})
    n = len(small.splits["train"])
    p = plan(m, spec, n_train=n, eps=1.0, delta=n ** -1.1, constrained=False)
    assert p.steps == 50 and 0.99 <= p.eps_planned <= 1.0
    assert accountant.supports(p.event)
    looser = plan(m, spec, n_train=n, eps=5.0, delta=n ** -1.1, constrained=False)
    assert looser.spec.noise_multiplier < p.spec.noise_multiplier  # a larger budget buys less noise


def test_random_iterate_is_drawn_before_training_and_returned(small):
    res = _fit("dp_sgda", small, steps=30, selection="random", eval_every=10)
    tau = res.stats["random_iterate_step"]
    assert 1 <= tau <= 30 and res.selected_record.step == tau
    again = _fit("dp_sgda", small, steps=30, selection="random", eval_every=10, lr=0.01)
    assert again.stats["random_iterate_step"] == tau  # from the selection seed, not the data or the run


@pytest.mark.parametrize("name", ["dp_sgda", "dp_double_spider", "dp_recursive_spider", "dp_private_diff"])
def test_tail_average_reports_its_own_robust_objective(small, name):
    """selection=average outputs a model no evaluation saw: its F(x) is evaluated on it."""
    from raco_cli.objectives.dro import worst_case

    res = _fit(name, small, steps=20, selection="average", eval_every=5, batch_size=64,
               **({"options": {"phase": 5}} if "spider" in name else {}))
    got = res.selected_record.metrics["train"]
    model = models.build("logreg", input_shape=small.input_shape, n_classes=small.n_classes)
    model.load_state_dict(res.state_dict)
    X, y = _train_tensors(small)
    with torch.no_grad():
        ell = torch.nn.functional.cross_entropy(model.double()(X), y, reduction="none")
    assert got["dro_objective"] == pytest.approx(worst_case(ell, KL).value, rel=1e-5)
    assert got["dro_objective"] != res.history[-2].metrics["train"]["dro_objective"]  # not the last iterate's
    assert got["grad_norm"] > 0


def test_objective_requirements_are_one_line_errors(small):
    with pytest.raises(UnsupportedError, match=r"^method=dp_sgda optimises the DRO objective; add objective=dro"):
        methods.get("dp_sgda").validate(paper_spec(name="dp_sgda"), None)
    with pytest.raises(UnsupportedError, match=r"solves the KL-constrained compositional form \(eq. 5\), not divergence 'chi2'"):
        methods.get("dp_recursive_spider").validate(paper_spec(name="dp_recursive_spider", objective=CHI2), None)
