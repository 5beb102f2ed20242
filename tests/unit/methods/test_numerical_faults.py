"""Numerical faults: noisy denominators <= 0, empty Poisson batches, lambda at its bound,
NaN/inf gradients (dropped, counted, surfaced; never in the model)."""

from __future__ import annotations

import logging

import numpy as np
import torch
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.constraints.rate import ConstraintTensors
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.sgda import core, raco_dp


def _fit(data, steps=30, **kw):
    cons = constraints.build("dp", n_classes=2, n_groups=data.n_groups, gamma=0.05)
    model = models.build("logreg", input_shape=data.input_shape, n_classes=2)
    spec = paper_spec(**{"name": "raco_dp", "batch_size": 200, "eval_every": 10, "selection": "last", **kw})
    return raco_dp.fit(data, model, cons, spec, steps=steps, seeds=Seeds.from_seed(0), device=torch.device("cpu"), reporter=NullReporter())


def _finite(res):
    return all(torch.isfinite(v).all() for v in res.state_dict.values()) and np.all(np.isfinite(res.lam))


def test_noisy_denominators_at_or_below_zero_are_clamped(monkeypatch, engine, synthetic):
    from raco_cli.methods import batched_scan

    seen = []
    one, many = ConstraintTensors.step, batched_scan.dual_step

    def spy(self, H, lam, *, floor):
        weights, g = one(self, H, lam, floor=floor)
        seen.append((float((self.membership @ H.sum(1)).min()), weights))
        return weights, g

    def spy_many(membership, alpha, H, lam, floors, gamma):
        weights, g = many(membership, alpha, H, lam, floors, gamma)
        seen.extend((float((membership @ h.sum(1)).min()), w) for h, w in zip(H, weights))
        return weights, g

    monkeypatch.setattr(ConstraintTensors, "step", spy)
    monkeypatch.setattr(batched_scan, "dual_step", spy_many)
    res = _fit(synthetic, hist_noise_multiplier=1e4)  # counts of ~100 under noise of 10^4
    assert len(seen) == 30 and any(d <= 0 for d, _ in seen)  # the fault happened
    assert all(np.isfinite(w).all() and float(np.abs(w).max()) <= 10 * 2 for _, w in seen)  # |c| <= lam_max * sum|alpha| / floor (numpy on the CPU)
    assert _finite(res)


def test_an_empty_poisson_batch_is_pure_noise(monkeypatch, engine, synthetic):
    from raco_cli.methods import batched_scan

    monkeypatch.setattr(core, "poisson_sample", lambda n, q, g, device, count=1: [torch.zeros(0, dtype=torch.long)] * count)
    monkeypatch.setattr(batched_scan.Scan, "positions", lambda self, q, generators, *, count: np.full((len(generators), 1), float(count * self.n)))
    res = _fit(synthetic, steps=5)
    assert res.stats["mean_batch_size"] == 0 and _finite(res)
    assert res.releases == {"laplace_histogram": 5, "gaussian_gradient": 5}


def test_lambda_at_its_bound(engine, synthetic):
    res = _fit(synthetic, lr_dual=1e6, lambda_max=3.0)  # every dual step overshoots the box
    lams = np.array([r.lam for r in res.history[1:]])
    assert float(lams.max()) == 3.0 and float(lams.min()) >= 0.0 and _finite(res)
    zero = _fit(synthetic, lambda_max=0.0)
    assert zero.lam == [0.0] * len(zero.lam) and _finite(zero)


def test_nonfinite_gradients_are_dropped_counted_and_never_reach_the_model(engine, synthetic):
    X = np.array(synthetic.X, copy=True)
    bad_rows = synthetic.splits["train"][:40]
    X[bad_rows[:20], 0] = np.inf
    X[bad_rows[20:], 1] = np.nan
    import dataclasses

    broken = dataclasses.replace(synthetic, X=X)
    res = _fit(broken, steps=40)
    assert res.stats["nonfinite_rows"] > 0
    assert _finite(res)


def test_train_surfaces_nonfinite_rows_as_warning_and_summary_field(tmp_path, monkeypatch, caplog, synthetic):
    import dataclasses

    from raco_cli.cli.validate import compose_config
    from raco_cli.run import prepare
    from raco_cli.run import train as train_mod

    X = np.array(synthetic.X, copy=True)
    X[synthetic.splits["train"][:50], 0] = np.inf
    monkeypatch.setattr(prepare, "load_data", lambda spec: dataclasses.replace(synthetic, X=X))
    overrides = ["dataset=synthetic", "tracking=none", "method.batch_size=200", "method.max_steps=30", "constraint.confidence=null"]
    with caplog.at_level(logging.WARNING, logger="raco_cli.run.finish"):
        summary = train_mod.train(compose_config([*overrides, "privacy.scope=paper"]), run_dir=tmp_path / "run")
    assert summary["stats"]["nonfinite_rows"] > 0
    assert any("non-finite (NaN/inf) and were dropped" in r.getMessage() for r in caplog.records)
    assert summary["metrics"]["train"]["accuracy"] is not None
    # scope=model: the count is an exact training statistic, neither written nor logged
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="raco_cli.run.finish"):
        summary = train_mod.train(compose_config(overrides), run_dir=tmp_path / "model")
    assert "nonfinite_rows" not in summary.get("stats", {})
    assert not any("non-finite (NaN/inf)" in r.getMessage() for r in caplog.records)
