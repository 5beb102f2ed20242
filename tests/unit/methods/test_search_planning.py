"""The plans of a private search's probes (issue 57: raco tune's start-up): a candidate planned
at several per-trial eps reuses its eps(T) evaluations, and only for the very same event."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import pytest
from specs import paper_spec

from raco_cli import methods
from raco_cli.methods import planning

SPEC = paper_spec(name="raco_dp", batch_size=256, noise_multiplier=3.0, hist_noise_multiplier=12.0, clip_norm=1.0, lr=1.0,
                  max_steps=5000, selection="last")


def _plan(spec, eps, n=7000.0):
    return planning.plan(methods.get("raco_dp"), spec, n_train=n, eps=eps, delta=1e-5, constrained=True).steps


@pytest.fixture
def empty_caches(monkeypatch):
    monkeypatch.setattr(planning, "_STEPS_SEEN", OrderedDict())
    monkeypatch.setattr(planning, "_STEPS_HINTS", {})
    monkeypatch.setattr(planning, "_CACHE", OrderedDict())


def _scratch(spec, eps, n=7000.0):
    """A plan in a process that planned nothing before."""
    saved = planning._STEPS_SEEN, planning._STEPS_HINTS, planning._CACHE
    planning._STEPS_SEEN, planning._STEPS_HINTS, planning._CACHE = OrderedDict(), {}, OrderedDict()
    try:
        return _plan(spec, eps, n)
    finally:
        planning._STEPS_SEEN, planning._STEPS_HINTS, planning._CACHE = saved


@pytest.mark.parametrize(("other", "n"), [
    (replace(SPEC, noise_multiplier=4.0), 7000.0), (SPEC, 6000.0), (replace(SPEC, batch_size=200), 7000.0),
    (replace(SPEC, hist_noise_multiplier=6.0), 7000.0), (SPEC, 7000.0),
])
def test_a_probe_plan_equals_a_plan_from_scratch_whatever_was_planned_before(empty_caches, other, n):
    """After the probes of one candidate at eps 1 and 0.5, a plan of it (or of another noise, n~,
    so q, or batch: none may read the first's evaluations) at 0.43 is the plan from scratch."""
    for eps in (1.0, 0.5):
        _plan(SPEC, eps)
    assert _plan(other, 0.43, n) == _scratch(other, 0.43, n)
