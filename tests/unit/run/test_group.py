"""How a sweep group splits its runs into problems trained together (run/group.py)."""

from __future__ import annotations

from types import SimpleNamespace

from raco_cli import methods
from raco_cli.run.group import MIXED_STEPS_SPREAD, similar_steps


def _prep(T: int) -> SimpleNamespace:
    return SimpleNamespace(plan=SimpleNamespace(steps=T))


def test_runs_of_nearly_the_same_T_train_together_and_far_apart_ones_do_not():
    """A scope=model sweep's seeds (T 415-421) make one problem; T past MIXED_STEPS_SPREAD
    times the smallest of a problem start the next; each problem lists its runs by T."""
    Ts = [421, 100, 415, 418, 400, 109, 111, 1000]
    chunks = similar_steps([(i, _prep(T)) for i, T in enumerate(Ts)])
    assert [[Ts[i] for i, _ in c] for c in chunks] == [[100, 109], [111], [400, 415, 418, 421], [1000]]
    for c in chunks:
        steps = [p.plan.steps for _, p in c]
        assert max(steps) <= MIXED_STEPS_SPREAD * min(steps)
    assert similar_steps([]) == []


def test_the_methods_whose_groups_take_one_T_per_run():
    """fit_many of the SGDA loop and of DP-FERMI takes one T per run (their batch keys leave T
    out); the methods without fit_many train alone."""
    assert all(getattr(methods.get(name), "MIXED_STEPS", False) for name in ("raco_dp", "dp_sgd", "sgda", "sgd", "dp_fermi"))
    assert not getattr(methods.get("dpse"), "MIXED_STEPS", False)
