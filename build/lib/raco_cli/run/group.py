"""A sweep group: several runs of a sweep trained in one process (docs/batched.md).

The ``raco`` sweeper (:mod:`raco_cli.cli.sweeper`) writes the composed configs of a group of
compatible jobs to ``<sweep dir>/.groups/<k>.json`` (:func:`write_group`) and launches one
job for the group; that job lands here (:func:`run_group_file`).  Each run is prepared as alone (its own plan, seeds and DP preprocessing
release); runs whose prepared specs can share the batched engine
(:mod:`raco_cli.methods.batched`) are trained together, in chunks that fit
``hydra.sweeper.group_memory_gb``; any other run is trained alone.  Every run keeps its run
directory (``<sweep dir>/<job number>``), summary.json, MLflow run and config hash, exactly
as a job of its own would write them; a run that fails to prepare is recorded FAILED and the
others go on.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from raco_cli.errors import RacoError
from raco_cli.run.finish import finish_run
from raco_cli.run.prepare import Unplanned, prepare_until_plan
from raco_cli.run.progress import FanOut, Progress, untimed_logs
from raco_cli.run.records import (
    open_recorders,
    record_failure_quietly,
    record_job_failure,
    tag_error,
)
from raco_cli.run.train import (
    check_writable,
    draw_curves,
    model_scope,
    set_threads,
    train,
    warn_secure_rng,
)

log = logging.getLogger(__name__)

DEFAULT_MEMORY_GB = 2.0
#: runs whose T differ train as one group to the largest T (methods with ``MIXED_STEPS``) when
#: the largest is within this factor of the smallest: a scope=model sweep's seeds plan T from
#: their own released n~ (413-423 on Adult), and one group of them beats seven; far apart T
#: (a grid over method.steps) would train the short runs' extra steps for nothing
MIXED_STEPS_SPREAD = 1.1
#: called with (summary, run_dir) after each run of a group finishes (``raco train`` prints
#: its result table; ``raco tune``'s trials pass None)
OnResult = Callable[[Mapping[str, Any], Path], None] | None


def write_group(path: Path, members: Sequence[Mapping[str, Any]], *, memory_gb: float) -> Path:
    """Write a group file: ``members`` are ``{"num", "run_dir", "config"}`` (resolved configs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"memory_gb": memory_gb, "members": list(members)}))
    return path


def read_group(path: Path) -> list[dict[str, Any]]:
    """The members of a group file (:func:`write_group`)."""
    return list(json.loads(Path(path).read_text())["members"])


def run_group_file(path: Path, *, sweep_dir: Path | None, on_result: OnResult = None) -> dict[str, int]:
    """Train the runs of a group file; ``{"runs": n, "failed": k}``."""
    spec = json.loads(Path(path).read_text())
    summaries = train_group(spec["members"], sweep_dir=sweep_dir, memory_gb=float(spec.get("memory_gb", DEFAULT_MEMORY_GB)),
                            on_result=on_result)
    return {"runs": len(summaries), "failed": sum(1 for s in summaries if s is None)}


def batch_key(prep: Any) -> tuple | None:
    """What runs must share to be trained as one problem (None: this run trains alone)."""
    from raco_cli.methods import batched

    if not hasattr(prep.method, "fit_many") or not batched.supports(prep.data, prep.model):
        return None
    spec = prep.plan.spec
    if spec.objective.is_dro:  # the batched engine trains the mean loss (sgda objective=dro runs alone)
        return None
    shared = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name not in batched.PER_RUN_FIELDS}
    cons = prep.constraints
    steps = None if getattr(prep.method, "MIXED_STEPS", False) else prep.plan.steps  # (see similar_steps)
    return (
        prep.method.NAME, id(prep.data), steps, prep.constrained, repr(sorted(shared.items())), spec.clip_norm is None,
        cons.membership.tobytes(), cons.alpha.tobytes(), cons.cell_of.tobytes(), cons.J,
        0 if prep.scaling is None else len(prep.scaling[0]), str(prep.device), prep.spec.threads,
    )


def similar_steps(runs: Sequence[tuple[int, Any]]) -> list[list[tuple[int, Any]]]:
    """``(index, prep)`` of one batch key split into runs of nearly the same T (the largest at
    most :data:`MIXED_STEPS_SPREAD` times the smallest), by increasing T: a group trains to its
    largest T."""
    out: list[list[tuple[int, Any]]] = []
    for run in sorted(runs, key=lambda r: r[1].plan.steps):
        if not out or run[1].plan.steps > MIXED_STEPS_SPREAD * out[-1][0][1].plan.steps:
            out.append([])
        out[-1].append(run)
    return out


def runs_per_chunk(prep: Any, memory_gb: float) -> int:
    """How many runs of this kind fit the memory budget: a step gathers each run's batch rows
    (two Poisson samples with independent sampling), an evaluation holds a few (n, K) float64
    arrays per run and split."""
    data = prep.data
    n_train = len(data.splits["train"])
    d = int(data.X.shape[1]) if hasattr(data.X, "shape") else 1
    rows = 2 * (prep.plan.sample_rate * n_train + 6 * (prep.plan.sample_rate * n_train) ** 0.5 + 16)
    width = d + data.n_classes + 1 + prep.constraints.Q
    per_run = rows * width * 4 * 4 + max(len(v) for v in data.splits.values()) * data.n_classes * 8 * 12
    return max(1, int(memory_gb * 2**30 // per_run))


def train_group(members: Sequence[Mapping[str, Any]], *, sweep_dir: Path | None, memory_gb: float,
                on_result: OnResult = None) -> list[dict[str, Any] | None]:
    """Prepare every run, train compatible runs together, finish each; a summary per run
    (None for a run that failed, which is recorded FAILED in MLflow).  ``on_result``: called
    with each finished run's summary and directory."""
    with untimed_logs(any(model_scope(m["config"]) for m in members)):
        return _train_group(members, sweep_dir=sweep_dir, memory_gb=memory_gb, on_result=on_result)


def _train_group(members: Sequence[Mapping[str, Any]], *, sweep_dir: Path | None, memory_gb: float,
                 on_result: OnResult) -> list[dict[str, Any] | None]:
    # (torch and dp_accounting: imported where runs train)
    from raco_cli.methods.planning import plan_ahead

    t0 = time.time()
    out: list[dict[str, Any] | None] = [None] * len(members)
    batches: OrderedDict[tuple, list[tuple[int, Any]]] = OrderedDict()
    unplanned: dict[int, Unplanned] = {}
    for i, m in enumerate(members):  # every run up to its plan, then the plans in parallel (planning.plan_ahead)
        if m.get("alone"):  # the sweep asked for the one-run path (hydra.sweeper.in_one_job)
            continue
        prepared = _prepare(m, sweep_dir, functools.partial(prepare_until_plan, m["config"], shared_features=True))
        if prepared is not None:
            unplanned[i] = prepared
    ahead = plan_ahead([u.request() for u in unplanned.values()])
    if ahead:
        log.info("%d plans computed ahead in parallel", ahead)
    for i, m in enumerate(members):
        if m.get("alone"):
            out[i] = _alone(m, sweep_dir, on_result)
            continue
        if i not in unplanned:  # (failed and recorded)
            continue
        prep = _prepare(m, sweep_dir, unplanned[i].planned)
        if prep is None:
            continue
        key = batch_key(prep)
        if key is None:  # e.g. an MLP or images: the one-run path (features standardised as alone)
            out[i] = _alone(m, sweep_dir, on_result)
            continue
        batches.setdefault(key, []).append((i, prep))
    for runs in (similar for key_runs in batches.values() for similar in similar_steps(key_runs)):
        size = runs_per_chunk(runs[0][1], memory_gb)
        for start in range(0, len(runs), size):
            chunk = runs[start : start + size]
            if len(chunk) == 1:
                i, _ = chunk[0]
                out[i] = _alone(members[i], sweep_dir, on_result)
                continue
            for (i, _), summary in zip(chunk, _train_together([(members[i], prep) for i, prep in chunk], sweep_dir, on_result)):
                out[i] = summary
    failed = sum(s is None for s in out)
    if any(model_scope(m["config"]) for m in members):  # the log file: no process timing (docs/privacy.md "Timing")
        log.info("group of %d runs done (%d failed)", len(members), failed)
    else:
        log.info("group of %d runs done in %.1f s (%d failed)", len(members), time.time() - t0, failed)
    return out


def _prepare(member: Mapping[str, Any], sweep_dir: Path | None, step: Callable[[], Any]) -> Any:
    """A step of a run's preparation; None when it fails (the run is recorded FAILED, the group goes on)."""
    try:
        return step()
    except RacoError as exc:
        print(f"error: job {member['num']}: {exc}", file=sys.stderr)
        record_failure_quietly(member["config"], Path(member["run_dir"]), sweep_dir, exc)
    except Exception as exc:  # noqa: BLE001 - a bug: recorded with its traceback in the log, the group goes on
        log.exception("job %s failed", member["num"])
        print(f"error: job {member['num']} failed: {type(exc).__name__}: {exc} (traceback in the group's log)", file=sys.stderr)
        record_failure_quietly(member["config"], Path(member["run_dir"]), sweep_dir, exc)
    return None


def _alone(member: Mapping[str, Any], sweep_dir: Path | None, on_result: OnResult) -> dict[str, Any] | None:
    """A run of the group trained by the one-run path (prepared again: its features are
    standardised as a run alone standardises them)."""
    run_dir = Path(member["run_dir"])
    try:
        summary = train(member["config"], run_dir=run_dir, sweep_dir=sweep_dir)
    except RacoError as exc:
        print(f"error: job {member['num']}: {exc}", file=sys.stderr)
        record_job_failure(member["config"], run_dir, sweep_dir, exc)  # as a job of its own records it
        return None
    except Exception as exc:  # noqa: BLE001 - a bug: logged with its traceback, the group goes on
        log.exception("job %s failed", member["num"])
        print(f"error: job {member['num']} failed: {type(exc).__name__}: {exc} (traceback in the group's log)", file=sys.stderr)
        record_job_failure(member["config"], run_dir, sweep_dir, exc)
        return None
    if on_result is not None:
        on_result(summary, run_dir)
    return summary


def _train_together(runs: Sequence[tuple[Mapping[str, Any], Any]], sweep_dir: Path | None,
                    on_result: OnResult) -> list[dict[str, Any] | None]:
    """One chunk of compatible runs through the method's ``fit_many``."""
    from raco_cli.methods.batched import Member
    from raco_cli.tracking.mlflow_store import finish_recorders, flush_recorders

    t0 = time.time()
    first = runs[0][1]
    R = len(runs)
    set_threads(first.spec.threads)
    warn_secure_rng(bool(first.method.PRIVATE), first.spec.secure_rng)
    recorders: list[Any] = []
    out: list[dict[str, Any] | None] = [None] * R
    shared_client = None
    status = "FAILED"
    try:
        clients = []
        for member, prep in runs:
            check_writable(Path(member["run_dir"]))
            if prep.spec.tracking.enabled and shared_client is None:
                from raco_cli.tracking.mlflow_store import client

                shared_client = client(str(prep.spec.tracking.uri))
            same_store = shared_client is not None and str(prep.spec.tracking.uri) == str(first.spec.tracking.uri)
            clients.append(shared_client if same_store else None)
        # every run created, then its params written, in one store transaction each, before training
        recorders = open_recorders([(prep, Path(member["run_dir"])) for member, prep in runs], sweep_dir, clients=clients)
        flush_recorders(recorders)
        members = [
            Member(model=prep.model, constraints=prep.constraints, spec=prep.plan.spec, seeds=prep.seeds,
                   reporter=FanOut(rec), scaling=prep.scaling)
            for (_, prep), rec in zip(runs, recorders)
        ]
        steps = [prep.plan.steps for _, prep in runs]  # one T (batch_key), or nearly one (similar_steps)
        progress = Progress(max(steps), desc=f"{first.spec.method.name}/{first.spec.dataset.display} x{R}", show_values=False)
        try:
            results = first.method.fit_many(first.data, members, steps=steps if getattr(first.method, "MIXED_STEPS", False) else steps[0],
                                            device=first.device, reporter=progress)
        finally:
            progress.close()
        trained = time.time() - t0
        if all(prep.full_records for _, prep in runs):  # the log file: no process timing under scope=model
            log.info("%d runs trained together (T %d-%d) in %.1f s", R, min(steps), max(steps), trained)
        else:
            log.info("%d runs trained together (T %d-%d)", R, min(steps), max(steps))
        for r, ((member, prep), result, rec) in enumerate(zip(runs, results, recorders)):
            try:
                out[r] = finish_run(prep, result, Path(member["run_dir"]), rec, started=time.time() - trained / R,
                                    curves=draw_curves(prep.spec, sweep_dir), stats={"group_wall_time_s": trained})
            except RacoError as exc:
                print(f"error: job {member['num']}: {exc}", file=sys.stderr)
                tag_error(rec, exc)
        # every run's metrics and final tags in a few store transactions, then the runs end in one
        done = [r for r in range(R) if out[r] is not None]
        flush_recorders(recorders)
        finish_recorders([recorders[r] for r in done], "FINISHED")
        for r in done:
            recorders[r] = None
            summary = out[r]
            if on_result is not None and summary is not None:
                on_result(summary, Path(runs[r][0]["run_dir"]))
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: every run of the chunk is FAILED, the sweep goes on
        log.exception("group of %d runs failed", R)
        print(f"error: a group of {R} runs failed: {type(exc).__name__}: {exc} (traceback in the group's log)", file=sys.stderr)
        for rec in recorders:
            tag_error(rec, exc)
    finally:
        finish_recorders(recorders, "KILLED" if status == "KILLED" else "FAILED")
    return out
