"""The SGDA loop: noise actually added, selection rule, dual projection, convergence."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.data.types import SPLITS
from raco_cli.methods import training
from raco_cli.methods.base import EvalRecord, NullReporter, Seeds, select_checkpoint
from raco_cli.methods.sgda import core, dp_sgd, raco_dp, sgda


def _fit(module, data, spec, steps, seed=0):
    cons = constraints.build("dp", n_classes=2, n_groups=data.n_groups, gamma=0.05)
    model = models.build("logreg", input_shape=data.input_shape, n_classes=2)
    res = module.fit(data, model, cons, spec, steps=steps, seeds=Seeds.from_seed(seed), device=torch.device("cpu"), reporter=NullReporter())
    return res, model


def test_gaussian_noise_of_the_update(engine, zero_gradient_sums, synthetic):
    """With zero per-sample gradients the update is pure noise: std sigma*C*lr/(q n) per coordinate."""
    sigma, C, lr, T, B = 2.0, 0.5, 1.0, 100, 100
    spec = paper_spec(name="dp_sgd", batch_size=B, noise_multiplier=sigma, clip_norm=C, lr=lr, eval_every=10**6, selection="last")
    drift = []
    for seed in range(30):  # 30 runs x 14 parameters: enough draws for a 15 % tolerance
        model = models.build("logreg", input_shape=synthetic.input_shape, n_classes=2)
        training.initialize(model, Seeds.from_seed(seed).init)
        before = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
        res, _ = _fit(dp_sgd, synthetic, spec, T, seed=seed)
        drift.append((torch.cat([v.flatten() for v in res.state_dict.values()]) - before).numpy())
    drift = np.concatenate(drift)
    expected = sigma * C * lr / B * math.sqrt(T)
    assert drift.std() == pytest.approx(expected, rel=0.15)
    assert abs(drift.mean()) < 4 * expected / math.sqrt(len(drift))


def test_laplace_noise_on_every_histogram_cell(monkeypatch, engine, dual_inputs, synthetic):
    """With an all-zero exact histogram the released one is pure noise: i.i.d. Laplace(b) per cell."""
    from raco_cli.methods import batched_scan

    def zero_histograms(self, W, b, temperature, *, hard=False):
        self.logits(W, b)
        self.pt = self._softmax(temperature)
        return torch.zeros(self.R, self.Q, self.K, dtype=torch.float64)

    monkeypatch.setattr(core, "_histogram", lambda logits, cells, Q, K, spec, device, soft=None: torch.zeros(Q, K, dtype=torch.float64))
    monkeypatch.setattr(batched_scan.Scan, "histograms", zero_histograms)
    b = 3.0
    spec = paper_spec(name="raco_dp", batch_size=100, noise_multiplier=1.0, hist_noise_multiplier=b, clip_norm=1.0, eval_every=10**6)
    _fit(raco_dp, synthetic, spec, 3000)
    draws = torch.stack(dual_inputs).reshape(len(dual_inputs), -1).numpy()
    assert draws.shape == (3000, 4)  # Q x K = 2 x 2: every cell released, every step
    np.testing.assert_allclose(draws.std(axis=0), math.sqrt(2) * b, rtol=0.08)
    corr = np.corrcoef(draws.T)[~np.eye(4, dtype=bool)]
    assert np.abs(corr).max() < 0.08  # independent across cells (also across the class axis)


@pytest.mark.parametrize("given_soft", [False, True])
def test_histogram_counts_rows_with_nonfinite_rates_as_zero(given_soft):
    """A row whose softmax is NaN (non-finite logits) adds nothing to its cell, as
    ``nan_to_num`` of the rates would make it; the finite rows are counted exactly (eq. 8)."""
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[0.0, 1.0], [nan, 0.0], [2.0, -1.0], [inf, 0.0], [0.5, 0.5]])
    cells = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0]])  # the last row has no cell
    spec = paper_spec(name="raco_dp", temperature=2.0)
    soft = torch.softmax(2.0 * logits, dim=1)
    H = core._histogram(logits, cells, 2, 2, spec, torch.device("cpu"), soft=soft if given_soft else None)
    expected = cells.double().t() @ torch.nan_to_num(soft.double(), nan=0.0)
    assert H.dtype == torch.float64 and torch.isfinite(H).all()
    torch.testing.assert_close(H, expected, rtol=1e-6, atol=0.0)
    finite = core._histogram(logits[[0, 2, 4]], cells[[0, 2, 4]], 2, 2, spec, torch.device("cpu"))
    torch.testing.assert_close(finite, cells[[0, 2, 4]].double().t() @ soft[[0, 2, 4]].double(), rtol=1e-6, atol=0.0)


def test_selection_rule():
    def rec(step, val, sat):
        return EvalRecord(step, {"train": {"satisfied": sat}, "val": {"accuracy": val}}, [])

    hist = [rec(0, 0.6, False), rec(10, 0.9, False), rec(20, 0.8, True), rec(30, 0.85, True), rec(40, 0.7, True)]
    assert select_checkpoint(hist, "best_feasible") == (3, True)
    assert select_checkpoint(hist, "last") == (4, True)
    infeasible = [rec(0, 0.6, False), rec(10, 0.9, False)]
    assert select_checkpoint(infeasible, "best_feasible") == (1, False)


@given(st.lists(st.floats(-100, 100), min_size=1, max_size=10), st.floats(0, 50))
def test_dual_projection_is_idempotent_and_lands_in_the_box(values, lam_max):
    lam = torch.tensor(values, dtype=torch.float64)
    once = core.project_dual(lam, lam_max)
    assert torch.all(once >= 0) and torch.all(once <= lam_max)
    assert torch.equal(core.project_dual(once, lam_max), once)


@pytest.mark.slow
def test_sgda_converges_to_the_constraint_without_noise(synthetic):
    """No noise, no clipping: the final hard train gap is within gamma + tol (convergence)."""
    spec = paper_spec(name="sgda", batch_size=len(synthetic.splits["train"]), clip_norm=None, noise_multiplier=None,
                      hist_noise_multiplier=None, lr=1.0, lr_dual=2.0, lambda_max=50.0, eval_every=50, selection="last",
                      temperature=4.0, dual="hard")
    res, _ = _fit(sgda, synthetic, spec, 1500)
    unconstrained = res.history[0]
    final = res.selected_record.metrics["train"]
    assert final["dp_gap"] <= 0.05 + 0.02
    assert res.history[-1].lam != unconstrained.lam


@pytest.mark.parametrize("selection", ["best_feasible", "last"])
def test_scope_model_evaluates_only_what_its_records_read(monkeypatch, engine, synthetic, selection):
    """privacy.scope=model keeps the test metrics and, for its noisy selection, validation's
    correct count: the training split is never evaluated (validation neither, without a noisy
    selection), and the run (history, selection, parameters) equals one that evaluates every
    split in full."""
    from raco_cli.methods import batched

    spec = paper_spec(name="raco_dp", batch_size=50, noise_multiplier=1.0, clip_norm=1.0, hist_noise_multiplier=2.0, eval_every=10,
                      scope="model", selection=selection, selection_eps=0.5 if selection == "best_feasible" else 0.0,
                      train_size=float(len(synthetic.splits["train"])))
    evaluated: list[int] = []
    predict, group_logits = training.predict_logits, batched.GroupEvaluator.logits
    monkeypatch.setattr(training, "predict_logits", lambda engine, data, idx, device: evaluated.append(len(idx)) or predict(engine, data, idx, device))
    monkeypatch.setattr(batched.GroupEvaluator, "logits", lambda self, W, b, split: evaluated.append(len(self.labels[split][0]))
                        or group_logits(self, W, b, split))
    lean, _ = _fit(raco_dp, synthetic, spec, 60)
    read = ["val", "test"] if selection == "best_feasible" else ["test"]
    assert evaluated and set(evaluated) == {len(synthetic.splits[s]) for s in read}
    assert len(synthetic.splits["train"]) not in evaluated

    monkeypatch.setattr(training.Checkpoints, "_evaluate", lambda self: training.evaluate_all(
        self.engine, self.data, self.constraints, temperature=self.spec.temperature, device=self.device))
    monkeypatch.setattr(batched.GroupEvaluator, "splits", lambda self, model_scope, members: SPLITS)
    evaluated.clear()
    full, _ = _fit(raco_dp, synthetic, spec, 60)
    assert len(synthetic.splits["train"]) in evaluated  # (the reference did evaluate every split)
    assert [(r.step, r.metrics, r.lam) for r in lean.history] == [(r.step, r.metrics, r.lam) for r in full.history]
    assert lean.selected == full.selected
    assert all(torch.equal(lean.state_dict[k], full.state_dict[k]) for k in full.state_dict)
