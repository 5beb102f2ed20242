"""The ``raco`` Hydra sweeper: unions of grids, smoke mode, and resume by config hash.

Hydra's basic sweeper runs one cartesian product.  A paper figure needs several (RaCO-DP
over eps x gamma x seeds, DP-FERMI over eps x lambda x seeds, the non-private reference
over gamma x seeds), so a sweep file lists named ``grids`` and this sweeper launches their
union.  Command-line sweeps (``seed=0,1``) replace the grid axis of the same key, exactly as
the basic sweeper lets the command line win over ``hydra.sweeper.params``.

Before launching, every job's config is composed (as the basic sweeper does to validate it)
and hashed with :func:`raco_cli.run.spec.config_hash` - the hash ``raco train`` tags its
MLflow run with.  Jobs whose hash already has a FINISHED run in their MLflow experiment are
skipped, so an interrupted sweep resumes where it stopped (``hydra.sweeper.resume=false``
re-runs everything).  Duplicate jobs inside one sweep run once.  Those decisions, and the
grouping of jobs into launcher jobs, are :mod:`raco_cli.cli.sweep_launches`; this module is the
Hydra plugin around them.

Options (``hydra.sweeper.<key>``):

* ``grids``: ``{name: {override key: value or sweep}}``; empty = ``params`` + command line.
* ``only``: the grid(s) to run, ``hydra.sweeper.only=raco_dp`` or ``=[raco_dp,sgda]``
  (default: all).
* ``smoke``: run the tiny version: ``smoke_params`` replace the axes a grid has (e.g.
  ``seed: range(0,2)``), ``smoke_overrides`` are added to every job, and the runs go to the
  experiment ``<experiment>_smoke``.
* ``resume``: skip jobs already FINISHED in MLflow (default true).
* ``group``: train compatible jobs together (default true; a list names the grids whose
  jobs are grouped; docs/batched.md).  Jobs whose
  configs differ only in what :data:`~raco_cli.cli.sweep_plan.PER_RUN_KEYS` lists (seed, eps, gamma, noise
  multipliers, learning rates, tau, clip norm, DP-FERMI's options, ...) and that use a
  batched method on logistic regression become one launcher job of at most
  ``group_max_runs`` runs (default 160), so joblib and SLURM parallelism apply to groups;
  inside it runs are trained in chunks that fit ``group_memory_gb`` (default 2).  With joblib's
  parallel workers, the launcher jobs go costliest first and a group is halved when that lets
  the workers finish together (:func:`~raco_cli.cli.sweep_plan.balance`).  Each run
  keeps its run directory ``<sweep dir>/<job number>``, summary.json, MLflow run and config
  hash; the group's Hydra log is in ``<sweep dir>/groups/<k>``.
* ``in_one_job``: ``true`` (every grid) or a list of grids: each such grid's runs are trained
  one after another in one launcher job, each by the one-run path exactly as a job of its own
  trains it (no batching), e.g. Table 2's one-run times.  Hydra composes and sets up each
  launcher job anew (~0.3 s): for Table 2's 40 short runs that was a fifth of the sweep (51.8
  -> 38-45 s).  Run directories, summaries and MLflow runs are those of jobs of their own;
  the launcher job's Hydra log is in ``<sweep dir>/groups/<k>``.  Default false.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf, open_dict

from raco_cli.cli.compose_cache import ComposeCache
from raco_cli.cli.sweep_launches import grids_or_all, launcher_jobs, unfinished, unique_jobs
from raco_cli.cli.sweep_plan import SMOKE_SUFFIX, group_members, plan_jobs

log = logging.getLogger(__name__)

# Outcome of the last sweep in this process, read by ``raco train`` for its exit code.
LAST_SWEEP: dict[str, int] = {}


@dataclass
class RacoSweeperConf:
    _target_: str = "hydra_plugins.raco_sweeper.RacoSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None
    grids: dict[str, Any] | None = None
    only: Any = None  # a grid name or a list of names: hydra.sweeper.only=[raco_dp,sgda]
    smoke: bool = False
    smoke_params: dict[str, Any] | None = None
    smoke_overrides: dict[str, Any] | None = None
    resume: bool = True
    group: Any = True  # true | false | a list of the grids whose jobs are grouped
    group_max_runs: int = 160
    group_memory_gb: float = 2.0
    in_one_job: Any = False  # true | false | a list of the grids whose runs are trained one by one, alone, in one launcher job


def failed_runs(result: Any, overrides: Sequence[str]) -> int:
    """How many runs of a launcher job failed.  A job of one run that failed returns None (raco
    train recorded it FAILED and went on); a group job returns ``{"runs", "failed"}``; a job
    that returned nothing (its process raised, or the scheduler ended it) failed every run it
    had, unless its launcher counted them (``failed_runs`` of the error: cli/slurm.py marks a
    lost group's runs and counts those that had not finished)."""
    from hydra.core.utils import JobStatus

    if result.status != JobStatus.COMPLETED:  # (result.return_value would re-raise the job's error)
        counted = getattr(result._return_value, "failed_runs", None)
        if counted is not None:
            return int(counted)
        members = group_members(overrides)
        return 1 if members is None else len(members)
    value = result.return_value
    if isinstance(value, dict) and "failed" in value:
        return int(value["failed"])
    return 1 if value is None else 0


class RacoSweeper(Sweeper):
    """Basic sweeper + grids + smoke + resume (see the module docstring).

    (Not a subclass of Hydra's BasicSweeper: Hydra re-imports its core plugin modules while
    scanning for plugins, which would leave a subclass pointing at a stale base class.)
    """

    def __init__(
        self,
        max_batch_size: int | None = None,
        params: Mapping[str, str] | None = None,
        grids: Mapping[str, Any] | None = None,
        only: Any = None,
        smoke: bool = False,
        smoke_params: Mapping[str, Any] | None = None,
        smoke_overrides: Mapping[str, Any] | None = None,
        resume: bool = True,
        group: Any = True,
        group_max_runs: int = 160,
        group_memory_gb: float = 2.0,
        in_one_job: Any = False,
    ) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.hydra_context: Any = None
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.grids = {k: dict(v) for k, v in (grids or {}).items()}
        names = [only] if isinstance(only, str) else list(only or [])
        self.only = [str(g).strip() for g in names if str(g).strip()] or None
        self.smoke = bool(smoke)
        self.smoke_params = dict(smoke_params or {})
        self.smoke_overrides = dict(smoke_overrides or {})
        self.resume = bool(resume)
        # true/false, or the grids to group (e.g. Table 2 times grouped and single runs side by side)
        self.group = grids_or_all(group)
        self.group_max_runs = int(group_max_runs)
        self.group_memory_gb = float(group_memory_gb)
        self.in_one_job = grids_or_all(in_one_job)  # the grids whose runs are trained alone in one launcher job
        self._composed: ComposeCache | None = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _job_config(self, overrides: list[str]) -> dict[str, Any]:
        """The job config Hydra would compose for ``overrides``: each distinct set of group
        overrides composed once (:mod:`raco_cli.cli.compose_cache`; tests check the result
        equals a full composition)."""
        assert self.hydra_context is not None and self.config is not None
        if self._composed is None:
            loader, master = self.hydra_context.config_loader, self.config

            def compose_structural(structural: list[str]) -> DictConfig:
                base = loader.load_sweep_config(master_config=master, sweep_overrides=structural)
                with open_dict(base):
                    del base["hydra"]
                return base

            self._composed = ComposeCache(loader.repository, compose_structural)
        return OmegaConf.to_container(self._composed(overrides), resolve=True)  # type: ignore[return-value]

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        extra: list[str] = []
        if self.smoke:
            experiment = str(OmegaConf.select(self.config, "tracking.experiment") or "raco")
            if not experiment.endswith(SMOKE_SUFFIX):
                extra.append(f"tracking.experiment={experiment}{SMOKE_SUFFIX}")
        jobs = plan_jobs(
            self.grids, self.params, [*arguments, *extra], only=self.only, smoke=self.smoke,
            smoke_params=self.smoke_params, smoke_overrides=self.smoke_overrides,
        )
        tic = time.perf_counter()
        keyed, duplicates = unique_jobs(jobs, self._job_config)
        skipped = 0
        if self.resume:
            keyed, skipped = unfinished(keyed)
        msg = (
            f"sweep: {len(jobs)} jobs"
            + (f", {duplicates} duplicate(s) merged" if duplicates else "")
            + (f", {skipped} already FINISHED in MLflow skipped (hydra.sweeper.resume=false re-runs them)" if skipped else "")
            + f", {len(keyed)} to run"
            + (" [smoke]" if self.smoke else "")
            + f" (planned in {time.perf_counter() - tic:.1f} s)"
        )
        log.info(msg)

        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        jobs_to_run = [job.overrides for job in keyed]
        launches = self._launches([(job.overrides, job.config) for job in keyed], sweep_dir, [job.grid for job in keyed])
        size = self.max_batch_size if self.max_batch_size and self.max_batch_size > 0 else max(len(launches), 1)

        returns = []
        initial_job_idx, failed = 0, 0
        for start in range(0, len(launches), size):
            batch = launches[start : start + size]
            results = self._launch(batch, initial_job_idx)
            for r, overrides in zip(results, batch):
                failed += failed_runs(r, overrides)
            initial_job_idx += len(batch)
            returns.append(results)
        LAST_SWEEP.update(jobs=len(jobs_to_run), failed=failed, skipped=skipped)
        return returns

    def _launch(self, batch: list[list[str]], initial_job_idx: int) -> Any:
        """Launch a batch of jobs.  A launcher's user error (e.g. SLURM refusing the requested
        memory, cli/slurm.py) ends the command as any raco error does: its one line on stderr,
        exit code 2, not Hydra's report of an exception."""
        from raco_cli.errors import RacoError

        try:
            return self.launcher.launch(batch, initial_job_idx=initial_job_idx)
        except RacoError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    def _launches(self, jobs: list[tuple[list[str], dict[str, Any]]], sweep_dir: Path, grids: list[str]) -> list[list[str]]:
        """The launcher jobs of ``jobs`` (:func:`~raco_cli.cli.sweep_launches.launcher_jobs`) under
        this sweeper's options, for the launcher's parallel workers."""
        assert self.config is not None
        subdir = OmegaConf.to_container(self.config.hydra.sweep, resolve=False).get("subdir")  # type: ignore[union-attr]
        if not (self.group or self.in_one_job) or subdir != "${hydra.job.num}":
            if self.group or self.in_one_job:
                log.info("sweep: jobs are not grouped (hydra.sweep.subdir is customised; grouping keeps run dirs <sweep dir>/<num>)")
            return [o for o, _ in jobs]
        workers = self._workers()
        launches, n_groups = launcher_jobs(jobs, sweep_dir, grids, group=self.group, in_one_job=self.in_one_job,
                                           group_max_runs=self.group_max_runs, group_memory_gb=self.group_memory_gb,
                                           workers=workers)
        if n_groups:
            log.info("sweep: %d runs as %d launcher jobs (%d groups, costliest first for %d parallel workers; "
                     "hydra.sweeper.group=false runs one job per run)", len(jobs), len(launches), n_groups, workers)
        return launches

    def _workers(self) -> int:
        """How many jobs the launcher runs at once: joblib's ``n_jobs`` (-1: every core); 1 for
        any other launcher (the basic launcher runs one at a time; SLURM's array tasks are
        not scheduled by launch order, and their groups stay as large as allowed)."""
        assert self.config is not None
        launcher = OmegaConf.select(self.config, "hydra.launcher", default=None)
        if launcher is None or not str(launcher.get("_target_", "")).endswith("JoblibLauncher"):
            return 1
        n = int(OmegaConf.select(self.config, "hydra.launcher.n_jobs", default=1) or 1)
        if n < 0:  # joblib: -1 = every core, -2 = all but one, ...
            from raco_cli.cores import cpu_count

            n = max(1, cpu_count() + 1 + n)
        return n


# Hydra instantiates only plugins whose class lives under the ``hydra_plugins`` namespace.
# Rather than shipping a second top-level package, this module is registered by hand under
# that name (see :func:`register`): the sweeper runs in the launching process only.
PLUGIN_MODULE = "hydra_plugins.raco_sweeper"
RacoSweeper.__module__ = PLUGIN_MODULE


def register() -> None:
    """Register the sweeper with Hydra's plugin registry and its config (``hydra/sweeper=raco``)."""
    import sys

    from hydra.core.plugins import Plugins

    sys.modules.setdefault(PLUGIN_MODULE, sys.modules[__name__])
    Plugins.instance().register(RacoSweeper)
    ConfigStore.instance().store(group="hydra/sweeper", name="raco", node=RacoSweeperConf, provider="raco")


def sweep_config(cfg: DictConfig) -> Mapping[str, Any]:
    """The sweeper node of a composed config (empty when it is not the raco sweeper)."""
    node = OmegaConf.select(cfg, "hydra.sweeper")
    if node is None:
        return {}
    return OmegaConf.to_container(node, resolve=False)  # type: ignore[return-value]
