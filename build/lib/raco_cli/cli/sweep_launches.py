"""From a sweep's planned jobs to what its launcher runs (the ``raco`` sweeper's planning).

:func:`~raco_cli.cli.sweep_plan.plan_jobs` lists a sweep's jobs (grids, smoke, the command
line); here each job's composed config decides the rest: a duplicate runs once, a job already
FINISHED in its MLflow experiment is skipped (resume by config hash), and compatible jobs become
group jobs (``hydra.sweeper.group``, ``in_one_job``; docs/batched.md).  The Hydra plugin that
composes the configs and launches the result is :mod:`raco_cli.cli.sweeper`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raco_cli.cli.sweep_plan import (
    GROUP_OVERRIDE,
    balance,
    group_key,
    known_steps,
    run_cost,
    split_evenly,
)


@dataclass(frozen=True)
class Job:
    """One planned job with its composed config, its hash and the MLflow store it records to."""

    overrides: list[str]
    grid: str
    config: dict[str, Any]
    config_hash: str
    store: tuple[bool, str | None, str]  # (tracking.enabled, tracking.uri, tracking.experiment)


def unique_jobs(planned: Sequence[tuple[str, list[str]]], job_config: Callable[[list[str]], dict[str, Any]]) -> tuple[list[Job], int]:
    """The ``(grid, overrides)`` jobs with their configs, a job whose config hash a previous job of
    the same store has dropped; and how many were dropped."""
    from raco_cli.run.spec import config_hash

    jobs: list[Job] = []
    seen: set[tuple[str | None, str, str]] = set()
    duplicates = 0
    for grid, overrides in planned:
        cfg = job_config(overrides)
        tr = cfg.get("tracking") or {}
        store = (bool(tr.get("enabled")), tr.get("uri"), str(tr.get("experiment")))
        h = config_hash(cfg)
        if (store[1], store[2], h) in seen:
            duplicates += 1
            continue
        seen.add((store[1], store[2], h))
        jobs.append(Job(overrides, grid, cfg, h, store))
    return jobs, duplicates


def unfinished(jobs: Sequence[Job]) -> tuple[list[Job], int]:
    """The jobs whose config hash has no FINISHED run in their MLflow experiment (the tracked
    ones; untracked jobs always run), and how many were skipped."""
    from raco_cli.tracking.mlflow_store import finished_config_hashes

    finished: dict[tuple[str | None, str], set[str]] = {}
    for _enabled, uri, experiment in {job.store for job in jobs if job.store[0] and job.store[1]}:
        finished[(uri, experiment)] = finished_config_hashes(str(uri), experiment)
    todo = [job for job in jobs if not (job.store[0] and job.config_hash in finished.get((job.store[1], job.store[2]), set()))]
    return todo, len(jobs) - len(todo)


def grids_or_all(value: Any) -> bool | list[str]:
    """A per-grid option's value: true / false (null: false), or the names of the grids it applies to."""
    if isinstance(value, bool) or value is None:
        return bool(value)
    return [value] if isinstance(value, str) else [str(g) for g in value]


def applies(option: bool | list[str], grid: str) -> bool:
    """Whether a per-grid option (:func:`grids_or_all`) applies to a job of ``grid``."""
    return option if isinstance(option, bool) else grid in option


def launcher_jobs(jobs: list[tuple[list[str], dict[str, Any]]], sweep_dir: Path, grids: list[str], *, group: bool | list[str],
                  in_one_job: bool | list[str], group_max_runs: int, group_memory_gb: float,
                  workers: int) -> tuple[list[list[str]], int]:
    """The launcher jobs' overrides and how many are group jobs: compatible jobs (``group``) as
    group jobs (their configs in a group file, composed once), an ``in_one_job`` grid's runs as one
    job, the others as jobs of their own; every run keeps the directory ``<sweep dir>/<job
    number>`` it has without grouping."""
    from raco_cli.run.group import write_group

    groups: OrderedDict[str, list[int]] = OrderedDict()
    alone: OrderedDict[str, list[int]] = OrderedDict()  # grid -> its runs, trained alone in one job
    launches: list[tuple[float, int, list[str]]] = []  # (estimated cost, first job number, overrides)
    unknown = known_steps([cfg for _, cfg in jobs])

    def cost(num: int) -> float:
        return run_cost(jobs[num][1], unknown_steps=unknown)

    for num, (overrides, cfg) in enumerate(jobs):
        if applies(in_one_job, grids[num]):
            alone.setdefault(grids[num], []).append(num)
            continue
        key = group_key(cfg) if applies(group, grids[num]) else None
        if key is None:
            launches.append((cost(num), num, [*overrides, f"hydra.sweep.subdir={num}"]))
        else:
            groups.setdefault(key, []).append(num)
    chunks = [(chunk, cost(chunk[0])) for nums in groups.values() for chunk in split_evenly(nums, group_max_runs)]
    n_groups = 0

    def group_job(nums: list[int], total: float, **flags: bool) -> None:
        """One launcher job for the runs ``nums``: their configs (and ``flags``) in a group file."""
        nonlocal n_groups
        members = [{"num": num, "run_dir": str(sweep_dir / str(num)), "config": jobs[num][1], **flags} for num in nums]
        path = write_group(sweep_dir / ".groups" / f"{n_groups}.json", members, memory_gb=group_memory_gb)
        # the first run's overrides too: the group job gets the Hydra settings (mode, logging) its runs would
        launches.append((total, nums[0], [*jobs[nums[0]][0], f"{GROUP_OVERRIDE}{path.resolve()}", f"hydra.sweep.subdir=groups/{n_groups}"]))
        n_groups += 1

    for nums in alone.values():
        group_job(nums, sum(cost(num) for num in nums), alone=True)
    for chunk in balance(chunks, workers):  # cut so that parallel workers finish together
        total = len(chunk) * cost(chunk[0])
        if len(chunk) == 1:
            launches.append((total, chunk[0], [*jobs[chunk[0]][0], f"hydra.sweep.subdir={chunk[0]}"]))
            continue
        group_job(chunk, total)
    # parallel workers take the costliest jobs first (the tail is then short); one worker
    # (the basic launcher, Table 2's timings) keeps the sweep's order.  Every run keeps its job
    # number, directory and result whatever its launch position or piece.
    launches.sort(key=(lambda item: (-item[0], item[1])) if workers > 1 else (lambda item: item[1]))
    return [o for _, _, o in launches], n_groups
