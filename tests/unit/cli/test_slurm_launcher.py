"""The SLURM launcher's logic without a cluster: refusals, the squeue fallback, lost tasks,
pickling for the task process (the real scheduler: tests/slurm, `make test-slurm`)."""

from __future__ import annotations

import logging
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from raco_cli.cli import slurm, slurm_cluster
from raco_cli.errors import ConfigError


def _import_submitit_without_its_logging_config() -> None:
    """submitit runs ``logging.config.dictConfig`` when first imported: it clears every logging
    handler and binds new ones to the streams of that moment, which inside pytest's output
    capture broke the capture of later tests in the same xdist worker.  These tests need none
    of its handlers (``SUBMITIT_LOG_LEVEL=NOCONFIG`` skips the configuration)."""
    import importlib

    saved = os.environ.get("SUBMITIT_LOG_LEVEL")
    os.environ["SUBMITIT_LOG_LEVEL"] = "NOCONFIG"
    try:
        importlib.import_module("submitit")
    finally:
        if saved is None:
            del os.environ["SUBMITIT_LOG_LEVEL"]
        else:
            os.environ["SUBMITIT_LOG_LEVEL"] = saved


_import_submitit_without_its_logging_config()

# sbatch's stderr on a one-node cluster (slurm-wlm 22.05), verbatim
MEMORY = ("sbatch: error: Memory specification can not be satisfied\n"
          "sbatch: error: Batch job submission failed: Requested node configuration is not available")
PARTITION = ("sbatch: error: invalid partition specified: gpu\n"
             "sbatch: error: Batch job submission failed: Invalid partition name specified")
CPUS = "sbatch: error: Batch job submission failed: More processors requested than permitted"
PARAMS = {"mem_gb": 512, "partition": None, "cpus_per_task": 64, "nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0}
OFFER = "debug* (2 CPUs, 4096 MB per node)"


@pytest.mark.parametrize(("stderr", "params", "named"), [
    (MEMORY, PARAMS, "hydra.launcher.mem_gb=512"),
    (PARTITION, {**PARAMS, "partition": "gpu"}, "hydra.launcher.partition=gpu"),
    (CPUS, PARAMS, "hydra.launcher.cpus_per_task=64"),
])
def test_refusal_is_one_line_naming_the_key_its_value_and_the_offer(stderr, params, named):
    msg = str(slurm_cluster.refusal(stderr, params, OFFER))
    assert "\n" not in msg and named in msg and f"Partitions: {OFFER}." in msg
    assert msg.startswith("SLURM refused the sweep's jobs (sbatch: ")
    key = named.split("=")[0]
    assert f"Change {key}" in msg


def test_refusal_names_only_the_keys_of_its_reason():
    msg = str(slurm_cluster.refusal(MEMORY, PARAMS, OFFER))
    assert "cpus_per_task" not in msg and "partition=" not in msg
    msg = str(slurm_cluster.refusal(PARTITION, PARAMS, OFFER))  # partition null: the cluster's default was refused
    assert "hydra.launcher.partition=null" in msg and "mem_gb" not in msg


def test_unknown_refusal_keeps_sbatch_reason_and_points_at_the_launcher_config():
    msg = str(slurm_cluster.refusal("sbatch: error: Batch job submission failed: Something new", PARAMS, ""))
    assert "(sbatch: Batch job submission failed: Something new). " in msg
    assert "sinfo -o" in msg and "hydra.launcher.* settings of conf/hydra/launcher/slurm.yaml" in msg


class _Executor:
    def __init__(self, exc: BaseException | None = None, noise: str = "") -> None:
        self.exc, self.noise = exc, noise

    def map_array(self, fn, *args):
        print(self.noise, file=sys.stderr, end="")
        if self.exc is not None:
            raise self.exc
        return ["job"]


def _launcher(**params) -> slurm.RacoSlurmLauncher:
    return slurm.RacoSlurmLauncher(submitit_folder="x", **{**PARAMS, **params})


def test_submission_errors_become_config_errors_and_sbatch_noise_is_not_printed(monkeypatch, capsys):
    from submitit.core.utils import FailedJobError

    monkeypatch.setattr(slurm, "partitions_summary", lambda: OFFER)
    with pytest.raises(ConfigError, match=r"hydra.launcher.mem_gb=512\. Partitions: debug\*"):
        _launcher()._submit(_Executor(FailedJobError(MEMORY), noise=MEMORY), [("o", 0)])
    assert capsys.readouterr().err == ""  # submitit printed sbatch's lines; they are in the one line
    with pytest.raises(ConfigError, match=r"^hydra/launcher=slurm needs the SLURM client \(sbatch\) on PATH"):
        _launcher()._submit(_Executor(FileNotFoundError(2, "No such file or directory", "sbatch")), [("o", 0)])
    with pytest.raises(FileNotFoundError):  # another missing file is not sbatch's absence
        _launcher()._submit(_Executor(FileNotFoundError(2, "No such file or directory", "/x/y.pkl")), [("o", 0)])
    # a successful submission keeps what was written to stderr (e.g. submitit's warnings)
    assert _launcher()._submit(_Executor(noise="a warning\n"), [("o", 0)]) == ["job"]
    assert capsys.readouterr().err == "a warning\n"


def test_sweeper_turns_a_launcher_error_into_one_line_and_exit_2(capsys):
    from raco_cli.cli.sweeper import RacoSweeper

    class Refusing:
        def launch(self, batch, initial_job_idx):
            raise ConfigError("SLURM refused the sweep's jobs (sbatch: x): hydra.launcher.mem_gb=512.")

    sweeper = RacoSweeper()
    sweeper.launcher = Refusing()
    with pytest.raises(SystemExit) as exit_info:
        sweeper._launch([["seed=0"]], 0)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: SLURM refused the sweep's jobs (sbatch: x): hydra.launcher.mem_gb=512.\n"


def _fake_commands(tmp_path: Path, monkeypatch, sacct: str, squeue: str) -> Path:
    """``sacct`` and ``squeue`` scripts on PATH; squeue prints ``squeue.out`` and, on stderr,
    ``squeue.err`` (exit code in ``squeue.rc``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text(f"#!/bin/sh\necho sacct >> {tmp_path}/calls\n{sacct}\n")
    (bin_dir / "squeue").write_text(
        f"#!/bin/sh\necho \"squeue $*\" >> {tmp_path}/calls\n{squeue}\ncat {tmp_path}/squeue.out; cat {tmp_path}/squeue.err >&2 2>/dev/null\n"
        f"exit $(cat {tmp_path}/squeue.rc 2>/dev/null || echo 0)\n")
    for script in bin_dir.iterdir():
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "squeue.out"


def _watcher(*job_ids: str):
    watcher = slurm_cluster.fallback_watcher_class()()
    for job_id in job_ids:
        watcher.register_job(job_id)
    return watcher


def test_without_accounting_states_come_from_squeue_with_one_warning(tmp_path, monkeypatch, caplog):
    out = _fake_commands(tmp_path, monkeypatch, "echo 'Slurm accounting storage is disabled' >&2; exit 1", "")
    out.write_text("7_0|RUNNING|None\n7_[1-2%2]|PENDING|Resources\n")
    watcher = _watcher("7_0", "7_1", "7_2")
    with caplog.at_level(logging.WARNING, logger="raco_cli.cli.slurm"):
        for _ in range(3):
            watcher.update()
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["SLURM accounting is unavailable (sacct: Slurm accounting storage is disabled); "
                        "job states come from squeue for the rest of this sweep."]
    assert (tmp_path / "calls").read_text().splitlines() == ["sacct"] + ["squeue -h --states=all -o %i|%T|%r -j 7"] * 3
    assert [watcher.get_state(j, mode="cache") for j in ("7_0", "7_1", "7_2")] == ["RUNNING", "PENDING", "PENDING"]
    assert not any(watcher.is_done(j, mode="cache") for j in ("7_0", "7_1", "7_2"))

    # task 0 cancelled (still listed), task 1 gone from the controller, task 2 running
    out.write_text("7_0|CANCELLED|None\n7_2|RUNNING|None\n")
    watcher.update()
    assert watcher.get_state("7_0", mode="cache") == "CANCELLED" and watcher.is_done("7_0", mode="cache")
    assert watcher.get_state("7_1", mode="cache") == slurm_cluster.GONE and watcher.is_done("7_1", mode="cache")
    assert not watcher.is_done("7_2", mode="cache")

    # squeue failing (controller busy) changes nothing; every job purged ("Invalid job id") = all ended
    out.write_text("")
    (tmp_path / "squeue.err").write_text("slurm_load_jobs error: Unable to contact slurm controller\n")
    (tmp_path / "squeue.rc").write_text("1")
    watcher.update()
    assert not watcher.is_done("7_2", mode="cache")
    (tmp_path / "squeue.err").write_text("slurm_load_jobs error: Invalid job id specified\n")
    watcher.update()
    assert watcher.get_state("7_2", mode="cache") == slurm_cluster.GONE and watcher.is_done("7_2", mode="cache")
    assert len(caplog.records) == 1


def test_with_accounting_states_come_from_sacct_without_warning(tmp_path, monkeypatch, caplog):
    _fake_commands(tmp_path, monkeypatch, "printf 'JobID|State|NodeList\\n7_0|COMPLETED|n1\\n7_1|RUNNING|n1\\n'", "exit 9")
    watcher = _watcher("7_0", "7_1")
    with caplog.at_level(logging.WARNING):
        watcher.update()
    assert not caplog.records
    assert (tmp_path / "calls").read_text().splitlines() == ["sacct"]
    assert watcher.is_done("7_0", mode="cache") and not watcher.is_done("7_1", mode="cache")


def test_a_task_lost_by_the_scheduler_is_a_failed_job_with_one_line(monkeypatch, capsys, tmp_path):
    from hydra.core.utils import JobStatus
    from submitit.core.utils import UncompletedJobError

    watcher = _watcher("7_1")
    watcher._info_dict["7_1"] = {"State": "CANCELLED"}

    class Job:
        job_id = "7_1"

        def __init__(self) -> None:
            self.watcher = watcher
            self.paths = type("P", (), {"stderr": tmp_path / "7_1_0_log.err"})()

        def results(self):
            raise UncompletedJobError("Job 7_1 (task: 0) ... has not produced any output (state: CANCELLED)\n<log>")

    recorded = []
    launcher = _launcher()
    monkeypatch.setattr(launcher, "_record_lost", lambda overrides, idx, error: recorded.append((overrides, idx, str(error))))
    ret = launcher._job_return(Job(), ["seed=1"], 1)
    assert ret.status == JobStatus.FAILED and isinstance(ret._return_value, slurm.LostJobError)
    err = capsys.readouterr().err
    assert err == (f"error: job 1 (seed=1): SLURM task 7_1 ended CANCELLED without a result (cancelled, out of time "
                   f"or memory, or its node failed); its log: {tmp_path / '7_1_0_log.err'}\n")
    assert recorded == [(["seed=1"], 1, err.split(": ", 2)[2].strip())]


def test_a_task_that_raised_outside_raco_is_a_failed_job_naming_the_exception(monkeypatch, capsys, tmp_path):
    from hydra.core.utils import JobStatus
    from submitit.core.utils import FailedJobError

    class Job:
        job_id = "7_0"
        paths = type("P", (), {"stderr": tmp_path / "7_0_0_log.err"})()

        def results(self):
            raise FailedJobError("Job (task=0) failed during processing with trace:\n" + "-" * 22 + "\nTraceback (most "
                                 "recent call last):\n  File \"x.py\"\nModuleNotFoundError: No module named 'raco_cli'\n"
                                 + "-" * 22 + "\nYou can check full logs with 'job.stderr(0)'")

    launcher = _launcher()
    monkeypatch.setattr(launcher, "_record_lost", lambda *a: None)
    assert launcher._job_return(Job(), ["seed=0"], 0).status == JobStatus.FAILED
    assert capsys.readouterr().err == (f"error: job 0 (seed=0): SLURM task 7_0 raised ModuleNotFoundError: No module named "
                                       f"'raco_cli'; its log: {tmp_path / '7_0_0_log.err'}\n")


def _group_job(tmp_path: Path, nums: list[int]) -> list[str]:
    """A group launcher job's overrides, its group file written as the sweeper writes it."""
    from raco_cli.cli.sweep_plan import GROUP_OVERRIDE
    from raco_cli.run.group import write_group

    members = [{"num": n, "run_dir": str(tmp_path / str(n)), "config": {"seed": n}} for n in nums]
    path = write_group(tmp_path / ".groups" / "0.json", members, memory_gb=2)
    return ["seed=0", f"{GROUP_OVERRIDE}{path}", "hydra.sweep.subdir=groups/0"]


def test_a_lost_group_task_marks_every_unfinished_member_failed_and_counts_them(monkeypatch, capsys, tmp_path):
    """A group task (several runs, run/group.py) lost by the scheduler: each of its runs is
    recorded (its own config, run dir, the sweep dir), and the failed count is that of the runs
    that had not finished (here run 1 had), which the sweeper adds up."""
    from hydra.core.utils import JobStatus
    from omegaconf import OmegaConf
    from submitit.core.utils import UncompletedJobError

    from raco_cli.cli.sweeper import failed_runs

    watcher = _watcher("7_0")
    watcher._info_dict["7_0"] = {"State": "TIMEOUT"}

    class Job:
        job_id = "7_0"
        paths = type("P", (), {"stderr": tmp_path / "7_0_0_log.err"})()

        def __init__(self) -> None:
            self.watcher = watcher

        def results(self):
            raise UncompletedJobError("Job 7_0 (task: 0) ... has not produced any output (state: TIMEOUT)")

    seen = []

    def fail_run(cfg, run_dir, sweep_dir, error):
        seen.append((cfg["seed"], run_dir, sweep_dir, type(error).__name__))
        return cfg["seed"] != 1  # run 1 had finished before the task was lost

    monkeypatch.setattr(slurm, "_fail_run", fail_run)
    launcher = _launcher()
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    launcher.hydra_context = object()  # a group's runs are not composed again: their configs are in its file
    overrides = _group_job(tmp_path, [0, 1, 2])
    ret = launcher._job_return(Job(), overrides, 0)
    assert ret.status == JobStatus.FAILED and ret._return_value.failed_runs == 2
    assert seen == [(n, tmp_path / str(n), tmp_path, "LostJobError") for n in (0, 1, 2)]
    assert capsys.readouterr().err.startswith("error: group job 0 (runs 0, 1, 2 of the sweep, trained in one task): SLURM "
                                              "task 7_0 ended TIMEOUT without a result")
    assert failed_runs(ret, overrides) == 2


def test_the_sweeper_counts_the_failed_runs_of_every_kind_of_job(tmp_path):
    from hydra.core.utils import JobReturn, JobStatus

    from raco_cli.cli.sweeper import failed_runs

    group = _group_job(tmp_path, [0, 1, 2])
    done = JobReturn(overrides=["seed=0"], status=JobStatus.COMPLETED, _return_value=0.9)
    assert failed_runs(done, ["seed=0"]) == 0
    assert failed_runs(JobReturn(status=JobStatus.COMPLETED, _return_value=None), ["seed=0"]) == 1
    assert failed_runs(JobReturn(status=JobStatus.COMPLETED, _return_value={"runs": 3, "failed": 2}), group) == 2
    # a job that raised: every run it had (its launcher did not count them)
    assert failed_runs(JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("x")), ["seed=0"]) == 1
    assert failed_runs(JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("x")), group) == 3
    counted = slurm.LostJobError("lost")
    counted.failed_runs = 0  # every run of the group had finished before its task was lost
    assert failed_runs(JobReturn(status=JobStatus.FAILED, _return_value=counted), group) == 0


def test_a_pickled_launcher_unpickles_as_the_base_launcher_in_a_fresh_process(tmp_path):
    """SLURM tasks unpickle the launcher; the raco class's module is an alias only the launching
    process registers, so the pickle must name hydra-submitit's class."""
    import cloudpickle

    slurm.register()
    launcher = _launcher()
    launcher._watcher()  # per-sweep state stays in the launching process
    blob = tmp_path / "launcher.pkl"
    blob.write_bytes(cloudpickle.dumps(launcher))
    code = (f"import pickle; obj = pickle.loads(open({str(blob)!r}, 'rb').read()); "
            "print(type(obj).__module__, type(obj).__name__, obj.params['mem_gb'], '_raco_watcher' in vars(obj))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["hydra_plugins.hydra_submitit_launcher.submitit_launcher", "SlurmLauncher", "512", "False"]
    assert type(pickle.loads(pickle.dumps(launcher))).__name__ == "SlurmLauncher"


def test_the_sweep_parent_belongs_to_the_exported_launching_process(monkeypatch):
    from raco_cli.tracking import mlflow_store

    own = mlflow_store.process_identity()
    monkeypatch.delenv(mlflow_store.SWEEP_PROCESS_ENV, raising=False)
    assert mlflow_store.sweep_process_identity()["raco.pid"] == own["raco.pid"]
    monkeypatch.setenv(mlflow_store.SWEEP_PROCESS_ENV, "otherhost 4242 777")
    ident = mlflow_store.sweep_process_identity()
    assert (ident["raco.host"], ident["raco.pid"], ident["raco.pid_start"]) == ("otherhost", "4242", "777")
    for malformed in ("garbage", "host notapid 7"):  # this process
        monkeypatch.setenv(mlflow_store.SWEEP_PROCESS_ENV, malformed)
        assert mlflow_store.sweep_process_identity()["raco.pid"] == own["raco.pid"]


def test_slurm_launcher_config_names_the_raco_launcher():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from raco_cli.cli.paths import CONF_DIR
    from raco_cli.cli.plugins import register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    assert cfg.hydra.launcher._target_ == f"{slurm.PLUGIN_MODULE}.RacoSlurmLauncher"
    from hydra.core.plugins import Plugins

    assert Plugins.instance().class_name_to_class[cfg.hydra.launcher._target_] is slurm.RacoSlurmLauncher
