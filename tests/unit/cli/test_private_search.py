"""The private search of ``raco tune`` (privacy.scope=model): its eps is the whole search's, its
number of trials is drawn, and nothing but the best trial is written."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from raco_cli.cli import tune_cmd
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
    opts = SearchOptions(repetitions=reps, candidates=candidates, score_noise=30.0, sampler_seed=0, study="t")
    return PrivateSearch(opts, overrides)


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tune.trials=5"], "tune.trials is not an option of privacy.scope=model tuning"),
        (["tune.repetitions=geometric"], "tune.repetitions must be one of poisson, truncated_negative_binomial, fixed"),
        (["tune.mean=0.5"], "tune.mean must be a number >= 1"),
        (["tune.repetitions=fixed", "tune.mean=2.5"], "an integer for fixed repetitions"),
        (["privacy.scope=paper", "tune.mean=3"], "tune.mean is not an option of privacy.scope=paper tuning"),
    ],
)
def test_bad_private_options_are_one_line(args, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        tune_cmd.parse_args(args)


def test_a_non_private_method_is_tuned_under_the_paper_scope(tmp_path):
    with pytest.raises(ConfigError, match="privacy.scope=paper"):
        _search(tmp_path, Repetitions("fixed", 1), overrides=[*SMALL, "method=sgd"])


def test_private_tune_writes_only_the_best_trial_with_the_searchs_eps(tmp_path):
    """End to end: the best trial is a run whose eps_spent is the search's, whose records name
    the protocol, and nothing written counts the trials."""
    db = tmp_path / "mlflow.db"
    args = [sys.executable, "-m", "raco_cli", "tune", *[a for a in SMALL if a != "tracking=none"], "tune.candidates=3",
            # K >= 1 always: under poisson(3) one run in twenty draws K = 0 and releases nothing
            "tune.repetitions=truncated_negative_binomial", "tune.mean=3", "tune.study=s", f"tune.out={tmp_path / 'tune'}", f"tracking.uri=sqlite:///{db}"]
    res = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    run = tmp_path / "tune" / "s-1" / "best"  # the search's own directory: <tune.out>/<study>-<k>
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eps_target"] == 2.0 and 1.5 < summary["eps_spent"] <= 2.0
    assert summary["search"]["protocol"].startswith("private") and summary["search"]["eps_covers"] == "the search"
    assert summary["tuned_on"]["protocol"].startswith("private") and summary["tuned_on"]["outside_eps"] is False
    assert "RepeatAndSelect" in summary["event"] and summary["rho_spent"] is None
    assert summary["search"]["eps_trial"] < summary["eps_spent"]
    # the best trial's run and its configuration: no file per trial, no study
    written = sorted(str(p.relative_to(tmp_path / "tune")) for p in (tmp_path / "tune").rglob("*") if p.is_file())
    assert written == ["s-1/best.yaml", "s-1/best/.mlflow_run_id", "s-1/best/config.yaml", "s-1/best/curves.png", "s-1/best/model.pt",
                       "s-1/best/summary.json"]
    assert not any(k in summary["search"] for k in ("trials", "k", "n_trials"))
    best_yaml = (tmp_path / "tune" / "s-1" / "best.yaml").read_text()
    assert "protocol: private" in best_yaml and "search_eps" in best_yaml
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("tune-s")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1  # the best trial only
    assert runs[0].data.metrics["privacy/eps_spent"] == pytest.approx(summary["eps_spent"])
    assert runs[0].data.tags["raco.tune.eps_covers"] == "the search"
    from raco_cli.figures.report import report
    from raco_cli.tracking.mlflow_store import run_records

    text = report(run_records(f"sqlite:///{db}", "tune-s"), experiment="tune-s", uri=f"sqlite:///{db}")
    price = f"each trial at eps {summary['search']['eps_trial']:.3g} ("
    assert "Private searches" in text and price in text and "over 3 candidates" in text, text
    assert re.search(r"dp_sgd\s+2\s", text) and "dp_sgd     eps=2 " in text, text  # reported at the search's eps, not the trial's
    assert "per-trial eps" in res.stdout and math.isfinite(summary["metrics"]["test"]["accuracy"])
    # raco train's result table, for the released model, with the search's lines and where it is
    assert "dp_sgd on synthetic (none, gamma=0)" in res.stdout and " for the whole search" in res.stdout, res.stdout
    assert f"summary              {run / 'summary.json'}" in res.stdout and "  best trial           noisy validation" in res.stdout
    assert not (Path(tmp_path) / "outputs" / "optuna.db").exists()



def test_a_poisson_draw_of_no_trial_releases_nothing_and_says_so(tmp_path, monkeypatch, capsys):
    """K = 0 (probability exp(-mean) under poisson): one clear error, no run directory, no best.yaml."""
    from raco_cli.errors import RacoError
    from raco_cli.privacy import tuning

    monkeypatch.setattr(tuning, "draw_repetitions", lambda reps, rng: 0)
    opts, overrides = tune_cmd.parse_args([*SMALL, "tune.candidates=1", "tune.mean=2", f"tune.out={tmp_path / 'tune'}"])
    with pytest.raises(RacoError, match=r"drew no trial \(K = 0 under tune.repetitions=poisson\)"):
        tune_cmd.private_main(opts, overrides)
    assert not (tmp_path / "tune").exists()


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


def test_a_trial_config_is_the_composed_one(tmp_path):
    """The cached copy with eps and seed set resolves to what Hydra composes with them as overrides."""
    from omegaconf import OmegaConf

    from raco_cli.cli.validate import compose_job

    search = _search(tmp_path, Repetitions("fixed", 1), candidates=3, overrides=[*SMALL, "dataset.split_seed=${seed}"])
    for candidate in search.candidates:
        for eps, seed in ((0.37, 0), (1.25, 7)):
            fresh = compose_job([*SMALL, "dataset.split_seed=${seed}", "tracking.experiment=tune-t", *candidate, f"eps={eps!r}",
                                 f"seed={seed}"])
            cached = search._trial_config(candidate, eps, seed)
            assert OmegaConf.to_container(cached, resolve=True) == OmegaConf.to_container(fresh, resolve=True)


def test_a_users_config_dir_reaches_the_search_and_its_trials(tmp_path):
    """raco tune --config-dir <dir> dataset=<mine>: the user's own dataset option (what ``raco data
    describe`` writes) is composed for the search and for every trial, as under raco train."""
    from raco_cli.cli.validate import CONF_DIR

    conf = tmp_path / "myconf"
    (conf / "dataset").mkdir(parents=True)
    text = (CONF_DIR / "dataset" / "synthetic.yaml").read_text().replace("n: 4000", "n: 3000")
    (conf / "dataset" / "mine.yaml").write_text(text)
    args = ["--config-dir", str(conf), "dataset=mine", *[a for a in SMALL if not a.startswith("dataset=")], "tune.candidates=2"]
    opts, overrides = tune_cmd.parse_args(args)
    assert overrides[:2] == ["--config-dir", str(conf)] and opts["candidates"] == 2
    search = _search(tmp_path, Repetitions("fixed", 1), candidates=2, overrides=overrides)
    assert search.spec.dataset.options["n"] == 3000
    assert search._trial_config(search.candidates[1], 0.5, 3).dataset.options.n == 3000
    with pytest.raises(ConfigError, match="not a directory"):
        tune_cmd.parse_args(["--config-dir", str(tmp_path / "missing"), "dataset=mine"])
    with pytest.raises(ConfigError, match="Unknown option --trials"):
        tune_cmd.parse_args(["--trials", "3"])


def test_with_no_noisy_feasible_trial_the_closest_is_released_and_said_so(tmp_path, monkeypatch, capsys):
    """As raco train releases a run its noisy histograms call unsatisfied, the search releases the
    trial of least noisy violation, with one warning line."""
    from dataclasses import replace

    original = PrivateSearch._trial

    def infeasible(self, index, seed):
        return replace(original(self, index, seed), feasible=False, excess=0.1 + index)

    monkeypatch.setattr(PrivateSearch, "_trial", infeasible)
    args = [*SMALL, "tune.candidates=2", "tune.repetitions=fixed", "tune.mean=2", f"tune.out={tmp_path / 'tune'}", "tune.study=s"]
    opts, overrides = tune_cmd.parse_args(args)
    assert tune_cmd.private_main(opts, overrides) == 0
    out = capsys.readouterr().out
    assert "warning: no trial of the private search met constraint.gamma" in out and "closest to it" in out
    summary = json.loads((tmp_path / "tune" / "s-1" / "best" / "summary.json").read_text())
    assert summary["search"]["noisy_feasible"] is False
