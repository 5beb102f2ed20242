"""``raco tune privacy.scope=paper``: the paper's two-phase protocol (App. E.2), outside eps.

Phase 1 (:func:`run_search`): an Optuna TPE search over :mod:`raco_cli.run.tune_space`, each
trial's seeds trained together as one sweep group; phase 2 (:func:`retrain`): the best feasible
trial retrained over new seeds as a ``raco train`` multirun, then reported.  The options and
the protocol are described in ``raco tune --help`` (:mod:`raco_cli.cli.tune_cmd`).
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raco_cli.errors import RacoError
from raco_cli.run.tune_space import (
    SPACE,
    default_study,
    space_of,
    trial_overrides,
)

RETRAIN_SEED0 = 1000  # retrained models use new seeds (paper: "train 20 new models")


def _requeue_interrupted(study: Any) -> int:
    """Fail trials left RUNNING by a killed search and queue interrupted parameters again."""
    from optuna.trial import TrialState

    done = set(study.user_attrs.get("requeued", []))
    storage = study._storage
    count = 0
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.RUNNING:
            storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        interrupted = t.state in (TrialState.RUNNING, TrialState.FAIL) and "error" not in t.user_attrs
        if interrupted and t.number not in done and t.params:
            study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number})
            done.add(t.number)
            count += 1
    if count:
        study.set_user_attr("requeued", sorted(done))
    return count


def best_feasible(trials: Sequence[Any]) -> Any | None:
    """The COMPLETE trial with the highest value among those whose violation <= 0."""
    from optuna.trial import TrialState

    ok = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("violation", math.inf) <= 0]
    return max(ok, key=lambda t: (t.value, -t.number)) if ok else None


def _with_seed(cfg: Any, seed: int) -> Any:
    """A copy of a composed job config with another ``seed`` (what ``seed=<s>`` composes to)."""
    out = cfg.copy()
    out.seed = seed
    return out


def open_study(name: str, storage: str) -> Any:
    """The Optuna study ``name`` in ``storage``, created on first use.  Two searches started at
    once into one new SQLite file race to create its schema (Optuna's alembic version row), so
    creation happens under a file lock beside the database."""
    from contextlib import nullcontext

    import optuna

    from raco_cli.tracking.mlflow_store import file_lock

    db = Path(storage[len("sqlite:///") :]) if storage.startswith("sqlite:///") else None
    with nullcontext() if db is None else file_lock(db.with_name(db.name + ".lock")):  # file_lock creates the folder
        return optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)


def run_search(opts: Mapping[str, Any], overrides: list[str], *, log=print) -> tuple[Any, str]:
    """Phase 1.  Returns (study, study name)."""
    import optuna

    from raco_cli.cli.job_config import plain_job
    from raco_cli.cli.validate import compose_config, compose_job
    from raco_cli.run.group import DEFAULT_MEMORY_GB, train_group
    from raco_cli.run.spec import build_run_spec

    base = compose_config([*overrides, "tracking=none"])  # bad overrides: one line, before any trial
    spec = build_run_spec(plain_job(base))  # validates the overrides once (one-line errors)
    method = spec.method.name
    names = space_of(method, str(base.objective.name))
    # named after the dataset as its runs are (a table's own name, not "table"): two tables, two studies
    study_name = str(opts["study"] or default_study(spec.method.name, spec.dataset.display, spec.constraint.name, spec.eps,
                                                    spec.constraint.gamma))
    storage = str(opts["storage"])
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our own lines report trials; no tracebacks on Ctrl-C

    # Optuna >= 5 reads feasibility from Trial.set_constraint; older releases need constraints_func.
    native_constraints = hasattr(optuna.trial.Trial, "set_constraint")

    def constraints(trial: Any) -> list[float]:
        return [float(trial.user_attrs.get("violation", 1.0))]

    def set_violation(trial: Any, violation: float) -> None:
        trial.set_user_attr("violation", violation)
        if native_constraints:
            trial.set_constraint("violation", violation)

    study = open_study(study_name, storage)
    # A resumed search must not redraw the random start-up points of the first session, so the
    # sampler's seed moves on with the number of trials already in the study.
    seed = int(opts["sampler_seed"]) + len(study.get_trials(deepcopy=False))
    kw: dict[str, Any] = {} if native_constraints else {"constraints_func": constraints}
    study.sampler = optuna.samplers.TPESampler(seed=seed, **kw)
    study.set_user_attr("overrides", overrides)
    requeued = _requeue_interrupted(study)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    remaining = int(opts["trials"]) - len(complete)
    log(f"study {study_name} ({storage}): {len(complete)} trials done, {max(remaining, 0)} to run"
        + (f", {requeued} interrupted trial(s) queued again" if requeued else ""))
    out_dir = Path(str(opts["out"])) / study_name

    def objective(trial: Any) -> float:
        values = {}
        for name in names:
            p = SPACE[name]
            if p.integer:
                values[name] = trial.suggest_int(name, int(p.low), int(p.high))
            else:
                values[name] = trial.suggest_float(name, p.low, p.high, log=p.log)
        ovr = trial_overrides(values, method)
        accs, viols = [], []
        # the trial's seeds as one sweep group (one batched problem when the method has one), composed
        # once; no MLflow and no curves.png: a trial's models are scored, not kept
        cfg = compose_job([*overrides, *ovr, "tracking=none", "tracking.curves=false"])
        members = [{"num": s, "run_dir": str(out_dir / f"trial_{trial.number}" / f"seed_{s}"), "config": plain_job(_with_seed(cfg, s))}
                   for s in range(int(opts["trial_seeds"]))]
        summaries = train_group(members, sweep_dir=None, memory_gb=DEFAULT_MEMORY_GB)
        if any(s is None for s in summaries):  # e.g. a batch size whose budget allows no step: infeasible
            trial.set_user_attr("error", "a seed failed (its error is printed above)")
            set_violation(trial, 1.0)
            log(f"trial {trial.number}: a seed failed; infeasible")
            return 0.0
        for summary in summaries:
            assert summary is not None
            accs.append(float(summary["metrics"]["val"]["accuracy"]))
            train = summary["metrics"]["train"]  # feasibility is the training split's (the top-level satisfied is the test's)
            v = train.get("violation_hard")
            viols.append(float(v) if v is not None and math.isfinite(v) else (0.0 if train.get("satisfied") else 1.0))
        value = sum(accs) / len(accs)
        violation = max(viols)
        set_violation(trial, violation)
        trial.set_user_attr("overrides", ovr)
        trial.set_user_attr("val_accuracy_per_seed", accs)
        best = best_feasible(study.get_trials(deepcopy=False))
        so_far = [v for v in (best.value if best is not None else None, value if violation <= 0 else None) if v is not None]
        log(f"trial {trial.number}: val acc {value:.4f}, train violation {violation:+.4f} "
            f"({'feasible' if violation <= 0 else 'infeasible'}); best feasible so far "
            + (f"{max(so_far):.4f}" if so_far else "none"))
        return value

    if remaining > 0:
        study.optimize(objective, n_trials=remaining, timeout=opts["timeout"], gc_after_trial=True)
    return study, study_name


def retrain(trial: Any, *, study_name: str, overrides: Sequence[str], seeds: int, cwd: Path | None = None) -> tuple[int, str]:
    """Phase 2: ``raco train --multirun`` of the best trial over new seeds (resumable)."""
    experiment = f"tune-{study_name}"
    args = [
        sys.executable, "-m", "raco_cli", "train", "--multirun", *overrides, *trial.user_attrs.get("overrides", []),
        f"seed=range({RETRAIN_SEED0},{RETRAIN_SEED0 + seeds})", f"tracking.experiment={experiment}",
        f"++tracking.tags.tune_study={study_name}", f"++tracking.tags.tune_trial={trial.number}",
        "hydra/launcher=local",
    ]
    res = subprocess.run(args, cwd=cwd)
    return res.returncode, experiment


def paper_main(opts: Mapping[str, Any], overrides: list[str]) -> int:
    """The paper's protocol: phase 1, ``best.yaml``, phase 2 and its report."""
    from raco_cli.cli.tune_best import write_best

    study, study_name = run_search(opts, overrides)
    best = best_feasible(study.get_trials(deepcopy=False))
    if best is None:
        raise RacoError(
            f"No trial of study '{study_name}' satisfied the train constraint. Add trials (tune.trials=...) "
            "or relax constraint.gamma."
        )
    n_complete = sum(1 for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE")
    path = write_best(best, study_name=study_name, storage=str(opts["storage"]), overrides=overrides,
                      n_trials=n_complete, out=Path(str(opts["out"])) / study_name)
    print(f"best feasible trial #{best.number}: val accuracy {best.value:.4f}; {' '.join(best.user_attrs.get('overrides', []))}")
    print(f"best configuration: {path}")
    if not opts["retrain"] or int(opts["seeds"]) == 0:
        return 0
    code, experiment = retrain(best, study_name=study_name, overrides=overrides, seeds=int(opts["seeds"]))
    if code != 0:
        return code
    from raco_cli.cli.tracking_uri import default_uri
    from raco_cli.figures.report import report
    from raco_cli.tracking.mlflow_store import run_records

    uri = next((o.split("=", 1)[1] for o in overrides if o.startswith("tracking.uri=")), None) or default_uri()
    records = [r for r in run_records(uri, experiment) if r["tags"].get("tune_trial") == str(best.number)]
    print(report(records, experiment=experiment, uri=uri, all_points=True))
    return 0
