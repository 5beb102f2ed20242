"""``method.dual=hard`` (arg-max histogram in the dual step, paper Fig. 8b) with every family."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.sgda import raco_dp, sgda

FOUR_FIFTHS = [{"gamma": -0.3, "terms": [{"alpha": 0.8, "predicted": 1, "group": 0}, {"alpha": -1.0, "predicted": 1, "group": 1}]}]  # gamma < 0: violated from the start
FAMILIES = [
    [("dp", {})], [("eo", {})], [("fnr", {})], [("fnr", {"positive_class": 1})], [("fpr", {})], [("eop", {})],
    [("custom", {"constraints": FOUR_FIFTHS})], [("dp", {}), ("fnr", {})],
]  # fmt: skip


def _cons(parts, data, gamma=0.0):
    specs = [constraints.part_spec(f, {"gamma": gamma, **o}, key="c") for f, o in parts]
    return constraints.build_parts(specs, n_classes=data.n_classes, n_groups=data.n_groups,
                                   class_names=data.class_names, group_names=data.group_names)  # fmt: skip


def _run(module, data, cons, spec, steps, seen):
    """A run and the histograms its dual step read (``seen``: the ``dual_inputs`` fixture)."""
    model = models.build("logreg", input_shape=data.input_shape, n_classes=data.n_classes)
    res = module.fit(data, model, cons, spec, steps=steps, seeds=Seeds.from_seed(0), device=torch.device("cpu"), reporter=NullReporter())
    return res, torch.stack(seen).numpy()


@pytest.mark.parametrize("parts", FAMILIES, ids=lambda p: "+".join(f + ("1" if o.get("positive_class") else "") for f, o in p))
def test_sgda_hard_dual_with_every_family(engine, dual_inputs, synthetic, parts):
    cons = _cons(parts, synthetic)
    spec = paper_spec(name="sgda", batch_size=300, clip_norm=None, noise_multiplier=None, hist_noise_multiplier=None,
                      lr=1.0, lr_dual=1.0, dual="hard", eval_every=10, selection="last")  # fmt: skip
    res, H = _run(sgda, synthetic, cons, spec, 10, dual_inputs)
    assert H.shape[1:] == (cons.Q, cons.K)
    np.testing.assert_array_equal(H, np.round(H))  # arg-max one-hots: integer counts per (cell, class)
    assert (H.sum(axis=2) >= 0).all()
    assert any(v > 0 for v in res.lam)  # gamma = 0: some constraint is violated, its multiplier moves
    final = res.history[-1].metrics["train"]
    assert np.isfinite(final["constraint_values_hard"]).all() and np.isfinite(final["accuracy"])
    assert set(final["constraints"]) == {f for f, _ in parts}


@pytest.mark.parametrize("parts", [[("eo", {})], [("dp", {}), ("fnr", {})]], ids=["eo", "dp+fnr"])
def test_raco_dp_hard_dual_noises_the_arg_max_histogram(engine, dual_inputs, synthetic, parts):
    cons = _cons(parts, synthetic, gamma=0.05)
    spec = paper_spec(name="raco_dp", batch_size=300, noise_multiplier=1.0, hist_noise_multiplier=2.0, clip_norm=1.0,
                      dual="hard", eval_every=10, selection="last")  # fmt: skip
    res, H = _run(raco_dp, synthetic, cons, spec, 10, dual_inputs)
    assert not np.allclose(H, np.round(H))  # Laplace noise on the one-hot counts
    assert np.isfinite(res.lam).all() and res.history[-1].metrics["train"]["accuracy"] > 0.5


@pytest.mark.slow
@pytest.mark.parametrize(
    "family,options,gamma,metric",
    [("eo", {}, 0.05, "eo_gap"), ("fnr", {"positive_class": 1}, 0.1, "fnr"), ("fnr", {}, 0.35, "fnr"), ("eop", {}, 0.05, "eop_gap")],
)
def test_sgda_converges_to_each_family_without_noise(dual_inputs, synthetic, family, options, gamma, metric):
    """No noise, no clipping: the selected checkpoint meets the hard train constraint, and the
    family's standard metric is within gamma on train."""
    cons = _cons([(family, options)], synthetic, gamma=gamma)
    spec = paper_spec(name="sgda", batch_size=512, clip_norm=None, noise_multiplier=None, hist_noise_multiplier=None,
                      lr=1.0, lr_dual=0.5, eval_every=50)  # fmt: skip
    res, _ = _run(sgda, synthetic, cons, spec, 400, dual_inputs)
    first, chosen = res.history[0].metrics["train"], res.selected_record.metrics["train"]
    assert not first["satisfied"] and chosen["satisfied"]
    assert chosen[metric] <= gamma + 1e-9
    assert chosen["accuracy"] > 0.65
