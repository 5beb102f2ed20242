"""raco tune: option parsing, resuming an interrupted study, best.yaml."""

from __future__ import annotations

import pytest
import yaml

from raco_cli.cli import tune_best, tune_cmd, tune_paper
from raco_cli.errors import ConfigError

optuna = pytest.importorskip("optuna")


def test_parse_args_splits_tune_options_from_overrides():
    opts, overrides = tune_cmd.parse_args(["privacy.scope=paper", "dataset=adult", "tune.trials=20", "tune.seeds=5", "eps=1"])
    assert overrides == ["privacy.scope=paper", "dataset=adult", "eps=1"]  # the paper's protocol
    assert opts["trials"] == 20 and opts["seeds"] == 5 and opts["trial_seeds"] == 5
    opts, overrides = tune_cmd.parse_args(["dataset=adult", "tune.mean=5", "eps=1"])
    assert overrides == ["dataset=adult", "eps=1"]  # by default the private search (privacy.scope=model)
    assert opts["mean"] == 5 and opts["repetitions"] == "poisson"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tune.trails=3"], "Unknown key tune.trails. Allowed: tune.trials, tune.trial_seeds, tune.seeds, "),
        (["privacy.scope=paper", "tune.trials=0"], "tune.trials must be a positive integer (got tune.trials=0)."),
        (["privacy.scope=paper", "tune.trial_seeds=two"], "tune.trial_seeds must be a positive integer (got tune.trial_seeds='two')."),
        (["--fast"], "Unknown option --fast. raco tune takes --config-dir <dir> and key=value overrides (raco tune --help)."),
    ],
)
def test_bad_options_are_one_line(args, message):
    with pytest.raises(ConfigError) as info:
        tune_cmd.parse_args(args)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def _study(tmp_path, name="s"):
    return optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / 'o.db'}", direction="maximize")


def test_interrupted_trials_are_failed_and_queued_again_once(tmp_path):
    from optuna.trial import TrialState

    study = _study(tmp_path)
    done = study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 10.0, log=True)})
    study.tell(done, 0.8)
    killed = study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 10.0, log=True)})  # left RUNNING
    bad = study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 10.0, log=True)})
    bad.set_user_attr("error", "no step fits the budget")
    study.tell(bad, state=TrialState.FAIL)  # a trial that failed on its own: not retried

    reloaded = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'o.db'}")
    assert tune_paper._requeue_interrupted(reloaded) == 1
    trials = reloaded.get_trials()
    assert trials[killed.number].state == TrialState.FAIL
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].system_attrs["fixed_params"] == {"lr": killed.params["lr"]}
    assert tune_paper._requeue_interrupted(reloaded) == 0  # a second resume does not queue it twice


def test_best_feasible_ignores_infeasible_and_incomplete_trials(tmp_path):
    study = _study(tmp_path)
    for value, violation in ((0.90, 0.01), (0.83, -0.001), (0.84, 0.0), (0.84, -0.02)):
        t = study.ask()
        t.set_user_attr("violation", violation)
        study.tell(t, value)
    study.ask()  # running
    best = tune_paper.best_feasible(study.get_trials())
    assert best is not None and best.number == 2  # highest feasible value, the earlier of a tie
    assert tune_paper.best_feasible([]) is None


def test_best_yaml_is_an_experiment_config_with_provenance(tmp_path):
    study = _study(tmp_path)
    t = study.ask()
    t.set_user_attr("violation", -0.01)
    t.set_user_attr("overrides", ["method.lr=2.5", "method.batch_size=512", "method.hist_noise_multiplier=4.0"])
    t.set_user_attr("val_accuracy_per_seed", [0.83, 0.84])
    study.tell(t, 0.835)
    path = tune_best.write_best(study.get_trials()[0], study_name="s", storage="sqlite:///o.db",
                               overrides=["dataset=adult", "eps=1"], n_trials=1, out=tmp_path / "out")
    text = path.read_text()
    assert text.startswith("# @package _global_\n# Tuned by `raco tune` on ")
    assert "trial #0: validation accuracy 0.8350" in text and "(mean over 2 seeds)" in text
    assert "# Search overrides: dataset=adult eps=1" in text
    assert yaml.safe_load(text) == {"method": {"lr": 2.5, "batch_size": 512, "hist_noise_multiplier": 4.0}}


def test_best_yaml_nests_dotted_keys(tmp_path):
    """DP-FERMI's lambda is method.options.lam: a YAML key "options.lam" would be one key that
    no config reads, and the tuned lambda would be silently dropped."""
    study = _study(tmp_path)
    t = study.ask()
    t.set_user_attr("violation", -0.01)
    t.set_user_attr("overrides", ["method.lr=2.5", "method.options.lam=4.0"])
    study.tell(t, 0.9)
    path = tune_best.write_best(study.get_trials()[0], study_name="s", storage="sqlite:///o.db",
                               overrides=["method=dp_fermi"], n_trials=1, out=tmp_path / "out")
    assert yaml.safe_load(path.read_text()) == {"method": {"lr": 2.5, "options": {"lam": 4.0}}}


def _open(args):
    tune_paper.open_study(*args)
    return True


def test_searches_started_at_once_share_a_new_storage(tmp_path):
    """Two `raco tune` started together into one new SQLite file raced to create Optuna's schema
    (UNIQUE constraint failed: alembic_version.version_num, a traceback); creation is locked.
    Without the lock this test failed in 3 of 4 runs (a race: eight processes at once)."""
    import multiprocessing as mp

    storage = f"sqlite:///{tmp_path / 'sub' / 'optuna.db'}"
    with mp.get_context("spawn").Pool(8) as pool:
        assert pool.map(_open, [(f"s{i}", storage) for i in range(8)]) == [True] * 8
    assert sorted(s.study_name for s in optuna.get_all_study_summaries(storage)) == [f"s{i}" for i in range(8)]
