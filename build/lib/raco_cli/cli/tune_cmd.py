"""``raco tune``: hyperparameter search, private by default.

    raco tune [--config-dir DIR] dataset=adult constraint=dp eps=1 constraint.gamma=0.05
              [tune.repetitions=poisson] [tune.mean=10] [tune.shape=1]
              [tune.candidates=8] [tune.score_noise=30] [tune.sampler_seed=0] [tune.study=NAME]
              [tune.out=outputs/tune | hydra.run.dir=DIR]

**privacy.scope=model** (the default): a private random search (Papernot & Steinke 2022,
:mod:`raco_cli.run.private_search`).  A random number of trials K (``tune.repetitions``:
``poisson`` with ``tune.mean`` (the default), ``truncated_negative_binomial`` with ``tune.mean``
and ``tune.shape`` (1 = geometric, 0 = logarithmic), or ``fixed`` ``tune.mean`` trials, the naive
baseline accounted by plain composition), each a private run of a candidate drawn from ``tune.candidates`` settings
of the search space and scored by a noisy validation count (``tune.score_noise`` rows); only
the best trial is released, with one eps for the whole search (``eps`` is the total, the
per-trial eps is planned inside it), to MLflow and to the search's own directory: the first free
``<tune.out>/<study>-<k>`` (k = 1, 2, ...; the study is named after the dataset, a table's own
name included) or ``hydra.run.dir`` (which must not hold a search already), with ``best/`` (the
run) and ``best.yaml``; a second search never replaces a first.  Its result table is
``raco train``'s: the released model's constraint rows on the test split (holds/VIOLATED).

**privacy.scope=paper**: the paper's two-phase protocol (App. E.2), with Optuna, outside eps

    raco tune privacy.scope=paper dataset=adult constraint=dp eps=1 constraint.gamma=0.05 [tune.trials=200]
              [tune.trial_seeds=5] [tune.seeds=20] [tune.storage=sqlite:///outputs/optuna.db]
              [tune.study=NAME] [tune.retrain=true] [tune.timeout=null] [tune.sampler_seed=0]

Phase 1: an Optuna TPE search over the paper's ranges (below), each trial training
``trial_seeds`` models (no MLflow; together, as a sweep group: one batched problem for the
methods that have one) and scoring the mean validation accuracy of their reported checkpoints;
a trial is *feasible* when every seed's checkpoint satisfies the hard train constraint (the TPE
sampler is told so through ``constraints_func``).  The study lives in a
SQLite file, so an interrupted search resumes: trials left RUNNING or interrupted are failed
and their parameters queued again.  Phase 2: the best feasible trial (highest validation
accuracy) is retrained over ``tune.seeds`` new seeds (1000, 1001, ...) as a ``raco train``
multirun into the MLflow experiment ``tune-<study>`` (finished seeds are skipped on re-runs),
and ``outputs/tune/<study>/best.yaml`` is written as an experiment config recording where it
came from.  Tuning and selection on validation data are not privacy-accounted (as in the paper).
An adaptive sampler (TPE) reads earlier trials' scores, which the private search's theorem does
not cover: it stays in this protocol.

Search space, and why its learning rates leave the paper's range: :mod:`raco_cli.cli.tune_space`.
"""

from __future__ import annotations

import datetime as _dt
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raco_cli.cli.tune_space import (
    SPACE,
    default_study,
    space_of,
    trial_overrides,
)
from raco_cli.errors import ConfigError, RacoError

RETRAIN_SEED0 = 1000  # retrained models use new seeds (paper: "train 20 new models")
TUNE_KEYS = {
    "trials": 200, "trial_seeds": 5, "seeds": 20, "storage": "sqlite:///outputs/optuna.db",
    "study": None, "retrain": True, "timeout": None, "sampler_seed": 0, "out": "outputs/tune",
}  # fmt: skip
PRIVATE_KEYS = {
    "repetitions": "poisson", "mean": 10, "shape": 1.0, "candidates": 8, "score_noise": 30.0,
    "study": None, "sampler_seed": 0, "out": "outputs/tune",
}  # fmt: skip
PROTOCOL_LINE = "Papernot & Steinke 2022"


def scope_of(overrides: Sequence[str]) -> str:
    """The privacy scope the overrides ask for (``model`` unless ``privacy.scope=paper``)."""
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "privacy.scope":
            return value
    return "model"


def parse_args(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Split ``tune.*`` options from the training overrides; the options of the overrides' scope."""
    import yaml

    from raco_cli.cli.validate import config_dirs

    overrides = [a for a in argv if not a.startswith("tune.")]
    config_dirs(overrides)  # --config-dir <dir> (a user's own dataset or constraint options): one line when wrong
    for i, arg in enumerate(overrides):
        takes_dir = arg in ("--config-dir", "-cd") or arg.startswith(("--config-dir=", "-cd="))
        if arg.startswith("-") and not takes_dir and not (i > 0 and overrides[i - 1] in ("--config-dir", "-cd")):
            raise ConfigError(f"Unknown option {arg}. raco tune takes --config-dir <dir> and key=value overrides "
                              "(raco tune --help).")
    scope = scope_of(overrides)
    keys = TUNE_KEYS if scope == "paper" else PRIVATE_KEYS
    opts = dict(keys)
    for arg in argv:
        if not arg.startswith("tune."):
            continue
        key, _, value = arg[len("tune.") :].partition("=")
        if key not in TUNE_KEYS and key not in PRIVATE_KEYS:
            raise ConfigError(f"Unknown key tune.{key}. Allowed: {', '.join(f'tune.{k}' for k in {**TUNE_KEYS, **PRIVATE_KEYS})}.")
        if key not in keys:
            why = ("the private search draws its number of trials from tune.repetitions, trains one seed per trial, writes "
                   "no study and releases its best trial instead of retraining") if scope != "paper" else \
                  "it belongs to the private search (privacy.scope=model)"
            other = "privacy.scope=paper (the paper's protocol, outside eps)" if scope != "paper" else "privacy.scope=model"
            raise ConfigError(f"tune.{key} is not an option of privacy.scope={scope} tuning: {why}. "
                              f"Allowed: {', '.join(f'tune.{k}' for k in keys)}; tune.{key} needs {other}.")
        opts[key] = yaml.safe_load(value) if value != "" else None
    if scope == "paper":
        if not any(o.lstrip("+").startswith("privacy.scope=") for o in overrides):
            overrides.insert(0, "privacy.scope=paper")
        for key in ("trials", "trial_seeds", "seeds"):
            v = opts[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "seeds" else 1):
                raise ConfigError(f"tune.{key} must be a positive integer (got tune.{key}={v!r}).")
        return opts, overrides
    from raco_cli.privacy.tuning import KINDS

    if opts["repetitions"] not in KINDS:
        raise ConfigError(f"tune.repetitions must be one of {', '.join(KINDS)} (got tune.repetitions={opts['repetitions']!r}).")
    checks = {
        "mean": (lambda v: v >= 1 and (opts["repetitions"] != "fixed" or float(v).is_integer()),
                 "a number >= 1 (an integer for fixed repetitions)"),
        "shape": (lambda v: v >= 0, "a number >= 0 (1: geometric, 0: logarithmic)"),
        "candidates": (lambda v: float(v).is_integer() and v >= 1, "a positive integer"),
        "score_noise": (lambda v: v > 0, "a positive number of rows"),
        "sampler_seed": (lambda v: float(v).is_integer() and v >= 0, "a non-negative integer"),
    }
    for key, (ok, allowed) in checks.items():
        v = opts[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
            raise ConfigError(f"tune.{key} must be {allowed} (got tune.{key}={v!r}).")
    return opts, overrides


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

    from raco_cli.cli.validate import compose_config, compose_job
    from raco_cli.run.group import DEFAULT_MEMORY_GB, train_group
    from raco_cli.run.spec import build_run_spec

    base = compose_config([*overrides, "tracking=none"])  # bad overrides: one line, before any trial
    spec = build_run_spec(base)  # validates the overrides once (one-line errors)
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
        members = [{"num": s, "run_dir": str(out_dir / f"trial_{trial.number}" / f"seed_{s}"), "config": _with_seed(cfg, s)}
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


def nested_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """Overrides as nested YAML mappings (a dotted YAML key is one key, not a path).

    >>> nested_overrides(["method.options.lam=4.0", "method.lr=0.5"])
    {'method': {'options': {'lam': 4.0}, 'lr': 0.5}}
    """
    import yaml

    nested: dict[str, Any] = {}
    for o in overrides:
        key, _, value = o.partition("=")
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return nested


def write_best(trial: Any, *, study_name: str, storage: str, overrides: Sequence[str], n_trials: int, out: Path) -> Path:
    """``best.yaml``: the best configuration as an experiment config with its provenance."""
    out.mkdir(parents=True, exist_ok=True)
    ovr = trial.user_attrs.get("overrides", [])
    date = _dt.date.today().isoformat()
    lines = [
        "# @package _global_",
        f"# Tuned by `raco tune` on {date}: study '{study_name}' ({storage}),",
        f"# best feasible of {n_trials} trials = trial #{trial.number}: validation accuracy {trial.value:.4f}",
        f"# (mean over {len(trial.user_attrs.get('val_accuracy_per_seed', []))} seeds), max train violation "
        f"{trial.user_attrs.get('violation', float('nan')):+.4f}.",
        f"# Search overrides: {' '.join(overrides)}",
        "# Use: copy to conf/experiment/<name>.yaml and run `raco train experiment=<name>`.",
    ]
    import yaml

    text = "\n".join(lines) + "\n" + yaml.safe_dump(nested_overrides(ovr), sort_keys=True)
    path = out / "best.yaml"
    path.write_text(text)
    return path


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


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    opts, overrides = parse_args(argv)
    if scope_of(overrides) != "paper":
        return private_main(opts, overrides)
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
    from raco_cli.cli.figures_cmd import default_uri
    from raco_cli.figures.report import report
    from raco_cli.tracking.mlflow_store import run_records

    uri = next((o.split("=", 1)[1] for o in overrides if o.startswith("tracking.uri=")), None) or default_uri()
    records = [r for r in run_records(uri, experiment) if r["tags"].get("tune_trial") == str(best.number)]
    print(report(records, experiment=experiment, uri=uri, all_points=True))
    return 0


def private_main(opts: Mapping[str, Any], overrides: list[str]) -> int:
    """The private search (privacy.scope=model): plan, trials, the best trial written as a run."""
    from raco_cli.cli.result_table import print_result
    from raco_cli.cli.tune_dirs import check_free, claim, run_dir_override
    from raco_cli.privacy.tuning import Repetitions
    from raco_cli.run.private_search import PrivateSearch, SearchOptions

    fixed_dir = run_dir_override(overrides)
    if fixed_dir is not None:  # before the planning: a taken directory is a one-line error, not a lost search
        check_free(fixed_dir)
    reps = Repetitions(str(opts["repetitions"]), float(opts["mean"]), float(opts["shape"]))  # type: ignore[arg-type]
    search_opts = SearchOptions(repetitions=reps, candidates=int(opts["candidates"]), score_noise=float(opts["score_noise"]),
                                sampler_seed=int(opts["sampler_seed"]), study=opts["study"])
    print(f"private search ({reps.describe()}) over {search_opts.candidates} candidates: planning the per-trial budget ...")
    search = PrivateSearch(search_opts, overrides)
    study_name = search.study
    print(f"eps {search.spec.eps:g} covers the search: per-trial eps {search.eps_trial:.4g}, search eps {search.eps_spent:.4f} "
          f"(delta {search.spec.delta:.3g}); {len(search.usable)} of {search_opts.candidates} candidates fit the trial budget")
    print("running the trials (their number and scores stay secret: only the best trial is released) ...")
    best = search.run()
    if best is None:
        raise RacoError("The private search drew no trial (K = 0 under tune.repetitions=poisson); the release is empty. "
                        "Run it again or use tune.repetitions=truncated_negative_binomial (K >= 1).")
    if not best.feasible:  # released as raco train releases a run its histograms call unsatisfied: the test line says more
        print(f"warning: no trial of the private search met constraint.gamma={search.spec.constraint.gamma:g} on its noisy "
              "training histograms; released the one closest to it (search.noisy_feasible: false). A larger eps, a looser "
              "constraint.gamma or more data would help.")
    search_dir = claim(Path(str(opts["out"])), study_name, fixed_dir)  # its own directory: never another search's
    run_dir = search_dir / "best"
    summary = search.write(best, run_dir)
    path = write_best_private(best, search, study_name=study_name, out=search_dir)
    print_result(summary, run_dir)  # raco train's table: the released model's test fairness rows, eps, where it is
    print(f"  best trial settings  {' '.join(best.overrides) or 'the configuration as given'} (as an experiment config: {path})")
    return 0


def write_best_private(best: Any, search: Any, *, study_name: str, out: Path) -> Path:
    """``best.yaml`` of a private search: the chosen settings as an experiment config whose
    ``method.tuned_on`` records the protocol and the eps of the search."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    rec = search.record(best)
    nested = nested_overrides(best.overrides)
    nested.setdefault("method", {})["tuned_on"] = {
        "dataset": rec["tuned_on"]["dataset"], "split": rec["tuned_on"]["split"], "protocol": "private",
        "search_eps": round(float(search.eps_spent), 6), "repetitions": search.opts.repetitions.describe(),
    }
    lines = [
        "# @package _global_",
        f"# Tuned by `raco tune` (privacy.scope=model) on {_dt.date.today().isoformat()}: a private search, {PROTOCOL_LINE},",
        f"# eps {float(search.spec.eps):g} (spent {float(search.eps_spent):.4f}) covers it; per-trial eps {float(search.eps_trial):.4g}.",
        f"# Search overrides: {' '.join(search.overrides)}",
        "# Running these settings again on the same data spends a new eps (it composes with the search's).",
    ]
    path = out / "best.yaml"
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(nested, sort_keys=True))
    return path

