"""What a run records in MLflow (raco_cli/run/records.py): its name and tags, the final metrics of
its released summary, and the failures of sweep jobs, with a recorder that only remembers calls."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from raco_cli.errors import ConfigError, TrackingError
from raco_cli.run import records


class Recorder:
    """The calls a :class:`raco_cli.tracking.mlflow_store.RunRecorder` would get."""

    def __init__(self, fail_tags: bool = False) -> None:
        self.metrics: list[tuple[dict, int]] = []
        self.tags: dict[str, str] = {}
        self.artifacts: list = []
        self.fail_tags = fail_tags

    def log_metrics(self, metrics, step):
        self.metrics.append((dict(metrics), step))

    def set_tags(self, tags):
        if self.fail_tags:
            raise OSError("store gone")
        self.tags.update(tags)

    def log_artifact(self, path):
        self.artifacts.append(path)


def _spec(**tracking):
    return SimpleNamespace(method=SimpleNamespace(name="raco_dp"), dataset=SimpleNamespace(display="adult"),
                           constraint=SimpleNamespace(name="dp"), eps=1.0, seed=3, config_hash="abc123",
                           tracking=SimpleNamespace(run_name=None, **tracking))


def test_a_run_is_named_after_method_dataset_constraint_budget_and_seed():
    assert records.run_name(_spec()) == "raco_dp-adult-dp-eps1-seed3"
    assert records.run_name(SimpleNamespace(**{**vars(_spec()), "rho": 0.5})) == "raco_dp-adult-dp-rho0.5-seed3"  # rho-zCDP runs
    named = _spec()
    named.tracking.run_name = "mine"
    assert records.run_name(named) == "mine"


def test_tags_are_the_configs_tags_as_strings_then_the_runs_own():
    resolved = {"tracking": {"tags": {"sweep": "fig4", "tune_trial": 7, "empty": None}}}
    assert records.extra_tags(resolved) == {"sweep": "fig4", "tune_trial": "7"}  # None: no tag
    assert records.extra_tags({}) == records.extra_tags({"tracking": {"tags": None}}) == {}
    tags = records.run_tags(_spec(), resolved, "outputs/runs/x")
    assert tags == {"sweep": "fig4", "tune_trial": "7", "method": "raco_dp", "dataset": "adult", "constraint": "dp",
                    "raco.config_hash": "abc123", "raco.run_dir": "outputs/runs/x"}


def _summary(**over):
    test = {"accuracy": 0.83, "loss": 0.4, "dp_gap": 0.03, "violation_hard": float("nan"), "satisfied": True,
            "constraints": {"dp": {"max_hard": 0.03, "max_violation_hard": -0.02, "max_violation_soft": None}},
            "group_accuracy": {"F": 0.9, "M": None}}
    summary = {"metrics": {"test": test, "release": {"noisy_violation": 0.01}}, "eps_spent": 0.97, "steps": 120,
               "selected_step": 100, "stats": {}, "satisfied": True, "private": True}
    summary.update(over)
    return summary


def test_the_final_metrics_are_the_released_summarys_finite_numbers():
    recorder = Recorder()
    records.log_final(recorder, _summary(), ["summary.json"], extra={"stats/nonfinite_rows": 0.0})
    assert recorder.metrics == [({
        "stats/nonfinite_rows": 0.0,
        "final/test/accuracy": 0.83, "final/test/loss": 0.4, "final/test/dp_gap": 0.03,  # NaN violation: not logged
        "final/test/gap/dp/max_hard": 0.03, "final/test/gap/dp/max_violation_hard": -0.02,
        "final/test/satisfied": 1.0, "final/test/group_accuracy/F": 0.9,
        "privacy/eps_spent": 0.97, "privacy/steps": 120.0, "selected_step": 100.0,
    }, 120)]
    assert recorder.tags == {"satisfied": "true", "private": "true"} and recorder.artifacts == ["summary.json"]


def test_timing_and_group_metrics_only_when_the_summary_holds_them():
    recorder = Recorder()
    stats = {"time_per_step_ms": 2.5, "batched": {"runs": 40}, "throughput_images_per_s": 900}
    records.log_final(recorder, _summary(eps_spent=None, rho_spent=0.2, stats=stats, private=False), [])
    final = recorder.metrics[0][0]
    assert "privacy/eps_spent" not in final and final["privacy/rho_spent"] == 0.2
    assert (final["time_per_step_ms"], final["batched_runs"], final["throughput_images_per_s"]) == (2.5, 40.0, 900.0)
    recorder = Recorder()
    records.log_final(recorder, _summary(), [])  # scope=model: no per-step timing in the summary, none recorded
    assert not {"time_per_step_ms", "batched_runs", "throughput_images_per_s"} & set(recorder.metrics[0][0])


def test_a_failing_tag_write_never_hides_the_runs_own_error(caplog):
    recorder = Recorder()
    records.tag_error(recorder, ValueError("x" * 6000))
    assert recorder.tags["raco.error"].startswith("ValueError: xxx") and len(recorder.tags["raco.error"]) == 5000
    records.tag_error(None, ValueError("no run"))  # tracking off: nothing to tag
    with caplog.at_level(logging.ERROR, logger="raco_cli.run.records"):
        records.tag_error(Recorder(fail_tags=True), ValueError("boom"))  # does not raise
    assert [r.getMessage() for r in caplog.records] == ["could not tag the failed run"]


def test_a_sweep_jobs_failure_is_recorded_once_and_only_when_nothing_else_recorded_it(tmp_path, monkeypatch):
    recorded = []
    monkeypatch.setattr(records, "record_failure_quietly", lambda cfg, run_dir, sweep_dir, exc: recorded.append(type(exc)))
    records.record_job_failure({}, tmp_path / "a", None, ConfigError("bad value"))
    records.record_job_failure({}, tmp_path / "b", None, TrackingError("the store itself failed"))  # it would fail again
    run = tmp_path / "c"
    run.mkdir()
    (run / records.RUN_ID_FILE).write_text("r1")  # the run got as far as MLflow: it marked itself FAILED
    assert records.has_run(run) and not records.has_run(tmp_path / "a")
    records.record_job_failure({}, run, None, ConfigError("late"))
    assert recorded == [ConfigError]


def test_a_failure_is_not_recorded_without_tracking_or_without_a_usable_config(tmp_path, monkeypatch):
    from raco_cli.tracking import mlflow_store

    monkeypatch.setattr(mlflow_store, "RunRecorder", lambda **kw: pytest.fail("no MLflow run for this failure"))
    records.record_failure({"eps": -1}, tmp_path, None, ConfigError("eps"))  # the config is what failed
    from raco_cli.cli.job_config import plain_job
    from raco_cli.cli.validate import compose_job

    off = plain_job(compose_job(["dataset=synthetic", "tracking=none"]))
    records.record_failure(off, tmp_path, None, ConfigError("x"))
    records.record_failure_quietly(off, tmp_path, None, ConfigError("x"))
