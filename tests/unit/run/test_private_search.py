"""The private search of ``raco tune`` (privacy.scope=model, raco_cli/run/private_search.py): its
eps is the whole search's, its number of trials is drawn, its candidates are local and read no
data.  (The command's side, composing its configs and writing its result:
tests/unit/cli/test_tune_private.py.)"""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from raco_cli.cli.tune_private import HydraSearchConfigs
from raco_cli.errors import ConfigError
from raco_cli.privacy.tuning import Repetitions
from raco_cli.run.private_search import (
    PrivateSearch,
    SearchOptions,
    Trial,
    draw_candidates,
    score_event,
)

SMALL = ["dataset=synthetic", "method=dp_sgd", "constraint=none", "eps=2", "method.max_steps=40", "method.eval_every=20",
         "tracking=none"]


def _search(tmp_path, reps, candidates=1, overrides=SMALL):
    opts = SearchOptions(repetitions=reps, candidates=candidates, score_noise=30.0, study="t")
    return PrivateSearch(opts, HydraSearchConfigs(overrides))


def test_the_search_eps_is_dp_accountings_repeat_and_select_of_the_trial(tmp_path):
    """One candidate: the trial is one event, and the whole search (the releases made once, then
    the best of K trials) is accounted by dp-accounting's own RDP accountant independently."""
    reps = Repetitions("truncated_negative_binomial", 4.0, 1.0)
    search = _search(tmp_path, reps)
    assert search.usable == [0]
    prep = search._prepare(search.candidates[0], search.eps_trial)
    trial = dpa.ComposedDpEvent([prep.plan.event, score_event(30.0)])
    library = rdp_lib.RdpAccountant()
    library.compose(dpa.ComposedDpEvent([*search.before, dp_event.RepeatAndSelectDpEvent(trial, 4.0, 1.0)]))
    assert search.eps_spent == pytest.approx(library.get_epsilon(search.delta), rel=1e-6)
    assert search.eps_spent <= 2.0
    one_trial = rdp_lib.RdpAccountant()
    one_trial.compose(dpa.ComposedDpEvent([*search.before, trial]))
    assert one_trial.get_epsilon(search.delta) < 0.7 * search.eps_spent  # the search costs well above one trial


def test_fixed_repetitions_are_accounted_as_their_composition(tmp_path):
    search = _search(tmp_path, Repetitions("fixed", 3))
    prep = search._prepare(search.candidates[0], search.eps_trial)
    trial = dpa.ComposedDpEvent([prep.plan.event, score_event(30.0)])
    library = rdp_lib.RdpAccountant()
    library.compose(dpa.ComposedDpEvent([*search.before, dpa.SelfComposedDpEvent(trial, 3)]))
    assert search.eps_spent == pytest.approx(library.get_epsilon(search.delta), rel=1e-6)


def test_the_number_of_trials_is_drawn_at_each_search(tmp_path, monkeypatch):
    """run() draws K afresh (never the mean): over many searches with stub trials K varies and
    averages the distribution's mean."""
    reps = Repetitions("truncated_negative_binomial", 3.0, 1.0)
    search = _search(tmp_path, reps)
    counts = []

    def stub(self, index, seed):
        counts[-1] += 1
        return Trial(list(self.candidates[index]), None, None, float(seed), 1.0, True)

    monkeypatch.setattr(PrivateSearch, "_trial", stub)
    for _ in range(300):
        counts.append(0)
        search.run()
    assert len(set(counts)) > 3
    assert np.mean(counts) == pytest.approx(3.0, rel=0.2)


def test_trials_are_ranked_feasible_first_then_by_noisy_count():
    a = Trial([], None, None, 900.0, 1000.0, False, excess=0.02)
    b = Trial([], None, None, 800.0, 1000.0, True)
    c = Trial([], None, None, 850.0, 1000.0, True)
    assert max([a, b, c], key=lambda t: t.rank) is c
    # none noisy-feasible: the one closest to its target, not the most accurate (the least fair)
    d = Trial([], None, None, 990.0, 1000.0, False, excess=0.08)
    e = Trial([], None, None, 700.0, 1000.0, False, excess=0.01)
    assert max([a, d, e], key=lambda t: t.rank) is e


GIVEN = {"noise_multiplier": 3.0, "laplace_b": 12.0, "lr": 4.0, "lr_dual": 0.2, "batch_size": 256, "temperature": 2.0,
         "lam": None}


def _values(candidate):
    return {o.split("=")[0]: float(o.split("=")[1]) for o in candidate}


def test_candidates_are_local_and_a_function_of_the_given_values_the_seed_and_n_tilde():
    """Each searched value is the given one times a factor in its LOCAL_RANGE; the batch size
    stays within [8, n~/2]; nothing else enters (no data)."""
    assert draw_candidates("raco_dp", 5, 3, GIVEN, 4000) == draw_candidates("raco_dp", 5, 3, GIVEN, 4000)
    assert draw_candidates("raco_dp", 5, 3, GIVEN, 4000) != draw_candidates("raco_dp", 5, 4, GIVEN, 4000)
    drawn = [_values(c) for c in draw_candidates("raco_dp", 300, 0, GIVEN, 600)]
    lrs = [v["method.lr"] for v in drawn]
    assert 1.0 <= min(lrs) < 1.3 and 12.5 < max(lrs) <= 16.0  # 4 x [1/4, 4], spread over it
    assert all(2.0 <= v["method.noise_multiplier"] <= 4.5 for v in drawn)
    batches = [v["method.batch_size"] for v in drawn]
    assert 64 <= min(batches) < 75 and max(batches) == 300  # 256 x [1/4, 2], capped at n~/2 = 300
    assert all(set(v) == {"method.noise_multiplier", "method.hist_noise_multiplier", "method.lr", "method.lr_dual",
                          "method.batch_size", "method.temperature"} for v in drawn)  # lam is None: not raco_dp's
    assert [set(_values(c)) for c in draw_candidates("dp_sgd", 1, 0, GIVEN, 600)] == [
        {"method.noise_multiplier", "method.lr", "method.batch_size"}]


@pytest.mark.slow  # a whole search (planning and its trials): ~65 s; the fast suite keeps the shorter cases of the same path
def test_the_search_scales_the_configuration_as_resolved_from_the_released_size(tmp_path):
    """Candidate 0 is the configuration as given; the others scale its auto batch size, which is
    the power of two nearest n~/16 (a release), not a fixed range."""
    search = _search(tmp_path, Repetitions("fixed", 1), candidates=6, overrides=[*SMALL, "method.batch_size=auto"])
    assert search.candidates[0] == []
    given = search._prepare([], float(search.spec.eps)).plan.spec.batch_size
    batches = [_values(c)["method.batch_size"] for c in search.candidates[1:]]
    assert all(given / 4 - 1 <= b <= given * 2 + 1 for b in batches) and len(set(batches)) > 1


@pytest.mark.slow  # two raco_dp searches planned (~36 s each on 2 cores): the fast run stays under ~10 min
def test_an_auto_dual_step_stays_auto_and_an_explicit_one_is_searched(tmp_path):
    constrained = ["dataset=synthetic", "method=raco_dp", "constraint=dp", "eps=2", "method.max_steps=40", "tracking=none"]
    auto = _search(tmp_path, Repetitions("fixed", 1), candidates=3, overrides=[*constrained, "method.lr_dual=auto"])
    assert not any(o.startswith("method.lr_dual=") for c in auto.candidates for o in c)
    fixed = _search(tmp_path, Repetitions("fixed", 1), candidates=3, overrides=[*constrained, "method.lr_dual=0.5"])
    duals = [_values(c)["method.lr_dual"] for c in fixed.candidates[1:]]
    assert all(0.125 <= d <= 2.0 for d in duals) and len(set(duals)) == 2


def test_a_non_private_method_is_tuned_under_the_paper_scope(tmp_path):
    with pytest.raises(ConfigError, match="privacy.scope=paper"):
        _search(tmp_path, Repetitions("fixed", 1), overrides=[*SMALL, "method=sgd"])


def test_candidates_planned_for_too_few_steps_are_left_out_of_the_draw(tmp_path):
    """A candidate whose plan at the trial's eps has fewer than FEW_STEPS steps is not drawn
    when others have enough; when none has, those that take a step are."""
    from raco_cli.run.prepare import FEW_STEPS

    overrides = [*SMALL, "method.max_steps=400"]
    search = _search(tmp_path, Repetitions("fixed", 1), overrides=overrides)
    search.candidates = [["method.batch_size=600"], ["method.batch_size=50"]]  # q ~ 1/4 vs 1/50 of ~2 500 rows
    steps = [search._prepare(c, 0.5).plan.steps for c in search.candidates]
    assert steps[0] < FEW_STEPS <= steps[1], steps
    assert sorted(search._events(0.5)) == [1]
    search.candidates = [["method.batch_size=600"]]
    assert sorted(search._events(0.5)) == [0]


class _ScriptedDraws:
    """The CSPRNG's face (raco_cli.privacy.csprng.SecureDraws), scripted: K = ``k``, every uniform
    at its low end, each trial the last usable candidate and the seeds 1000, 1001, ..."""

    def __init__(self, k: int, log: list) -> None:
        self.k, self.log, self.seeds = k, log, iter(range(1000, 2000))

    def negative_binomial(self, n, p):
        self.log.append(("K", n, p))
        return self.k

    def poisson(self, lam):
        self.log.append(("K", lam))
        return self.k

    def uniform(self, low, high):
        self.log.append(("uniform",))
        return low

    def integers(self, high):
        self.log.append(("integers", high))
        return next(self.seeds) if high == 2**31 - 1 else high - 1


def test_k_the_candidates_and_the_trial_seeds_come_from_the_csprng(tmp_path, monkeypatch):
    """The search's every secret draw goes through ``secure_draws`` (the OS CSPRNG; replaced here
    by a script): the candidates' factors, K and each trial's candidate and seed follow it, and
    nothing is drawn from a seed (there is no tune.sampler_seed under scope=model)."""
    from raco_cli.run import private_search
    from raco_cli.run.tune_space import LOCAL_RANGE

    log: list = []
    monkeypatch.setattr(private_search, "secure_draws", lambda: _ScriptedDraws(3, log))
    reps = Repetitions("truncated_negative_binomial", 3.0, 1.0)
    search = _search(tmp_path, reps, candidates=3)
    given = search._prepare([], float(search.spec.eps)).plan.spec
    for candidate in search.candidates[1:]:  # every factor at its range's low end: the script's uniforms
        assert _values(candidate)["method.lr"] == pytest.approx(given.lr * LOCAL_RANGE["lr"][0], rel=1e-3)
    assert search.candidates[1] == search.candidates[2]
    assert not hasattr(search.opts, "sampler_seed")
    trials = []

    def stub(self, index, seed):
        trials.append((index, seed))
        return Trial(list(self.candidates[index]), None, None, float(seed), 1.0, True)

    monkeypatch.setattr(PrivateSearch, "_trial", stub)
    log.clear()
    search.run()
    assert log[0] == ("K", 1.0, pytest.approx(reps.gamma))  # K: the script's draw of D_{eta,gamma}
    assert trials == [(search.usable[-1], 1000), (search.usable[-1], 1001), (search.usable[-1], 1002)]


def test_the_csprngs_draws_follow_their_distributions():
    """SecureDraws' inversions have numpy's distributions (means and a few probabilities)."""
    from raco_cli.privacy.csprng import SecureDraws

    d = SecureDraws()
    n = 4000
    poisson = np.array([d.poisson(3.0) for _ in range(n)])
    assert poisson.mean() == pytest.approx(3.0, abs=0.15) and np.mean(poisson == 0) == pytest.approx(np.exp(-3.0), abs=0.02)
    nb = np.array([d.negative_binomial(1.0, 0.25) for _ in range(n)])  # geometric failures: mean (1-p)/p = 3
    assert nb.mean() == pytest.approx(3.0, abs=0.25) and np.mean(nb == 0) == pytest.approx(0.25, abs=0.025)
    logs = np.array([d.logseries(0.9) for _ in range(n)])
    assert logs.min() >= 1 and logs.mean() == pytest.approx(-0.9 / (0.1 * np.log(0.1)), rel=0.08)
    ints = [d.integers(5) for _ in range(n)]
    assert set(ints) == {0, 1, 2, 3, 4}
    u = [d.uniform(2.0, 3.0) for _ in range(200)]
    assert 2.0 < min(u) and max(u) < 3.0
