"""``raco tune`` under privacy.scope=model, the command's side (raco_cli/cli/tune_private.py):
Hydra composes the search's configs, and nothing but the best trial is written, into the search's
own directory.  (The search itself: tests/unit/run/test_private_search.py.)"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raco_cli.cli import tune_cmd, tune_private
from raco_cli.cli.tune_private import HydraSearchConfigs
from raco_cli.errors import ConfigError
from raco_cli.privacy.tuning import Repetitions
from raco_cli.run.private_search import PrivateSearch, SearchOptions

SMALL = ["dataset=synthetic", "method=dp_sgd", "constraint=none", "eps=2", "method.max_steps=40", "method.eval_every=20",
         "tracking=none"]


def _search(tmp_path, reps, candidates=1, overrides=SMALL):
    opts = SearchOptions(repetitions=reps, candidates=candidates, score_noise=30.0, study="t")
    return PrivateSearch(opts, HydraSearchConfigs(overrides))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tune.trials=5"], "tune.trials is not an option of privacy.scope=model tuning"),
        (["tune.repetitions=geometric"], "tune.repetitions must be one of poisson, truncated_negative_binomial, fixed"),
        (["tune.mean=0.5"], "tune.mean must be a number >= 1"),
        (["tune.repetitions=fixed", "tune.mean=2.5"], "an integer for fixed repetitions"),
        (["privacy.scope=paper", "tune.mean=3"], "tune.mean is not an option of privacy.scope=paper tuning"),
        # K, the candidates and the trials' seeds are CSPRNG draws: no seed to give them
        (["tune.sampler_seed=3"], "tune.sampler_seed is not an option of privacy.scope=model tuning: the private search draws"),
    ],
)
def test_bad_private_options_are_one_line(args, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        tune_cmd.parse_args(args)


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
    # (below 2 when every candidate its CSPRNG draws is capped by max_steps: a search spends at most eps)
    assert summary["eps_target"] == 2.0 and 0 < summary["eps_spent"] <= 2.0
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
    # nothing tells K: no process timing (start = end, no pid start, no heartbeat), and the run is
    # named by a random id, not by its trial's seed (a CSPRNG draw of the search)
    info, tags = runs[0].info, runs[0].data.tags
    assert info.start_time == info.end_time and not {"raco.pid_start", "raco.heartbeat", "raco.pid"} & set(tags)
    assert "seed" not in info.run_name and str(summary["seed"]) not in info.run_name, info.run_name
    assert tags["raco.seed.init"].startswith("secret") and "wall_time_s" not in summary.get("stats", {})
    assert not list((tmp_path / ".raco-locks").glob("*.lock"))  # the run's lock went with it
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
        tune_private.private_main(opts, overrides)
    assert not (tmp_path / "tune").exists()


def test_a_trial_config_is_the_composed_one(tmp_path):
    """The cached copy with eps and seed set resolves to what Hydra composes with them as overrides
    (and the search's trial config is that, as plain dicts)."""
    from omegaconf import OmegaConf

    from raco_cli.cli.validate import compose_job

    search = _search(tmp_path, Repetitions("fixed", 1), candidates=3, overrides=[*SMALL, "dataset.split_seed=${seed}"])
    for candidate in search.candidates:
        for eps, seed in ((0.37, 0), (1.25, 7)):
            fresh = compose_job([*SMALL, "dataset.split_seed=${seed}", "tracking.experiment=tune-t", *candidate, f"eps={eps!r}",
                                 f"seed={seed}"])
            cached = search.configs.job(candidate, eps, seed, experiment=f"tune-{search.study}")
            assert OmegaConf.to_container(cached, resolve=True) == OmegaConf.to_container(fresh, resolve=True)
            assert search._trial_config(candidate, eps, seed) == OmegaConf.to_container(fresh, resolve=True)  # what the run layer takes


@pytest.mark.slow  # a whole search from a config dir: ~28 s; the fast suite keeps the shorter cases of the same path
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
    assert search.configs.job(search.candidates[1], 0.5, 3, experiment=f"tune-{search.study}").dataset.options.n == 3000
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
    assert tune_private.private_main(opts, overrides) == 0
    out = capsys.readouterr().out
    assert "warning: no trial of the private search met constraint.gamma" in out and "closest to it" in out
    summary = json.loads((tmp_path / "tune" / "s-1" / "best" / "summary.json").read_text())
    assert summary["search"]["noisy_feasible"] is False
