"""The SLURM launcher (``hydra/launcher=slurm``): hydra-submitit's, with answers a user can act on.

hydra-submitit-launcher submits a sweep as one job array and waits for every task.  Alone, it:

* ends the sweep with submitit's traceback when sbatch refuses the request (memory, partition,
  CPUs, GPUs), instead of naming the ``hydra.launcher.*`` key to change;
* on a cluster without accounting (no slurmdbd, so ``sacct`` fails) logs three copies of
  "Bypassing sacct error" at every status poll, and never learns that a task ended without a
  result (``scancel``, time limit, node failure): the sweep then waits forever;
* raises on such a task, losing the other tasks' outcomes and leaving the sweep's parent run open.

:class:`RacoSlurmLauncher` changes exactly that:

* a refusal is one :class:`~raco_cli.errors.ConfigError` line naming the keys (exit 2);
* job states come from ``sacct``, else (one warning per sweep) from ``squeue``, which knows the
  pending, running and recently ended jobs (:class:`AccountingFallbackWatcher`);
* a task that ended without a result is a failed job: one line on stderr, its MLflow run marked
  FAILED (or a FAILED run created when it never started), counted by the sweeper, so the same
  command run again resumes with only the missing jobs (resume by config hash); a group task
  (several runs, :mod:`raco_cli.cli.group`) fails so each of its runs that had not finished.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

from raco_cli.errors import ConfigError

log = logging.getLogger(__name__)

# sbatch's reason for refusing a job (a fragment of its stderr, matched case-insensitively)
# -> the hydra.launcher keys that decide it; the first match wins
REFUSALS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("memory specification can not be satisfied", ("mem_gb", "mem_per_cpu", "mem_per_gpu")),
    ("invalid partition", ("partition",)),
    ("more processors requested than permitted", ("cpus_per_task", "tasks_per_node", "nodes")),
    ("invalid generic resource", ("gpus_per_node", "gpus_per_task", "gres")),
    ("invalid feature specification", ("constraint",)),
    ("node count specification invalid", ("nodes",)),
    ("time limit", ("timeout_min",)),
    ("invalid qos", ("qos",)),
    ("invalid account", ("account",)),
    ("requested node configuration is not available",
     ("cpus_per_task", "mem_gb", "gpus_per_node", "nodes", "tasks_per_node", "constraint", "exclude")),
)  # fmt: skip
NO_SBATCH = (
    "hydra/launcher=slurm needs the SLURM client (sbatch) on PATH, which this machine does not have. "
    "Run the sweep from a login node of the cluster, or on this machine with hydra/launcher=joblib."
)


def partitions_summary() -> str:
    """The cluster's partitions as ``sinfo`` reports them (``*`` marks the default), e.g.
    ``debug* (2 CPUs, 4096 MB per node)``; empty when ``sinfo`` cannot tell."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P|%c|%m|%G"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if out.returncode:
        return ""
    parts = []
    for line in out.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4:
            continue
        name, cpus, mem, gres = fields
        gpus = "" if gres in ("(null)", "") else f", {gres}"
        parts.append(f"{name} ({cpus} CPUs, {mem} MB per node{gpus})")
    return ", ".join(dict.fromkeys(parts))


def refusal(stderr: str, params: Mapping[str, Any], partitions: str = "") -> ConfigError:
    """One line for sbatch refusing the sweep's job array: its reason, the ``hydra.launcher``
    keys that decide it with their values, what the cluster offers and what to change.

    >>> print(refusal("sbatch: error: invalid partition specified: gpu\\nsbatch: error: Batch job "
    ...               "submission failed: Invalid partition name specified", {"partition": "gpu"}, "debug* (2 CPUs, 4096 MB per node)"))
    SLURM refused the sweep's jobs (sbatch: invalid partition specified: gpu; Batch job submission failed: Invalid partition name specified): hydra.launcher.partition=gpu. Partitions: debug* (2 CPUs, 4096 MB per node). Change hydra.launcher.partition to fit them (null: the cluster's default partition).
    """
    reasons = [line.split("error:", 1)[1].strip() for line in stderr.splitlines() if "error:" in line]
    reason = "; ".join(reasons) or " ".join(stderr.split()) or "no reason given"
    keys = next((k for fragment, k in REFUSALS if fragment in reason.lower()), ())
    shown = [f"hydra.launcher.{k}={_value(params.get(k))}" for k in keys if params.get(k) is not None or k == "partition"]
    where = f"Partitions: {partitions}. " if partitions else "See the partitions with: sinfo -o '%P %c %m %G'. "
    if keys:
        fix = f"Change {' or '.join(f'hydra.launcher.{k}' for k in keys)} to fit them"
        fix += " (null: the cluster's default partition)." if "partition" in keys else " (mem_gb is in GB)." if "mem_gb" in keys else "."
    else:
        fix = "Check the hydra.launcher.* settings of conf/hydra/launcher/slurm.yaml against them."
    return ConfigError(f"SLURM refused the sweep's jobs (sbatch: {reason})" + (f": {', '.join(shown)}. " if shown else ". ")
                       + where + fix)


def _value(value: Any) -> str:
    return "null" if value is None else str(value)


def squeue_states(output: str) -> dict[str, dict[str, str]]:
    """Job states from ``squeue -h -o '%i|%T|%r'`` lines, keyed as submitit keys them
    (``<array job>_<task>``; pending ranges such as ``7_[1-3%2]`` expanded).

    >>> sorted((k, v["State"]) for k, v in squeue_states("7_[1-2%2]|PENDING|None\\n7_0|RUNNING|None\\n").items())
    [('7_0', 'RUNNING'), ('7_1', 'PENDING'), ('7_2', 'PENDING')]
    """
    from submitit.slurm.slurm import SlurmInfoWatcher

    return SlurmInfoWatcher().read_info("JobID|State|Reason\n" + output)


# a job squeue no longer lists has ended (it drops ended jobs after MinJobAge, 300 s by default)
GONE = "ENDED (no longer listed by squeue)"


@functools.cache
def _fallback_watcher_class() -> type:
    """:class:`AccountingFallbackWatcher`, defined on first use (submitit is imported lazily)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class AccountingFallbackWatcher(SlurmInfoWatcher):
        """Job states from ``sacct``, else from ``squeue`` with a single warning.

        submitit's watcher only knows ``sacct``; without accounting it warns at every poll and
        reports every job UNKNOWN (= not done), so a task that ended without a result is waited
        for forever.  ``squeue --states=all`` lists pending, running and recently ended jobs;
        a registered job it no longer lists has ended.
        """

        def __init__(self, delay_s: int = 600) -> None:
            super().__init__(delay_s=delay_s)
            self.sacct = True  # until sacct fails once

        def update(self) -> None:
            command = self._make_command()
            if command is None:
                return
            self._num_calls += 1
            info = self._sacct(command) if self.sacct else None
            if info is None:
                ids = sorted({x.split("_")[0] for x in self._registered - self._finished})
                info = self._squeue(ids)
            if info is not None:
                self._info_dict.update(info)
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

        def _sacct(self, command: list[str]) -> dict[str, dict[str, str]] | None:
            try:
                out = subprocess.run(command, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as exc:
                reason = str(exc)
            else:
                if out.returncode == 0:
                    return self.read_info(out.stdout)
                reason = " ".join(out.stderr.split()) or f"exit code {out.returncode}"
            self.sacct = False
            log.warning("SLURM accounting is unavailable (sacct: %s); job states come from squeue for the rest "
                        "of this sweep.", reason)
            return None

        def _squeue(self, ids: list[str]) -> dict[str, dict[str, str]] | None:
            if not ids:
                return {}
            command = ["squeue", "-h", "--states=all", "-o", "%i|%T|%r", "-j", ",".join(ids)]
            try:
                out = subprocess.run(command, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.debug("squeue failed: %s", exc)
                return None
            if out.returncode and "invalid job id" not in out.stderr.lower():  # controller busy: ask again later
                log.debug("squeue failed: %s", out.stderr.strip())
                return None
            info = squeue_states("" if out.returncode else out.stdout)
            for job_id in self._registered - self._finished:
                info.setdefault(job_id, {"State": GONE})
            return info

    return AccountingFallbackWatcher


def raised(message: str) -> str:
    """The exception line (``Type: message``) of the trace in a submitit FailedJobError.

    >>> raised("Job (task=0) failed during processing with trace:\\n" + "-" * 22 + "\\nTraceback ...\\n"
    ...        "  File x\\nKeyError: 'seed'\\n" + "-" * 22 + "\\nYou can check full logs")
    "KeyError: 'seed'"
    """
    parts = message.split("-" * 22)
    lines = [line.strip() for line in (parts[1] if len(parts) > 2 else message).splitlines() if line.strip()]
    return lines[-1] if lines else "an error"


class LostJobError(RuntimeError):
    """A SLURM task ended without a result (cancelled, out of time or memory, node failure).

    ``failed_runs``: how many of its runs did not finish (a group task has several; the
    sweeper counts them), None until they are recorded."""

    failed_runs: int | None = None


class RacoSlurmLauncher(SlurmLauncher):
    """hydra-submitit's SLURM launcher with one-line refusals, a watcher that works without
    accounting, and tasks lost by the scheduler returned as failed jobs (module docstring)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        import os

        import submitit
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
        from omegaconf import OmegaConf

        from raco_cli.tracking.mlflow_store import SWEEP_PROCESS_ENV, process_identity

        assert self.config is not None and len(job_overrides) > 0
        # executor, parameters and job arguments exactly as hydra-submitit-launcher 1.2 builds them
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=self.params["submitit_folder"],
                                         **{f"{self._EXECUTOR}_max_num_timeout": self.params.get("max_num_timeout", 0)})
        base_keys = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{
            k if k in base_keys else f"{self._EXECUTOR}_{k}": v
            for k, v in self.params.items() if k not in ("submitit_folder", "max_num_timeout")
        })  # fmt: skip
        ident = process_identity()  # exported to the tasks: the sweep parent run belongs to this process
        os.environ[SWEEP_PROCESS_ENV] = " ".join(ident[k] for k in ("raco.host", "raco.pid", "raco.pid_start"))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        numbered = list(enumerate((list(o) for o in job_overrides), start=initial_job_idx))
        for idx, overrides in numbered:
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        jobs = self._submit(executor, [(o, "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()) for idx, o in numbered])
        watcher = self._watcher()
        for job in jobs:  # shadows submitit's class-wide sacct-only watcher
            job.watcher = watcher
        return [self._job_return(job, overrides, idx) for job, (idx, overrides) in zip(jobs, numbered)]

    def _submit(self, executor: Any, job_params: list[tuple[Any, ...]]) -> list[Any]:
        """Submit the job array; sbatch's refusal (printed by submitit, then raised with a
        traceback) becomes one :class:`ConfigError` line."""
        from submitit.core.utils import FailedJobError

        captured = io.StringIO()
        try:
            with contextlib.redirect_stderr(captured):
                jobs = executor.map_array(self, *zip(*job_params))
        except FileNotFoundError as exc:
            if Path(str(exc.filename or "")).name != "sbatch":
                raise
            raise ConfigError(NO_SBATCH) from None
        except FailedJobError as exc:
            raise refusal(str(exc), self.params, partitions_summary()) from None
        sys.stderr.write(captured.getvalue())
        return list(jobs)

    def _watcher(self) -> Any:
        """One watcher per sweep (so one warning per sweep when accounting is unavailable)."""
        watcher = self.__dict__.get("_raco_watcher")
        if watcher is None:
            watcher = self.__dict__["_raco_watcher"] = _fallback_watcher_class()()
        return watcher

    def _job_return(self, job: Any, overrides: list[str], idx: int) -> Any:
        """The task's JobReturn; a task without one (the scheduler ended it, or its process
        raised outside raco's job handler) is a FAILED JobReturn, printed and recorded."""
        from hydra.core.utils import JobReturn, JobStatus
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            return job.results()[0]
        except FailedJobError as exc:  # the task's process raised: its traceback is in the log
            error = LostJobError(f"SLURM task {job.job_id} raised {raised(str(exc))}; its log: {job.paths.stderr}")
        except UncompletedJobError:
            error = LostJobError(
                f"SLURM task {job.job_id} ended {job.watcher.get_state(job.job_id, mode='cache')} without a result "
                f"(cancelled, out of time or memory, or its node failed); its log: {job.paths.stderr}"
            )
        print(f"error: {_describe(overrides, idx)}: {error}", file=sys.stderr)
        try:
            error.failed_runs = self._record_lost(overrides, idx, error)
        except Exception:  # noqa: BLE001 - recording a failure must not fail the sweep
            log.exception("could not record the lost job in MLflow")
        return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=error)

    def _record_lost(self, overrides: list[str], idx: int, error: LostJobError) -> int:
        """Mark the lost task's MLflow runs FAILED (every run of a group task that had not
        finished), or record a FAILED run for one that never started; how many failed."""
        from omegaconf import open_dict

        from raco_cli.cli.group import group_members

        assert self.hydra_context is not None and self.config is not None
        members = group_members(overrides)
        if members is not None:  # a sweep group job (cli/group.py): its runs' configs and dirs are in its file
            sweep_dir = Path(str(self.config.hydra.sweep.dir))
            return sum(_fail_run(m["config"], Path(m["run_dir"]), sweep_dir, error) for m in members)
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = idx
        sweep_dir = Path(str(cfg.hydra.sweep.dir))
        run_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
        with open_dict(cfg):
            del cfg["hydra"]
        return int(_fail_run(cfg, run_dir, sweep_dir, error))

    def __reduce__(self) -> tuple[Any, ...]:
        # A SLURM task unpickles the launcher to run its job with the base class's __call__;
        # this class's module is a Hydra plugin alias that the task's process does not have.
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_raco_")}
        return (_base_launcher, (state,))


def _describe(overrides: list[str], idx: int) -> str:
    """``job 3 (seed=3 ...)``, or for a group job the sweep's runs it had."""
    from raco_cli.cli.group import group_members

    members = group_members(overrides)
    if members is None:
        return f"job {idx} ({' '.join(overrides)})"
    return f"group job {idx} (runs {', '.join(str(m['num']) for m in members)} of the sweep, trained in one task)"


def _fail_run(cfg: Any, run_dir: Path, sweep_dir: Path, error: LostJobError) -> bool:
    """Record one run of a lost task: its MLflow run marked FAILED unless it finished, or a
    FAILED run when it never started; whether the run failed (finished: MLflow FINISHED, or
    its summary.json written when tracking is off)."""
    from raco_cli.cli.build import build_run_spec
    from raco_cli.cli.train import RUN_ID_FILE, record_failure
    from raco_cli.tracking.mlflow_store import fail_run

    run_id_file = run_dir / RUN_ID_FILE
    if not run_id_file.exists():
        record_failure(cfg, run_dir, sweep_dir, error)  # does nothing when tracking is off
        return not (run_dir / "summary.json").exists()
    tracking = build_run_spec(cfg).tracking
    if not (tracking.enabled and tracking.uri is not None):
        return not (run_dir / "summary.json").exists()
    return fail_run(str(tracking.uri), run_id_file.read_text().strip(), f"{type(error).__name__}: {error}") != "FINISHED"


def _base_launcher(state: dict[str, Any]) -> SlurmLauncher:
    launcher = SlurmLauncher.__new__(SlurmLauncher)
    launcher.__dict__.update(state)
    return launcher


# Hydra instantiates only plugins under the ``hydra_plugins`` namespace (see cli/sweeper.py).
PLUGIN_MODULE = "hydra_plugins.raco_slurm_launcher"
RacoSlurmLauncher.__module__ = PLUGIN_MODULE


def register() -> None:
    """Register :class:`RacoSlurmLauncher` with Hydra (conf/hydra/launcher/slurm.yaml names it)."""
    from hydra.core.plugins import Plugins

    sys.modules.setdefault(PLUGIN_MODULE, sys.modules[__name__])
    Plugins.instance().register(RacoSlurmLauncher)
