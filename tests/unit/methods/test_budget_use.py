"""Budget use: a run whose T hits method.max_steps spends its eps (within 1 %), and the plan cache."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from specs import paper_spec

from raco_cli.methods import dp_fermi, planning
from raco_cli.methods.sgda import dp_sgd, raco_dp
from raco_cli.privacy import accountant


@pytest.mark.parametrize("module, spec", [
    (raco_dp, paper_spec(name="raco_dp", batch_size=100, max_steps=50, noise_multiplier=3.0, hist_noise_multiplier=12.0)),
    (dp_sgd, paper_spec(name="dp_sgd", batch_size=100, max_steps=50, noise_multiplier=3.0)),
    (dp_fermi, paper_spec(name="dp_fermi", batch_size=100, max_steps=50, noise_multiplier=3.0, options={"lam": 1.0})),
])
def test_a_run_capped_by_max_steps_spends_its_budget(module, spec):
    planning._CACHE.clear()
    p = planning.plan(module, spec, n_train=5000, eps=4.0, delta=1e-5, constrained=True, discretization=1e-3)
    assert p.steps == 50
    spent = accountant.epsilon(p.event, 1e-5, discretization=1e-3)
    assert 0.99 * 4.0 <= spent <= 4.0
    assert p.spec.noise_multiplier < spec.noise_multiplier  # less noise, not more steps
    # the unscaled noise would have left budget unspent (the case this fixes)
    assert accountant.epsilon(planning.run_event(module, spec, 100 / 5000, 50, constrained=True), 1e-5) < 0.99 * 4.0


def test_the_noise_floor_stops_calibration_with_one_line(caplog):
    planning._CACHE.clear()
    spec = paper_spec(name="dp_sgd", batch_size=10, max_steps=3, noise_multiplier=3.0)
    with caplog.at_level(logging.INFO, logger="raco_cli.methods.planning"):
        p = planning.plan(dp_sgd, spec, n_train=5000, eps=1000.0, delta=1e-5, constrained=False, discretization=1e-2)
    assert p.spec.noise_multiplier == pytest.approx(0.1, rel=1e-6)  # limits.MIN_NOISE_MULTIPLIER
    lines = [r.getMessage() for r in caplog.records if "Budget use" in r.getMessage()]
    assert len(lines) == 1 and "noise floor" in lines[0] and "method.max_steps" in lines[0]


def test_a_run_within_max_steps_is_unchanged():
    planning._CACHE.clear()
    spec = paper_spec(name="dp_sgd", batch_size=100, max_steps=3000, noise_multiplier=1.0)
    p = planning.plan(dp_sgd, spec, n_train=5000, eps=1.0, delta=1e-5, constrained=False, discretization=1e-3)
    assert p.spec == spec and p.steps < 3000


def test_plans_are_cached_by_their_inputs(monkeypatch):
    planning._CACHE.clear()
    calls = []
    original = planning.plan_uncached
    monkeypatch.setattr(planning, "plan_uncached", lambda *a, **k: calls.append(1) or original(*a, **k))
    spec = paper_spec(name="dp_sgd", batch_size=100, steps=20, noise_multiplier=1.0)
    first = planning.plan(dp_sgd, spec, n_train=5000, eps=2.0, delta=1e-5, constrained=False, discretization=1e-3)
    assert planning.plan(dp_sgd, spec, n_train=5000, eps=2.0, delta=1e-5, constrained=False, discretization=1e-3) is first
    planning.plan(dp_sgd, replace(spec, lr=0.1), n_train=5000, eps=2.0, delta=1e-5, constrained=False, discretization=1e-3)
    planning.plan(dp_sgd, spec, n_train=5000, eps=3.0, delta=1e-5, constrained=False, discretization=1e-3)
    assert len(calls) == 3


@pytest.mark.parametrize("module, options", [(raco_dp, {}), (dp_fermi, {"lam": 1.0})])
def test_a_seed_sweeps_plans_from_their_neighbours_equal_plans_from_scratch(monkeypatch, module, options):
    """The seeds of a scope=model sweep each plan at their own released n~: each search starts
    from the previous plan's T and takes one secant step with its slope (planning._STEPS_HINTS).
    Every plan's T and eps equal the plan searched from scratch (bisection), in <= 3
    evaluations of eps each once a neighbour is known; raco_dp searches with accountant.max_steps,
    DP-FERMI (a run_event of its own) through planning._max_steps_of_run."""
    evaluations: list[int] = []
    search = accountant.largest_within

    def counted(eps_at, *args, **kwargs):
        return search(lambda T: (evaluations.append(T), eps_at(T))[1], *args, **kwargs)

    monkeypatch.setattr(accountant, "largest_within", counted)
    spec = paper_spec(name=module.NAME, batch_size=200, max_steps=3000, noise_multiplier=3.0, hist_noise_multiplier=12.0,
                      size_noise=50.0, preprocessing_noise=20.0, options=options)
    planning._STEPS_HINTS.clear()
    hinted, counts = [], []
    sizes = (5012, 4987, 5040, 4950, 5003)
    for n in sizes:
        evaluations.clear()
        p = planning.plan_uncached(module, replace(spec, train_size=n), n_train=n, eps=1.0, delta=1e-5, constrained=True,
                                   discretization=1e-3)
        hinted.append((p.steps, p.eps_planned))
        counts.append(len(evaluations))
    scratch = []
    for n in sizes:
        planning._STEPS_HINTS.clear()
        p = planning.plan_uncached(module, replace(spec, train_size=n), n_train=n, eps=1.0, delta=1e-5, constrained=True,
                                   discretization=1e-3)
        scratch.append((p.steps, p.eps_planned))
    assert hinted == scratch and len({T for T, _ in scratch}) > 1
    assert max(counts[1:]) <= 3 < counts[0]


def test_plans_computed_ahead_in_parallel_are_the_plans_computed_here(monkeypatch, caplog, tmp_path):
    """planning.plan_ahead (a sweep group's runs, each its own n~): the plans computed in forked
    processes are the plans each run computes alone (T, eps, noise, event), each run's plan()
    then finds its plan and logs what the plan logged, the whole-run eps is in the accountant's
    cache (the run's finish), and a request whose budget is unreachable is left to its run,
    which raises."""
    from raco_cli import cores

    spec = paper_spec(name="raco_dp", batch_size=200, max_steps=60, noise_multiplier=3.0, hist_noise_multiplier=12.0, size_noise=50.0)
    sizes = (5012, 4987, 5040, 4950, 5003, 4999, 5020, 4975)
    requests = [planning.PlanRequest("raco_dp", replace(spec, train_size=n), n, 1.0, 1e-5, True, 1e-3) for n in sizes]
    impossible = planning.PlanRequest("raco_dp", replace(spec, train_size=10.0), 10.0, 1e-3, 1e-5, True, 1e-3)

    def alone(r):
        planning._CACHE.clear()
        planning._STEPS_HINTS.clear()
        with caplog.at_level(logging.INFO, logger="raco_cli.methods.planning"):
            caplog.clear()
            p = planning.plan(raco_dp, r.spec, n_train=r.n_train, eps=r.eps, delta=r.delta, constrained=True, discretization=1e-3)
            return p, [rec.getMessage() for rec in caplog.records]

    want = [alone(r) for r in requests]
    assert any(lines for _, lines in want)  # (max_steps caps T: each plan logs its budget use)
    planning._CACHE.clear()
    planning._STEPS_HINTS.clear()
    accountant._EPSILON_CACHE.clear()
    monkeypatch.setattr(cores, "cpu_count", lambda: 3)
    monkeypatch.setattr(planning, "PLANS_PER_PROCESS", 2)
    group_log = logging.FileHandler(tmp_path / "group.log")  # as the group's Hydra log: inherited by the forks
    logging.getLogger().addHandler(group_log)
    try:
        with caplog.at_level(logging.INFO, logger="raco_cli.methods.planning"):  # (the processes log at the level of the fork)
            assert planning.plan_ahead([*requests, impossible]) == len(requests)
    finally:
        logging.getLogger().removeHandler(group_log)
        group_log.close()
    assert (tmp_path / "group.log").read_text() == ""  # the processes log nothing themselves: each run replays its plan's lines
    for r, (p_alone, lines) in zip(requests, want):
        assert accountant.epsilon_cache()[(repr(p_alone.event), 1e-5, 1e-3)] == p_alone.eps_planned
        with caplog.at_level(logging.INFO, logger="raco_cli.methods.planning"):
            caplog.clear()
            p = planning.plan(raco_dp, r.spec, n_train=r.n_train, eps=r.eps, delta=r.delta, constrained=True, discretization=1e-3)
            assert [rec.getMessage() for rec in caplog.records] == lines
        assert (p.steps, p.eps_planned, p.spec, repr(p.event)) == (p_alone.steps, p_alone.eps_planned, p_alone.spec, repr(p_alone.event))
    with pytest.raises(accountant.PrivacyBudgetError):
        planning.plan(raco_dp, impossible.spec, n_train=10.0, eps=1e-3, delta=1e-5, constrained=True, discretization=1e-3)
    monkeypatch.setattr(cores, "cpu_count", lambda: 1)  # one core: nothing ahead
    planning._CACHE.clear()
    assert planning.plan_ahead(requests) == 0


def test_plans_ahead_that_fail_cost_only_time(monkeypatch, caplog):
    """A failure of the parallel planning itself (a process that dies, a request that cannot be
    sent) is one warning line: the runs then plan one by one, as without it."""
    from raco_cli import cores

    def broken(requests):
        raise OSError("no more processes")

    monkeypatch.setattr(cores, "cpu_count", lambda: 2)
    monkeypatch.setattr(planning, "_plan_slice", broken)
    spec = paper_spec(name="dp_sgd", batch_size=100, steps=20, noise_multiplier=1.0)
    requests = [planning.PlanRequest("dp_sgd", spec, n, 2.0, 1e-5, False, 1e-3) for n in range(5000, 5008)]
    planning._CACHE.clear()
    with caplog.at_level(logging.WARNING, logger="raco_cli.methods.planning"):
        assert planning.plan_ahead(requests) == 0
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["planning 8 runs in 2 processes failed"]
    p = planning.plan(dp_sgd, spec, n_train=5000, eps=2.0, delta=1e-5, constrained=False, discretization=1e-3)
    assert p.steps == 20
