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
  (several runs, :mod:`raco_cli.run.group`) fails so each of its runs that had not finished.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

from raco_cli.cli.slurm_cluster import (
    NO_SBATCH,
    fallback_watcher_class,
    partitions_summary,
    raised,
    refusal,
)
from raco_cli.errors import ConfigError

log = logging.getLogger(__name__)

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
            watcher = self.__dict__["_raco_watcher"] = fallback_watcher_class()()
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

        from raco_cli.cli.job_config import plain_job
        from raco_cli.cli.sweep_plan import group_members

        assert self.hydra_context is not None and self.config is not None
        members = group_members(overrides)
        if members is not None:  # a sweep group job (run/group.py): its runs' configs and dirs are in its file
            sweep_dir = Path(str(self.config.hydra.sweep.dir))
            return sum(_fail_run(m["config"], Path(m["run_dir"]), sweep_dir, error) for m in members)
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = idx
        sweep_dir = Path(str(cfg.hydra.sweep.dir))
        run_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
        with open_dict(cfg):
            del cfg["hydra"]
        return int(_fail_run(plain_job(cfg), run_dir, sweep_dir, error))

    def __reduce__(self) -> tuple[Any, ...]:
        # A SLURM task unpickles the launcher to run its job with the base class's __call__;
        # this class's module is a Hydra plugin alias that the task's process does not have.
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_raco_")}
        return (_base_launcher, (state,))


def _describe(overrides: list[str], idx: int) -> str:
    """``job 3 (seed=3 ...)``, or for a group job the sweep's runs it had."""
    from raco_cli.cli.sweep_plan import group_members

    members = group_members(overrides)
    if members is None:
        return f"job {idx} ({' '.join(overrides)})"
    return f"group job {idx} (runs {', '.join(str(m['num']) for m in members)} of the sweep, trained in one task)"


def _fail_run(cfg: Any, run_dir: Path, sweep_dir: Path, error: LostJobError) -> bool:
    """Record one run of a lost task: its MLflow run marked FAILED unless it finished, or a
    FAILED run when it never started; whether the run failed (finished: MLflow FINISHED, or
    its summary.json written when tracking is off)."""
    from raco_cli.run.records import RUN_ID_FILE, record_failure
    from raco_cli.run.spec import build_run_spec
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
