"""A run's MLflow records: its run (tags, params), failures, and the final metrics.

Every write goes through :mod:`raco_cli.tracking.mlflow_store` (the only module that
imports mlflow); this module decides *what* a run records.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raco_cli.run.spec import build_run_spec, plain_config

log = logging.getLogger(__name__)

RUN_ID_FILE = ".mlflow_run_id"  # written once the job's MLflow run exists
# final/<split>/<name> metrics beyond the constraint ones: robustness (metrics/robust.py), the DRO
# objective and its gradient norm (methods/dro/common.py), membership inference (split "mia")
ROBUST_METRICS = ("worst_group_accuracy", "worst_class_accuracy", "balanced_accuracy", "roc_auc", "f1", "grad_norm",
                  "dro_objective", "auc_loss", "auc_confidence")


def run_name(spec: Any) -> str:
    budget = f"rho{spec.rho:g}" if getattr(spec, "rho", None) is not None else f"eps{spec.eps:g}"
    return spec.tracking.run_name or f"{spec.method.name}-{spec.dataset.display}-{spec.constraint.name}-{budget}-seed{spec.seed}"


def extra_tags(resolved: Mapping[str, Any]) -> dict[str, str]:
    """``tracking.tags`` as MLflow tags (sweeps tag their runs with ``sweep``)."""
    tags = (resolved.get("tracking") or {}).get("tags") or {}
    return {str(k): str(v) for k, v in tags.items() if v is not None}


def run_tags(spec: Any, resolved: Mapping[str, Any], run_dir: Path) -> dict[str, str]:
    """Tags of every job's MLflow run, finished or failed (``raco.config_hash``: sweep resume)."""
    return {
        **extra_tags(resolved),
        "method": spec.method.name,
        "dataset": spec.dataset.display,
        "constraint": spec.constraint.name,
        "raco.config_hash": spec.config_hash,
        "raco.run_dir": str(run_dir),
    }


def open_recorder(prep: Any, run_dir: Path, sweep_dir: Path | None, *, client: Any = None, buffered: bool = False,
                  run_name: str | None = None, search_trial: bool = False) -> Any:
    """The run's MLflow run (None when tracking is off); ``client``/``buffered``: see
    :class:`raco_cli.tracking.mlflow_store.RunRecorder` (a sweep group shares one client and
    logs its evaluations in bulk).  Under full records metrics carry their clock time; a
    private scope=model run's carry none (no per-window timing).  ``run_name``: instead of
    :func:`run_name`; ``search_trial``: the released trial of a private search, whose init seed
    (a secret draw of the search) is not tagged."""
    recorder = _recorder(prep, run_dir, sweep_dir, client=client, buffered=buffered, create=True, name=run_name,
                         search_trial=search_trial)
    if recorder is not None:
        _opened(recorder, run_dir)
    return recorder


def open_recorders(runs: Sequence[tuple[Any, Path]], sweep_dir: Path | None, *, clients: Sequence[Any]) -> list[Any]:
    """:func:`open_recorder` of a group's ``(prep, run_dir)``, buffered, with ``clients[i]`` for
    run i; the MLflow runs are created in one store transaction per shared client."""
    from raco_cli.tracking.mlflow_store import create_runs

    recorders = [_recorder(prep, run_dir, sweep_dir, client=c, buffered=True, create=False) for (prep, run_dir), c in zip(runs, clients)]
    create_runs(recorders)
    for recorder, (_, run_dir) in zip(recorders, runs):
        if recorder is not None:
            _opened(recorder, run_dir)
    return recorders


def _opened(recorder: Any, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_ID_FILE).write_text(recorder.run_id)


def _recorder(prep: Any, run_dir: Path, sweep_dir: Path | None, *, client: Any, buffered: bool, create: bool,
              name: str | None = None, search_trial: bool = False) -> Any:
    spec, seeds = prep.spec, prep.seeds
    if not spec.tracking.enabled:
        return None
    from raco_cli.tracking.mlflow_store import RunRecorder

    tags = {
        **run_tags(spec, prep.resolved, run_dir),
        "raco.secure_rng": str(spec.secure_rng).lower(),
        "raco.privacy.scope": spec.scope,
        "raco.seed.init": "secret (private search trial)" if search_trial else str(seeds.init),
        # secure_rng: batches and noise from os.urandom, no seed to record (secret batches)
        "raco.seed.sampling": "os.urandom" if spec.secure_rng else str(seeds.sampling),
        "raco.seed.noise": "os.urandom" if spec.secure_rng else str(seeds.noise),
    }
    return RunRecorder(
        uri=str(spec.tracking.uri), experiment=spec.tracking.experiment, run_name=name or run_name(spec), params=prep.resolved,
        tags=tags, parent_sweep_dir=sweep_dir, client=client, buffered=buffered, timed=prep.full_records, create=create,
    )


def has_run(run_dir: Path) -> bool:
    """Whether a run got as far as creating its MLflow run (it then marked it FAILED itself)."""
    return (Path(run_dir) / RUN_ID_FILE).exists()


def tag_error(recorder: Any, exc: BaseException) -> None:
    """Tag a failing run with its one-line error (never raises: the original error wins)."""
    if recorder is not None:
        try:
            recorder.set_tags({"raco.error": f"{type(exc).__name__}: {exc}"[:5000]})
        except Exception:  # noqa: BLE001 - keep the original error
            log.exception("could not tag the failed run")


def record_failure(cfg: Mapping[str, Any], run_dir: Path, sweep_dir: Path | None, error: BaseException) -> None:
    """Record a sweep job that failed before its MLflow run existed (e.g. an unreachable budget
    for one grid point) as a FAILED run carrying the one-line error, so the sweep's record is
    complete; the sweep goes on.  Does nothing when tracking is off or the config is unusable."""
    try:
        spec = build_run_spec(cfg)
    except Exception:  # noqa: BLE001 - the config itself is what failed; nothing to attach it to
        return
    if not spec.tracking.enabled or spec.tracking.uri is None:
        return
    from raco_cli.tracking.mlflow_store import RunRecorder

    resolved = plain_config(cfg)
    tags = {**run_tags(spec, resolved, run_dir), "raco.error": f"{type(error).__name__}: {error}"[:5000]}
    recorder = RunRecorder(
        uri=str(spec.tracking.uri), experiment=spec.tracking.experiment, run_name=run_name(spec), params=resolved,
        tags=tags, parent_sweep_dir=sweep_dir, timed=_full_records(spec),
    )
    recorder.finish("FAILED")


def _full_records(spec: Any) -> bool:
    """:attr:`raco_cli.run.prepare.PreparedRun.full_records` of a run that failed before it was
    prepared (a method that cannot be looked up: none, the safe side)."""
    if spec.scope == "paper":
        return True
    try:
        from raco_cli import methods

        return not bool(methods.get(spec.method.name).PRIVATE)
    except Exception:  # noqa: BLE001 - the method itself may be what failed
        return False


def record_failure_quietly(cfg: Mapping[str, Any], run_dir: Path, sweep_dir: Path | None, exc: BaseException) -> None:
    """:func:`record_failure` that never raises (recording a failure must not fail the sweep)."""
    try:
        record_failure(cfg, run_dir, sweep_dir, exc)
    except Exception:  # noqa: BLE001 - recording a failure must not fail the sweep
        log.exception("could not record the failed job in MLflow")


def record_job_failure(cfg: Mapping[str, Any], run_dir: Path, sweep_dir: Path | None, exc: BaseException) -> None:
    """A sweep job's failure recorded FAILED (:func:`record_failure_quietly`), unless its run got
    as far as its MLflow run (which then marked itself FAILED) or the store itself failed."""
    from raco_cli.errors import TrackingError

    if not isinstance(exc, TrackingError) and not has_run(run_dir):
        record_failure_quietly(cfg, run_dir, sweep_dir, exc)


def log_final(recorder: Any, summary: Mapping[str, Any], artifacts: list[Path], *, extra: Mapping[str, float] | None = None) -> None:
    """The released summary as ``final/<split>/<name>`` metrics, privacy metrics, tags and
    artifacts of the run."""
    final = dict(extra or {})
    for split, m in summary["metrics"].items():
        for name in ("accuracy", "loss", "constraint_max_hard", "constraint_max_soft", "violation_hard", "dp_gap", "eo_gap",
                     "eop_gap", "fnr", "fpr", *ROBUST_METRICS):
            v = m.get(name)
            if isinstance(v, (int, float)) and v == v:
                final[f"final/{split}/{name}"] = float(v)
        for family, fm in (m.get("constraints") or {}).items():
            for name in ("max_hard", "max_violation_hard", "max_violation_soft"):
                v = fm.get(name)
                if isinstance(v, (int, float)) and v == v:
                    final[f"final/{split}/gap/{family}/{name}"] = float(v)
        if m.get("satisfied") is not None:
            final[f"final/{split}/satisfied"] = float(bool(m["satisfied"]))
        for group, acc in (m.get("group_accuracy") or {}).items():
            if acc is not None:
                final[f"final/{split}/group_accuracy/{group}"] = float(acc)
        for name in ("mspe", "worst_group_mspe", "mspe_gap"):  # task=regression
            v = m.get(name)
            if isinstance(v, (int, float)) and v == v:
                final[f"final/{split}/{name}"] = float(v)
        for group, err in (m.get("group_mspe") or {}).items():
            if err is not None:
                final[f"final/{split}/group_mspe/{group}"] = float(err)
    if summary["eps_spent"] is not None:
        final["privacy/eps_spent"] = float(summary["eps_spent"])
    if summary.get("rho_spent") is not None:
        final["privacy/rho_spent"] = float(summary["rho_spent"])
    final["privacy/steps"] = float(summary["steps"])
    final["selected_step"] = float(summary["selected_step"])
    stats = summary.get("stats") or {}
    if "time_per_step_ms" in stats:  # absent in scope=model (step times follow private batch sizes)
        final["time_per_step_ms"] = float(stats["time_per_step_ms"])
    if isinstance(stats.get("batched"), dict):  # trained in a group of this many runs (time_per_step_ms is its share)
        final["batched_runs"] = float(stats["batched"]["runs"])
    if "throughput_images_per_s" in stats:  # training examples per second of step time
        final["throughput_images_per_s"] = float(stats["throughput_images_per_s"])
    recorder.log_metrics(final, step=int(summary["steps"]))
    recorder.set_tags({"satisfied": str(summary["satisfied"]).lower(), "private": str(summary["private"]).lower()})
    for path in artifacts:
        recorder.log_artifact(path)
