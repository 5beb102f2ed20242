"""End to end trust checks: reproducibility, SIGKILL mid-training, unwritable or full output
directories, and ``raco audit`` input errors (subprocesses from a temporary directory)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

# constraint.confidence=null: 30 steps cannot support the default margin at gamma 0.05
SMALL = ["dataset=synthetic", "method.batch_size=200", "method.max_steps=30", "constraint.confidence=null"]


def raco(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def runs_of(db: Path, experiment: str = "raco"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


def test_same_config_and_seed_give_identical_summaries_and_logged_seeds(tmp_path):
    db = tmp_path / "mlflow.db"
    a = raco("train", *SMALL, "seed=7", "privacy.secure_rng=false", f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    b = raco("train", *SMALL, "seed=7", "privacy.secure_rng=false", "tracking=none", f"hydra.run.dir={tmp_path / 'b'}", cwd=tmp_path)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    sa, sb = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("a", "b"))
    for key in ("metrics", "last_metrics", "lambda", "selected_step", "eps_spent", "steps", "seeds", "event", "config_hash"):
        assert sa[key] == sb[key], key
    assert sa["seeds"]["sampling"] != sa["seeds"]["noise"] and sa["secure_rng"] is False
    # separate sampling / noise seeds, and the RNG caveat, are in MLflow too
    _, runs = runs_of(db)
    tags = runs[0].data.tags
    assert tags["raco.seed.sampling"] == str(sa["seeds"]["sampling"]) and tags["raco.seed.noise"] == str(sa["seeds"]["noise"])
    assert tags["raco.secure_rng"] == "false" and runs[0].data.params["privacy.secure_rng"] == "False"
    assert (a.stdout + a.stderr).count("privacy.secure_rng=false: noise") == 1


@pytest.mark.slow
def test_sigkill_mid_training_leaves_a_consistent_store_marked_failed_on_the_next_run(tmp_path):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "raco_cli", "train", "dataset=synthetic", "method=sgda", "method.steps=1000000",
         "method.eval_every=2000", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'killed'}"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 240
        run = None
        while time.time() < deadline:  # wait until the run is recording metrics
            time.sleep(1.0)
            # open the store only once the run exists: a reader racing the process that creates
            # the SQLite schema can break its migration (the run then never starts)
            if (tmp_path / "killed" / ".mlflow_run_id").exists():
                try:
                    client, runs = runs_of(db)
                except Exception:  # noqa: BLE001 - store still being created
                    continue
                if runs and client.get_metric_history(runs[0].info.run_id, "val/accuracy"):
                    run = runs[0]
                    break
        assert run is not None, "the run never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    client, runs = runs_of(db)  # the store opens and still holds the run and its metrics
    assert [r.info.status for r in runs] == ["RUNNING"]
    assert client.get_metric_history(run.info.run_id, "val/accuracy")
    assert not (tmp_path / "killed" / "summary.json").exists()
    listed = raco("runs", "stale", "--uri", uri, cwd=tmp_path)
    assert listed.returncode == 0 and f"{run.info.run_id}  stale: process {run.data.tags['raco.pid']}" in listed.stdout
    # re-running completes: the new run finishes, the killed one is marked FAILED with the reason
    again = raco("train", "dataset=synthetic", "method=sgda", "method.steps=20", f"tracking.uri={uri}",
                 f"hydra.run.dir={tmp_path / 'again'}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    _, runs = runs_of(db)
    status = {r.info.run_id: r for r in runs}
    assert status[run.info.run_id].info.status == "FAILED"
    assert "is gone (killed or crashed)" in status[run.info.run_id].data.tags["raco.stale_reason"]
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED"]


@contextmanager
def _mounted_tmpfs(path: Path, options: str):
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip("needs permission to mount a tmpfs (root in a container)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _read_only_dir(tmp_path: Path):
    if os.geteuid() != 0:  # permissions stop non-root users
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        @contextmanager
        def ctx():
            yield d
            d.chmod(0o755)
        return ctx()
    return _mounted_tmpfs(tmp_path / "ro", "ro,size=1m")


def test_read_only_output_directory_is_one_line_and_no_record(tmp_path):
    db = tmp_path / "mlflow.db"
    with _read_only_dir(tmp_path) as ro:
        res = raco("train", *SMALL, f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={ro}/run", cwd=tmp_path)
    # root: a read-only tmpfs; other users: a directory without write permission
    reason = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"error: Cannot write to the output directory {ro}/run: {reason}. Free some space or choose "
        "a writable location with hydra.run.dir=<dir> (sweeps: hydra.sweep.dir=<dir>)."
    )
    assert not db.exists()


def test_full_output_directory_is_one_line_and_no_record(tmp_path):
    db = tmp_path / "mlflow.db"
    with _mounted_tmpfs(tmp_path / "full", "size=256k") as full:
        # fill the file system
        subprocess.run(["dd", "if=/dev/zero", f"of={full / 'filler'}", "bs=4096"], capture_output=True)
        res = raco("train", *SMALL, f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={full}/run", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().startswith(f"error: Cannot write to the output directory {full}/run: No space left on device.")
    assert len(res.stderr.strip().splitlines()) == 1 and not db.exists()


def test_disk_full_while_writing_outputs_marks_the_run_failed(tmp_path, monkeypatch):
    """The disk fills up during the run: one line (OutputError) and the MLflow run FAILED."""
    import errno

    from raco_cli.cli.validate import compose_config
    from raco_cli.errors import OutputError
    from raco_cli.run import train as train_mod
    from raco_cli.tracking import summary

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(summary, "write", full)
    db = tmp_path / "mlflow.db"
    cfg = compose_config([*SMALL, f"tracking.uri=sqlite:///{db}"])
    with pytest.raises(OutputError) as info:
        train_mod.train(cfg, run_dir=tmp_path / "run")
    assert str(info.value) == (
        f"Cannot write to the output directory {tmp_path / 'run'}: No space left on device. Free some space or choose "
        "a writable location with hydra.run.dir=<dir> (sweeps: hydra.sweep.dir=<dir>)."
    )
    _, runs = runs_of(db)
    assert [r.info.status for r in runs] == ["FAILED"]


def test_audit_input_errors_are_one_line(tmp_path):
    for args, message in (
        (["audit.mechanism=off"], "error: audit.mechanism must be one of correct, broken_no_noise, broken_shared_class_noise with audit.target=histogram (got audit.mechanism='off'); broken_* are the audit's own test cases."),
        (["audit.target=gradient", "audit.mechanism=broken_no_noise"], "error: audit.mechanism must be one of correct, broken_noise_sigma, broken_clip_after_sum with audit.target=gradient (got audit.mechanism='broken_no_noise'); broken_* are the audit's own test cases."),
        (["audit.canary=5"], "error: Unknown key audit.canary. Allowed: audit.canaries, audit.beta, audit.label, audit.seed, audit.mechanism, audit.scale, audit.target, audit.out."),
        (["dataset=synthetic", "method=dp_sgd", "audit.canaries=20"], "error: raco audit audits the private histogram of RaCO-DP: it needs method=raco_dp and a rate constraint (got method=dp_sgd, constraint=dp); audit.target=gradient audits the gradient release."),
        (["dataset=synthetic", "method=dp_fermi", "audit.target=gradient", "audit.canaries=20"], "error: audit.target=gradient audits the noisy gradient sum of raco_dp and dp_sgd with model=logreg (got method=dp_fermi, model=logreg); use one of them."),
    ):
        res = raco("audit", *args, f"audit.out={tmp_path / 'a'}", cwd=tmp_path)
        assert res.returncode == 2 and res.stderr.strip() == message, res.stderr
