"""Sweeps, figures, reports and tuning through the CLI (subprocesses, temporary MLflow stores)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def raco(*args, cwd, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def mlflow_runs(db: Path, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


# small synthetic runs: a job is dominated by process start-up
# constraint.confidence=null: these test the sweep machinery, at gammas (0.02) short runs cannot support with the default margin
FAST = ["dataset=synthetic", "method.batch_size=200", "method.eval_every=10", "constraint.confidence=null"]


def finished_children(db: Path, experiment: str):
    _, runs = mlflow_runs(db, experiment)
    return [r for r in runs if r.data.tags.get("raco.role") not in ("sweep", "report")]


@pytest.mark.slow  # a 2x2 multirun, report and figure as subprocesses: ~30 s; the fast suite keeps the shorter cases of the same path
def test_2x2_joblib_multirun_then_report_and_figure(tmp_path):
    db, figs = tmp_path / "mlflow.db", tmp_path / "figs"
    uri = f"tracking.uri=sqlite:///{db}"
    res = raco("train", "--multirun", *FAST, "constraint.gamma=0.02,0.2", "seed=0,1", "method.steps=30",
               "method.calibrate_noise=true", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", uri,
               "tracking.experiment=fig9_low_eps", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    runs = finished_children(db, "fig9_low_eps")
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    assert len({r.data.tags["raco.config_hash"] for r in runs}) == 4
    assert sorted((r.data.params["constraint.gamma"], r.data.params["seed"]) for r in runs) == [
        ("0.02", "0"), ("0.02", "1"), ("0.2", "0"), ("0.2", "1")]

    rep = raco("report", "fig9_low_eps", "--all", "--out", str(figs), uri, cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    lines = rep.stdout.splitlines()
    assert lines[0] == f"experiment fig9_low_eps (sqlite:///{db}): 4 runs (4 finished)"
    assert lines[1].startswith("Pareto table: test accuracy vs test dp_gap, mean ± 95% CI over seeds; all configurations")
    rows = [ln for ln in lines if ln.startswith("raco_dp")]
    assert len(rows) == 2 and {r.split()[2] for r in rows} == {"gamma=0.02", "gamma=0.2"}
    assert all(r.split()[3] == "2" for r in rows)  # two seeds per configuration
    assert any(r.startswith("raco_dp*") for r in rows)  # the front is marked
    assert any(ln.strip().startswith("raco_dp    eps=1      train ") and "/4" in ln for ln in lines)
    assert (figs / "fig9_low_eps_report.txt").read_text().strip() == rep.stdout.strip()

    fig = raco("figures", "fig9_low_eps", "--out", str(figs), uri, cwd=tmp_path)
    assert fig.returncode == 0, fig.stderr
    png, pdf = figs / "fig9_low_eps.png", figs / "fig9_low_eps.pdf"
    assert fig.stdout.split() == [str(png), str(pdf)]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert pdf.read_bytes()[:5] == b"%PDF-"
    # figures and table are artifacts of the experiment's report run
    client, all_runs = mlflow_runs(db, "fig9_low_eps")
    report_run = [r for r in all_runs if r.data.tags.get("raco.role") == "report"]
    assert len(report_run) == 1
    names = {a.path for a in client.list_artifacts(report_run[0].info.run_id)}
    assert {"fig9_low_eps_report.txt", "fig9_low_eps.png", "fig9_low_eps.pdf"} <= names


def test_figure_and_report_without_runs_name_the_sweep(tmp_path):
    uri = f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"
    res = raco("figures", "fig4_adult", uri, cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "make sweep-fig4_adult" in res.stderr
    res = raco("report", "nothing_here", "--bogus", uri, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == (
        "error: raco report: unrecognized arguments: --bogus (see raco report --help)")


def test_failed_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    db = tmp_path / "mlflow.db"
    args = ["train", "--multirun", "dataset=synthetic,parkinsons", "dataset.download=false", "method.max_steps=10",
            "method.batch_size=200", "constraint.confidence=null", f"paths.data_dir={tmp_path / 'no_data'}", f"tracking.uri=sqlite:///{db}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    res = raco(*args, cwd=tmp_path, env={"RACO_DATA_MIRROR": ""})
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        "error: 1 of 2 sweep jobs failed (recorded FAILED in MLflow; their errors are above). "
        "Run the same command again to retry only the unfinished jobs.")
    runs = finished_children(db, "raco")
    status = {r.data.params.get("dataset.name"): r.info.status for r in runs}
    assert status == {"synthetic": "FINISHED", "parkinsons": "FAILED"}
    failed = [r for r in runs if r.info.status == "FAILED"][0]
    assert failed.data.tags["raco.error"].startswith("DataNotFoundError: Missing data file")
    # re-running retries only the failed job
    res = raco(*args, cwd=tmp_path, env={"RACO_DATA_MIRROR": ""})
    assert "1 already FINISHED in MLflow skipped" in res.stdout + res.stderr


def test_killed_sweep_resumes_with_only_the_missing_runs(tmp_path):
    """SIGKILL a sequential sweep once a run has finished; the re-run skips the finished runs."""
    db = tmp_path / "mlflow.db"
    # one job per run (a group would train the four runs together; its resume is the same skip by hash);
    # fixed T = 1500 (~2 s a run): a run of the planned T (~0.3 s) ends before the kill lands
    args = [sys.executable, "-m", "raco_cli", "train", "--multirun", *FAST, "seed=0,1,2,3", "method.steps=1500", "method.calibrate_noise=true",
            "hydra.sweeper.group=false", f"tracking.uri=sqlite:///{db}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            # the basic launcher runs jobs in order: job 1's directory means job 0 has finished
            # (the store is not polled: a reader racing the creating process breaks its migration)
            if (tmp_path / "sweep" / "1").is_dir():
                time.sleep(1.0)
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {r.info.run_id: r.data.tags["raco.config_hash"] for r in finished_children(db, "raco") if r.info.status == "FINISHED"}
    assert 1 <= len(before) < 4, "the sweep was not interrupted midway"

    res = raco(*args[3:], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"{len(before)} already FINISHED in MLflow skipped" in res.stdout + res.stderr
    runs = finished_children(db, "raco")
    done = [r for r in runs if r.info.status == "FINISHED"]
    assert sorted(r.data.params["seed"] for r in done) == ["0", "1", "2", "3"]  # each config ran to the end once
    assert set(before) <= {r.info.run_id for r in done}
    # the run the kill interrupted is no longer RUNNING (reaped as stale on the next run)
    assert not [r for r in runs if r.info.status == "RUNNING"]

    res = raco(*args[3:], cwd=tmp_path)  # nothing left: nothing runs
    assert "4 already FINISHED in MLflow skipped" in res.stdout and ", 0 to run" in res.stdout
    assert len(finished_children(db, "raco")) == len(runs)


def test_sweep_file_smoke_with_command_line_overrides(tmp_path):
    """`make sweep-fig4_adult SMOKE=1 ARGS=...`: a sweep file's grid, smoke mode, the command line wins."""
    db, figs = tmp_path / "mlflow.db", tmp_path / "figs"
    res = raco("train", "+sweep=fig4_adult", "hydra.sweeper.smoke=true", "hydra.sweeper.only=[sgda]",
               "dataset=synthetic", "seed=0", "hydra.launcher.n_jobs=2", f"tracking.uri=sqlite:///{db}",
               f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "sweep: 3 jobs, 3 to run [smoke]" in res.stdout + res.stderr
    runs = finished_children(db, "fig4_adult_smoke")
    assert sorted(r.data.params["constraint.gamma"] for r in runs) == ["0.02", "0.05", "0.1"]
    assert {(r.data.params["method.name"], r.data.params["dataset.name"], r.data.params["method.max_steps"]) for r in runs} == {
        ("sgda", "synthetic", "60")}
    fig = raco("figures", "--smoke", "--no-log", "--out", str(figs), f"tracking.uri=sqlite:///{db}", cwd=tmp_path)
    assert fig.returncode == 0, fig.stderr
    assert (figs / "fig4_adult_smoke.png").exists() and (figs / "fig4_adult_smoke.pdf").exists()
    assert "skipped (no runs yet): fig2a_celeba," in fig.stderr
    small = raco("figures", "fig4_adult", "--smoke", "--no-log", "--small", "--out", str(tmp_path / "small"),
                 f"tracking.uri=sqlite:///{db}", cwd=tmp_path)  # make reproduce's docs/figures form
    assert small.returncode == 0, small.stderr
    assert sorted(p.name for p in (tmp_path / "small").iterdir()) == ["fig4_adult_smoke.png"]
    from PIL import Image

    with Image.open(tmp_path / "small" / "fig4_adult_smoke.png") as im:
        assert im.mode == "P"  # a 128-colour palette
    assert (tmp_path / "small" / "fig4_adult_smoke.png").stat().st_size < (figs / "fig4_adult_smoke.png").stat().st_size


@pytest.mark.slow  # three sweep files as subprocesses: ~60 s; the fast suite keeps the shorter cases of the same path
def test_several_sweep_files_in_one_command(tmp_path):
    """`make reproduce`: `raco train +sweep=a,b` runs the sweeps one after the other in one
    process, each into its own experiment; a bad value for either is refused before any runs."""
    db = tmp_path / "mlflow.db"
    common = ["hydra.sweeper.smoke=true", "hydra.sweeper.only=[sgda]", "dataset=synthetic", "seed=0", "method.steps=20",
              "hydra.launcher.n_jobs=2", f"tracking.uri=sqlite:///{db}"]
    bad = raco("train", "+sweep=fig4_adult,no_such_sweep", *common, cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "no_such_sweep" in bad.stderr, bad.stderr
    assert not db.exists()  # nothing ran
    res = raco("train", "+sweep=fig4_adult,fig5_adult", *common, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "== raco train: sweep fig4_adult (1 of 2)" in res.stderr and "== raco train: sweep fig5_adult (2 of 2)" in res.stderr
    assert "raco train: 2 sweeps: fig4_adult " in res.stderr
    for experiment in ("fig4_adult_smoke", "fig5_adult_smoke"):
        runs = finished_children(db, experiment)
        assert runs and all(r.info.status == "FINISHED" and r.data.params["method.name"] == "sgda" for r in runs), experiment
    again = raco("train", "+sweep=fig4_adult,fig5_adult", *common, cwd=tmp_path)  # resumable: nothing left to run
    assert again.returncode == 0 and again.stderr.count(" 0 to run [smoke]") + again.stdout.count(" 0 to run [smoke]") == 2
    # one sweep directory given: each sweep in its own subdirectory, no run directory shared
    fixed = raco("train", "+sweep=fig4_adult,fig5_adult", *common, "hydra.sweeper.resume=false", f"hydra.sweep.dir={tmp_path / 's'}",
                 cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert (tmp_path / "s" / "fig4_adult" / "0" / "summary.json").exists() and (tmp_path / "s" / "fig5_adult" / "0" / "summary.json").exists()


@pytest.mark.slow  # a search, its resume and retrain as subprocesses: ~40 s; the fast suite keeps the shorter cases of the same path
def test_tune_runs_resumes_and_retrains(tmp_path):
    db = tmp_path / "mlflow.db"
    base = ["tune", "privacy.scope=paper", *FAST, "constraint.gamma=0.5", "method.max_steps=30", "tune.trial_seeds=1", "tune.seeds=2", "tune.study=t",
            f"tune.storage=sqlite:///{tmp_path / 'optuna.db'}", f"tune.out={tmp_path / 'tune'}", f"tracking.uri=sqlite:///{db}"]
    res = raco(*base, "tune.trials=2", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "study t (sqlite:///" in res.stdout and "0 trials done, 2 to run" in res.stdout
    assert (tmp_path / "tune" / "t" / "best.yaml").read_text().startswith("# @package _global_\n# Tuned by `raco tune`")
    runs = finished_children(db, "tune-t")
    assert len(runs) == 2 and sorted(r.data.params["seed"] for r in runs) == ["1000", "1001"]
    res = raco(*base, "tune.trials=3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "2 trials done, 1 to run" in res.stdout
    best = [ln for ln in res.stdout.splitlines() if ln.startswith("best feasible trial #")][0]
    trial = best.split("#")[1].split(":")[0]
    runs = [r for r in finished_children(db, "tune-t") if r.data.tags.get("tune_trial") == trial]
    assert sorted(r.data.params["seed"] for r in runs) == ["1000", "1001"]  # no seed retrained twice


def test_multirun_with_cfg_is_one_line(capsys):
    from raco_cli.cli.main import main

    assert main(["train", "--multirun", "seed=0,1", "--cfg", "job"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: raco train takes one of --cfg, --info, --multirun, --run, --shell-completion (got --cfg and "
                   "--multirun). To see a sweep job's config, drop --multirun: raco train <overrides> --cfg job.")
