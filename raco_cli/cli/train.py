"""``raco train``: the Hydra application and the run pipeline.

Pipeline of one run (STYLE 1.4): config -> typed :class:`RunSpec` -> data -> constraints ->
model -> privacy plan -> (only now) MLflow run -> method.fit -> re-account -> summary.json,
curves, MLflow records.  Everything that can reject a run happens before the MLflow store
is touched, so bad input never leaves a half-written record.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from raco_cli.cli.build import RunSpec, build_run_spec
from raco_cli.cli.paths import CONF_DIR, register_resolvers
from raco_cli.errors import RacoError, TrackingError

log = logging.getLogger(__name__)
RUN_ID_FILE = ".mlflow_run_id"  # written once the job's MLflow run exists
# final/<split>/<name> metrics beyond the constraint ones: robustness (metrics/robust.py), the DRO
# objective and its gradient norm (methods/dro_common.py), membership inference (split "mia")
ROBUST_METRICS = ("worst_group_accuracy", "worst_class_accuracy", "balanced_accuracy", "roc_auc", "f1", "grad_norm",
                  "dro_objective", "auc_loss", "auc_confidence")


class _Progress:
    """tqdm progress bar on stderr (disabled when stderr is not a terminal).

    ``show_values``: the per-step values a method reports (e.g. the Poisson batch size, an
    exact statistic of the sample) are shown only when the run writes full records.
    """

    def __init__(self, total: int, desc: str, *, show_values: bool = True) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="step", leave=False, disable=None, file=sys.stderr)
        self.show_values = show_values

    def on_step(self, step: int, total: int, values: Mapping[str, float]) -> None:
        self.bar.update(1)
        if self.show_values and step % 20 == 0:
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in values.items()}, refresh=False)

    def on_eval(self, record: Any) -> None:
        lam_max = max(record.lam) if record.lam else 0.0
        if "mspe" in record.metrics["test"]:  # task=regression: test MSPE (val in full records)
            shown_val = f" val_mspe={record.metrics['val']['mspe']:.4f}" if "val" in record.metrics else ""
            self.bar.set_postfix({"test_mspe": f"{record.metrics['test']['mspe']:.4f}"}, refresh=False)
            log.info("step %d test_mspe=%.4f%s", record.step, record.metrics["test"]["mspe"], shown_val)
            return
        if "val" not in record.metrics:  # scope=model: held-out test metrics and releases only
            noisy = record.metrics.get("release", {}).get("noisy_violation")
            shown = "n/a" if noisy is None else f"{noisy:.4f}"
            self.bar.set_postfix({"test_acc": f"{record.metrics['test']['accuracy']:.4f}", "noisy_viol": shown}, refresh=False)
            log.info("step %d test_acc=%.4f noisy_violation=%s lam_max=%.3f", record.step, record.metrics["test"]["accuracy"], shown, lam_max)
            return
        val = record.metrics["val"]
        self.bar.set_postfix({"val_acc": f"{val['accuracy']:.4f}", "viol": f"{record.metrics['train']['violation_hard']:.3f}"}, refresh=False)
        log.info(
            "step %d val_acc=%.4f train_violation=%.4f lam_max=%.3f",
            record.step, val["accuracy"], record.metrics["train"]["violation_hard"], lam_max,
        )

    def close(self) -> None:
        self.bar.close()


class _FanOut:
    def __init__(self, *reporters: Any) -> None:
        self.reporters = [r for r in reporters if r is not None]

    def on_step(self, step: int, total: int, values: Mapping[str, float]) -> None:
        for r in self.reporters:
            r.on_step(step, total, values)

    def on_eval(self, record: Any) -> None:
        for r in self.reporters:
            r.on_eval(record)


_DATA_CACHE: dict[str, Any] = {}
_DATA_CACHE_SIZE = 2


def load_data(spec: RunSpec):
    """Load (and subset) the run's dataset.

    Parallel sweep workers run many jobs in one process, so the last two datasets loaded are
    kept in memory (TabularData is immutable): a sweep parses each file once per worker.
    """
    import json

    ds = spec.dataset
    key = json.dumps([ds.name, str(ds.data_dir), ds.mirror, ds.split_seed, ds.subset, dict(ds.options), ds.preprocessing,
                      dict(ds.bounds), dict(ds.imbalance)], sort_keys=True, default=str)
    if key in _DATA_CACHE:
        return _DATA_CACHE[key]
    loaded = _load_data(spec)
    while len(_DATA_CACHE) >= _DATA_CACHE_SIZE:
        _DATA_CACHE.pop(next(iter(_DATA_CACHE)))
    _DATA_CACHE[key] = loaded
    return loaded


def _load_data(spec: RunSpec):
    from raco_cli import data

    ds = spec.dataset
    loaded = data.load(
        ds.name,
        data_dir=ds.data_dir,
        mirror=ds.mirror,
        allow_download=ds.download,
        split_seed=ds.split_seed,
        options=ds.options,
        # dp: the loader encodes by the public bounds; prepare_run standardises privately
        preprocessing="public" if ds.preprocessing == "dp" else ds.preprocessing,
        bounds=ds.bounds,
    )
    if ds.imbalance:  # dataset.imbalance: the label- or group-imbalanced variant
        from raco_cli.data.imbalance import imbalanced

        loaded = imbalanced(loaded, ds.imbalance, seed=ds.split_seed)
    if ds.subset is not None:
        loaded = loaded.subset(ds.subset, seed=ds.split_seed)
    return loaded


@dataclass
class PreparedRun:
    """Everything a run needs, built and validated before any MLflow write."""

    spec: RunSpec
    resolved: dict[str, Any]
    method: Any
    data: Any
    constraints: Any
    constrained: bool
    model: Any
    plan: Any
    device: Any
    seeds: Any
    preprocessing: str = "empirical"  # how the run's features are scaled (summary.json)
    scaling: Any = None  # shared_features with dp preprocessing: the run's (mean, std), X left public


def prepare_run(cfg: DictConfig | Mapping[str, Any], *, shared_features: bool = False) -> PreparedRun:
    """Config -> spec -> data -> constraints -> model -> privacy plan (STYLE 1.4).

    Shared by ``raco train`` and ``raco audit``; everything here can reject a run, and
    nothing here touches the MLflow store.

    ``shared_features`` (runs of a sweep group): with ``dataset.preprocessing=dp`` the run's
    DP standardisation is released and kept as ``scaling`` = (mean, std), and ``data`` stays
    the public encoding every run of the group shares (the batched engine applies each run's
    scaling to the rows it reads, docs/batched.md).

    Raises:
        RacoError: bad config, missing or corrupted data, an unreachable budget.
    """
    from raco_cli import constraints as constraints_mod
    from raco_cli import methods, models
    from raco_cli.methods.base import Seeds
    from raco_cli.methods.planning import plan
    from raco_cli.methods.training import resolve_device
    from raco_cli.privacy.mechanisms import noise_source
    from raco_cli.privacy.preprocessing import dp_scaling, dp_standardize, numeric_features

    spec = build_run_spec(cfg)
    resolved = _plain(cfg)
    method = methods.get(spec.method.name)
    log.info("Loading dataset <%s> (dataset.name)", spec.dataset.name)
    data = load_data(spec)
    seeds = Seeds.from_seed(spec.seed)
    method_spec = spec.method
    scaling = None
    if spec.dataset.preprocessing == "dp" and numeric_features(data):
        # one accounted Gaussian release (raco_cli/privacy/preprocessing.py), in the plan below
        sigma = spec.dataset.dp_noise_multiplier
        source = noise_source(seeds.preprocessing, "cpu", secure=spec.secure_rng)
        if shared_features:
            scaling = dp_scaling(data, noise_multiplier=sigma, source=source)
        else:
            data = dp_standardize(data, noise_multiplier=sigma, source=source)
        method_spec = replace(method_spec, preprocessing_noise=sigma)
    if spec.scope == "paper" or not method.PRIVATE:  # exact training statistics: paper scope only
        log.info("Group sizes (train): %s", data.group_sizes("train"))
    if "schema" in data.meta:  # dataset=table: what its missing / clipping / unknown-level rules did
        from raco_cli.data.table import report_lines

        for line in report_lines(data, exact=spec.scope == "paper" or not method.PRIVATE):
            log.info(line)
    check_task(spec, method, data)
    cons = constraints_mod.build_parts(
        spec.constraint.parts, n_classes=data.n_classes, n_groups=data.n_groups,
        class_names=data.class_names, group_names=data.group_names, keys=spec.constraint.keys,
    )
    log.info("Constraints <%s> (constraint.name): J=%d over a global partition of Q=%d cells", spec.constraint.name, cons.J, cons.Q)
    constrained = not cons.is_empty
    validate = getattr(method, "validate", None)
    if validate is not None:  # e.g. a constraint the method does not model: before any MLflow write
        validate(spec.method, cons, data)
    model = models.build(spec.model["name"], input_shape=data.input_shape, n_classes=data.n_classes, options=dict(spec.model))
    n_train = len(data.splits["train"])
    if spec.delta_exponent is not None:  # privacy.delta_exponent: delta = n^-e (n is public, as in q = B / n)
        spec = replace(spec, delta=float(n_train) ** -spec.delta_exponent)
        log.info("delta = n_train^-%g = %.3g (privacy.delta_exponent)", spec.delta_exponent, spec.delta)
    pplan = plan(
        method, method_spec, n_train=n_train, eps=spec.eps, delta=spec.delta, constrained=constrained, discretization=spec.discretization
    )
    log.info("Privacy plan: steps=%d sample_rate=%.4g eps_planned=%.4g", pplan.steps, pplan.sample_rate, pplan.eps_planned)
    return PreparedRun(
        spec=spec, resolved=resolved, method=method, data=data, constraints=cons, constrained=constrained,
        model=model, plan=pplan, device=resolve_device(spec.device), seeds=seeds,
        preprocessing="dp" if scaling is not None else getattr(data, "preprocessing", "empirical"), scaling=scaling,
    )


REGRESSION_METHODS = "dpse, dp_sgd or sgd"


def check_task(spec: RunSpec, method: Any, data: Any) -> None:
    """``task`` against the dataset, the method and the constraint (one line each).

    Raises:
        ConfigError: ``task`` contradicts the dataset, or a private regression run asks for the
            accuracy-based private checkpoint choice.
        UnsupportedError: the method or the constraint needs class labels.
    """
    from raco_cli.errors import ConfigError, UnsupportedError

    if spec.task not in ("auto", data.task):
        label = "a real-valued label" if data.task == "regression" else "class labels"
        need = "a real-valued label (dataset=group_mixture)" if spec.task == "regression" else "class labels"
        raise ConfigError(f"task={spec.task} needs a dataset with {need}; dataset={spec.dataset.name} has {label} "
                          f"(task={data.task}). Use task=auto.")
    if data.task not in getattr(method, "TASKS", ("classification",)):
        raise UnsupportedError(f"method={spec.method.name} does not support task={data.task} (it needs class labels: a "
                               f"cross-entropy loss and class rates); use method={REGRESSION_METHODS}.")
    if data.task != "regression":
        return
    if spec.constraint.name != "none":
        raise UnsupportedError(f"constraint={spec.constraint.name} needs class rates (P(prediction = k | group)); task=regression "
                               "has a real-valued label and no classes. Use constraint=none (DPSE's bounded group loss is "
                               "method.options.bgl_penalty).")
    if method.PRIVATE and spec.scope == "model" and spec.method.selection == "best_feasible":
        raise ConfigError("method.selection=best_feasible needs a bounded validation score for the private checkpoint choice of "
                          "privacy.scope=model, and task=regression has none (the squared error is unbounded). Use "
                          "method.selection=last (the paper's last iterate) or privacy.scope=paper.")


_SECURE_RNG_WARNED = False


def warn_secure_rng(private: bool, secure: bool) -> None:
    """Warn once per process that the noise is not from a secure source (as Opacus does)."""
    global _SECURE_RNG_WARNED
    if private and not secure and not _SECURE_RNG_WARNED:
        _SECURE_RNG_WARNED = True
        log.warning(
            "Secure RNG turned off: noise and Poisson batches come from seeded PRNGs whose seeds are "
            "recorded, so the guarantee does not hold against readers of the records (they know every "
            "batch and noise draw). Fine for experiments; set privacy.secure_rng=true for a model you "
            "release (see docs/privacy.md, 'Noise source and floating point')."
        )


def check_writable(run_dir: Path) -> None:
    """Fail early, with one line, when the run directory cannot take the run's outputs.

    Writes and removes a small probe file (catches read-only mounts, permissions, a full
    disk and a file in the way), before the MLflow store is touched.

    Raises:
        OutputError: the directory cannot be created or written.
    """
    from raco_cli.errors import OUTPUT_NOT_WRITABLE, OutputError

    probe = Path(run_dir) / ".raco_write_probe"
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 65536)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise OutputError(OUTPUT_NOT_WRITABLE.format(path=run_dir, reason=exc.strerror or exc)) from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


def output_root(args: list[str]) -> Path:
    """The fixed part of the run (or sweep) directory of ``raco train`` overrides.

    ``hydra.run.dir`` / ``hydra.sweep.dir`` up to the first interpolation (``${now:...}``),
    else ``outputs/runs`` / ``outputs/multiruns`` (conf/hydra/default.yaml).
    """
    multirun = any(a in ("--multirun", "-m") for a in args)
    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    value = next((a[len(key) :] for a in args if a.startswith(key)), None)
    if value is None:
        return Path("outputs/multiruns" if multirun else "outputs/runs")
    fixed = value.split("${", 1)[0]
    return Path(fixed) if fixed.endswith("/") or "${" not in value else Path(fixed).parent


def train(
    cfg: DictConfig | Mapping[str, Any], *, run_dir: Path, sweep_dir: Path | None = None, prepared: PreparedRun | None = None
) -> dict[str, Any]:
    """Run one training job and return its summary (also written to ``run_dir/summary.json``).

    ``prepared``: the job's :func:`prepare_run`, when the caller already made it.

    Raises:
        RacoError: bad config, missing data, an unreachable budget or an unwritable run
            directory (before any MLflow write); a failed write of the outputs (the MLflow
            run is then marked FAILED).
    """
    t_start = time.time()
    prep = prepared if prepared is not None else prepare_run(cfg)
    spec, method, pplan = prep.spec, prep.method, prep.plan
    run_dir = Path(run_dir)
    check_writable(run_dir)
    warn_secure_rng(bool(method.PRIVATE), spec.secure_rng)
    set_threads(spec.threads)
    recorder = open_recorder(prep, run_dir, sweep_dir)
    progress = _Progress(pplan.steps, desc=f"{spec.method.name}/{spec.dataset.name}", show_values=full_records(prep))
    status = "FAILED"
    try:
        result = method.fit(
            prep.data, prep.model, prep.constraints, pplan.spec, steps=pplan.steps, seeds=prep.seeds, device=prep.device,
            reporter=_FanOut(progress, recorder),
        )
        progress.close()
        summary = finish_run(prep, result, run_dir, recorder, started=t_start, curves=draw_curves(spec, sweep_dir))
        status = "FINISHED"
        return summary
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as exc:
        tag_error(recorder, exc)
        raise
    finally:
        progress.close()
        if recorder is not None:
            recorder.finish(status)


def set_threads(threads: int | None) -> None:
    """``threads``: torch CPU threads (e.g. 1 for timing, Table 2: no thread sync on tiny ops)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def full_records(prep: PreparedRun) -> bool:
    """Whether the run writes exact training statistics (scope=paper or a non-private method)."""
    return prep.spec.scope == "paper" or not bool(prep.method.PRIVATE)


def draw_curves(spec: RunSpec, sweep_dir: Path | None) -> bool:
    """``tracking.curves``: true/false, or auto (single runs draw curves.png, sweep jobs do not)."""
    return spec.tracking.curves if isinstance(spec.tracking.curves, bool) else sweep_dir is None


def tag_error(recorder: Any, exc: BaseException) -> None:
    if recorder is not None:
        try:
            recorder.set_tags({"raco.error": f"{type(exc).__name__}: {exc}"[:5000]})
        except Exception:  # noqa: BLE001 - keep the original error
            log.exception("could not tag the failed run")


def open_recorder(prep: PreparedRun, run_dir: Path, sweep_dir: Path | None, *, client: Any = None, buffered: bool = False) -> Any:
    """The run's MLflow run (None when tracking is off); ``client``/``buffered``: see
    :class:`raco_cli.tracking.mlflow_store.RunRecorder` (a sweep group shares one client and
    logs its evaluations in bulk)."""
    spec, seeds = prep.spec, prep.seeds
    if not spec.tracking.enabled:
        return None
    from raco_cli.tracking.mlflow_store import RunRecorder

    tags = {
        **run_tags(spec, prep.resolved, run_dir),
        "raco.secure_rng": str(spec.secure_rng).lower(),
        "raco.privacy.scope": spec.scope,
        "raco.seed.init": str(seeds.init),
        # secure_rng: batches and noise from os.urandom, no seed to record (secret batches)
        "raco.seed.sampling": "os.urandom" if spec.secure_rng else str(seeds.sampling),
        "raco.seed.noise": "os.urandom" if spec.secure_rng else str(seeds.noise),
    }
    recorder = RunRecorder(
        uri=str(spec.tracking.uri), experiment=spec.tracking.experiment, run_name=run_name(spec), params=prep.resolved, tags=tags,
        parent_sweep_dir=sweep_dir, client=client, buffered=buffered,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_ID_FILE).write_text(recorder.run_id)
    return recorder


def finish_run(prep: PreparedRun, result: Any, run_dir: Path, recorder: Any, *, started: float, curves: bool,
               stats: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Re-account a trained run, write summary.json, model.pt, config.yaml (and curves.png)
    and its final MLflow records; return the summary.

    ``stats``: extra run statistics (a group's share of wall time).

    Raises:
        OutputError: the outputs cannot be written.
    """
    import torch

    from raco_cli.figures.curves import plot_training_curves
    from raco_cli.methods.planning import run_event
    from raco_cli.privacy import accountant
    from raco_cli.privacy.zcdp import event_rho
    from raco_cli.tracking import summary as summary_mod

    spec, resolved, method, data, cons = prep.spec, prep.resolved, prep.method, prep.data, prep.constraints
    pplan, seeds = prep.plan, prep.seeds
    private = bool(method.PRIVATE)
    full = full_records(prep)
    nonfinite = int(result.stats.get("nonfinite_rows", 0))
    if nonfinite and full:  # an exact training statistic: not in scope=model records
        log.warning(
            "%d per-sample gradients were non-finite (NaN/inf) and were dropped from the clipped sum "
            "(summary.json stats.nonfinite_rows); the model stayed finite. Lower method.lr or check the data.",
            nonfinite,
        )
    event = run_event(method, pplan.spec, pplan.sample_rate, result.steps, constrained=prep.constrained)
    eps_spent = accountant.cached_epsilon(event, spec.delta, discretization=spec.discretization) if private else None
    rho_spent = event_rho(event) if private else None  # zCDP of the same tree (None: no zCDP bound)
    if eps_spent is not None and eps_spent > spec.eps:  # the plan guarantees this never happens
        raise RuntimeError(f"eps_spent={eps_spent} exceeds eps={spec.eps}")
    rec = result.selected_record
    satisfied = rec.metrics["release"]["satisfied"] if "release" in rec.metrics else rec.metrics["train"]["satisfied"]
    summary = {
        "schema_version": summary_mod.SCHEMA_VERSION,
        "method": spec.method.name,
        "dataset": spec.dataset.name,
        "constraint": spec.constraint.name,
        "constraints": list(cons.names),
        "gamma": spec.constraint.gamma,
        "constraint_gammas": [float(g) for g in cons.gamma],
        "constraint_families": {p.family: {"gamma": p.gamma, **dict(p.options)} for p in spec.constraint.parts},
        "partition_cells": cons.Q,
        "eps_target": spec.eps if private else None,
        "eps_spent": eps_spent,
        "delta": spec.delta,
        "rho_target": spec.rho if private else None,
        "rho_spent": rho_spent,
        "task": data.task,
        "private": private,
        "event": str(event),
        "steps": result.steps,
        "sample_rate": pplan.sample_rate,
        "sampling": pplan.spec.sampling,
        "seed": spec.seed,
        "seeds": {
            "init": seeds.init,
            "sampling": None if spec.secure_rng else seeds.sampling,
            "noise": None if spec.secure_rng else seeds.noise,
            "selection": None if spec.secure_rng or not pplan.spec.selection_eps else seeds.selection,
            "preprocessing": None if spec.secure_rng or prep.preprocessing != "dp" else seeds.preprocessing,
        },
        "secure_rng": spec.secure_rng,
        "selection": pplan.spec.selection,
        "selected_step": rec.step,
        "satisfied": None if satisfied is None else bool(satisfied),
        "metrics": rec.metrics,
        "last_metrics": result.history[-1].metrics,
        "lambda": result.lam,
        "hyperparameters": _spec_dict(pplan.spec),
        "group_sizes": {s: data.group_sizes(s) for s in ("train", "val", "test")},
        "stats": {**result.stats, "wall_time_s": time.time() - started, **dict(stats or {}), "releases": result.releases},
        "config_hash": spec.config_hash,
        "device": str(prep.device),
        "privacy_scope": spec.scope,
        "preprocessing": prep.preprocessing,
    }
    if recorder is not None:
        summary["mlflow"] = {"run_id": recorder.run_id, "experiment": spec.tracking.experiment, "uri": spec.tracking.uri}
    if "schema" in data.meta:  # dataset=table: the self-contained model for `raco predict`
        summary["predictor"] = "model"
    # what the scope lets the run write (tracking/summary.py STATUS): every output below
    # is built from this, never from the full summary
    summary = summary_mod.released(summary, scope=spec.scope, private=private)
    try:
        if "predictor" in summary:
            _write_predictor(run_dir / summary["predictor"], summary, data, spec, pplan.spec, result.state_dict, recorder)
        summary_path = summary_mod.write(summary, run_dir / "summary.json")
        artifacts = [summary_path]
        if curves:
            artifacts.append(plot_training_curves(
                result.history, gamma=_common_gamma(cons.gamma, spec.constraint.gamma), path=run_dir / "curves.png",
                title=f"{spec.method.name} {spec.dataset.name} {spec.constraint.name} eps={spec.eps:g}",
            ))
        OmegaConf.save(OmegaConf.create(resolved), run_dir / "config.yaml")
        artifacts.append(run_dir / "config.yaml")
        torch.save(result.state_dict, run_dir / "model.pt")
    except OSError as exc:  # disk full or directory gone mid-run: one line, run marked FAILED
        from raco_cli.errors import OUTPUT_NOT_WRITABLE, OutputError

        raise OutputError(OUTPUT_NOT_WRITABLE.format(path=run_dir, reason=exc.strerror or exc)) from None
    if recorder is not None:
        _log_final(recorder, summary, artifacts, extra={"stats/nonfinite_rows": float(nonfinite)} if full else {})
    return summary


def _write_predictor(target: Path, summary: dict[str, Any], data: Any, spec: RunSpec, method_spec: Any, state_dict: Any,
                     recorder: Any) -> None:
    """The run's model with its fitted preprocessing (raco_cli/predictor.py) in ``target``,
    and in MLflow as a logged model (its URI in ``summary["mlflow"]["model_uri"]``).  What it
    holds is public configuration, releases or facts from the *released* summary."""
    from raco_cli.predictor import Predictor, run_facts
    from raco_cli.tracking import model_artifact

    predictor = Predictor.from_run(data, model=spec.model, state_dict=state_dict, micro_batch=method_spec.micro_batch,
                                   run=run_facts(summary))
    model_artifact.save(predictor, target)
    if recorder is not None:
        summary["mlflow"]["model_uri"] = recorder.log_model(target, step=int(summary["steps"]))


def _common_gamma(gammas: Any, default: float) -> float | None:
    """The gamma shared by every constraint (``default`` when there is none), else None."""
    values = {float(g) for g in gammas}
    if not values:
        return default
    return values.pop() if len(values) == 1 else None


def _plain(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain containers (MLflow params, summary.json)."""
    if isinstance(cfg, DictConfig):
        out = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(out, dict)
        return {str(k): v for k, v in out.items()}
    return dict(cfg)


def run_tags(spec: Any, resolved: Mapping[str, Any], run_dir: Path) -> dict[str, str]:
    """Tags of every job's MLflow run, finished or failed (``raco.config_hash``: sweep resume)."""
    return {
        **extra_tags(resolved),
        "method": spec.method.name,
        "dataset": spec.dataset.name,
        "constraint": spec.constraint.name,
        "raco.config_hash": spec.config_hash,
        "raco.run_dir": str(run_dir),
    }


def run_name(spec: Any) -> str:
    budget = f"rho{spec.rho:g}" if getattr(spec, "rho", None) is not None else f"eps{spec.eps:g}"
    return spec.tracking.run_name or f"{spec.method.name}-{spec.dataset.name}-{spec.constraint.name}-{budget}-seed{spec.seed}"


def extra_tags(resolved: Mapping[str, Any]) -> dict[str, str]:
    """``tracking.tags`` as MLflow tags (sweeps tag their runs with ``sweep``)."""
    tags = (resolved.get("tracking") or {}).get("tags") or {}
    return {str(k): str(v) for k, v in tags.items() if v is not None}


def record_failure(cfg: DictConfig, run_dir: Path, sweep_dir: Path | None, error: BaseException) -> None:
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

    resolved = _plain(cfg)
    tags = {**run_tags(spec, resolved, run_dir), "raco.error": f"{type(error).__name__}: {error}"[:5000]}
    recorder = RunRecorder(
        uri=str(spec.tracking.uri), experiment=spec.tracking.experiment, run_name=run_name(spec), params=resolved,
        tags=tags, parent_sweep_dir=sweep_dir,
    )
    recorder.finish("FAILED")


def _spec_dict(spec: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(spec).items()}


def _log_final(recorder: Any, summary: dict[str, Any], artifacts: list[Path], *, extra: Mapping[str, float] | None = None) -> None:
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


def _has_run(run_dir: Path) -> bool:
    """Whether train() got as far as creating the job's MLflow run (it then marked it FAILED)."""
    return (Path(run_dir) / RUN_ID_FILE).exists()


def _record_quietly(cfg: DictConfig, run_dir: Path, sweep_dir: Path | None, exc: BaseException) -> None:
    try:
        record_failure(cfg, run_dir, sweep_dir, exc)
    except Exception:  # noqa: BLE001 - recording a failure must not fail the sweep
        log.exception("could not record the failed job in MLflow")


SCOPE_NOTES = {
    "model": "model (eps covers the model and every record written)",
    "paper": "paper (eps covers training only: not the exact-data checkpoint choice, "
             "preprocessing statistics or training statistics in the records)",
}


def format_result(summary: Mapping[str, Any], run_dir: Path) -> str:
    """The short result table printed after a run."""
    test = summary["metrics"]["test"]
    if "mspe" in test:  # task=regression
        lines = [f"{summary['method']} on {summary['dataset']} (regression)", f"  test MSPE            {test['mspe']:.4f}"]
        lines += [f"  test MSPE {group:<10} {'-' if v is None else f'{v:.4f}'}" for group, v in test["group_mspe"].items()]
        return "\n".join(lines + _privacy_lines(summary, run_dir))
    lines = [
        f"{summary['method']} on {summary['dataset']} ({summary['constraint']}, gamma={summary['gamma']:g})",
        f"  test accuracy        {test['accuracy']:.4f}",
        f"  test DP gap (hard)   {test['dp_gap']:.4f}",
    ]
    for family, fm in (test.get("constraints") or {}).items():
        if family == "dp":
            continue
        for name, value in (fm.get("standard") or {}).items():
            if isinstance(value, (int, float)):
                lines.append(f"  test {name:<16}{value:.4f}")
        if not fm.get("standard"):
            lines.append(f"  test {family} max Gamma  {fm['max_hard']:.4f}")
    if summary.get("privacy_scope") == "model" and summary.get("private"):
        shown = "unknown (no noisy histogram)" if summary["satisfied"] is None else str(summary["satisfied"]).lower()
        lines.append(f"  gamma                {summary['gamma']:g}   (constraint satisfied by the noisy histograms: {shown})")
    else:
        lines.append(f"  gamma                {summary['gamma']:g}   (train constraint satisfied: {str(summary['satisfied']).lower()})")
    return "\n".join(lines + _privacy_lines(summary, run_dir))


def _privacy_lines(summary: Mapping[str, Any], run_dir: Path) -> list[str]:
    lines = []
    if summary["eps_spent"] is not None:
        lines.append(f"  eps spent            {summary['eps_spent']:.4f} of {summary['eps_target']:g} (delta={summary['delta']:g})")
        if summary.get("rho_spent") is not None:  # zCDP of the same event tree (privacy.rho: the target)
            target = f" of {summary['rho_target']:g}" if summary.get("rho_target") is not None else ""
            lines.append(f"  rho spent (zCDP)     {summary['rho_spent']:.4f}{target}")
        lines.append(f"  privacy scope        {SCOPE_NOTES.get(summary.get('privacy_scope', 'paper'), '')}")
    else:
        lines.append("  eps spent            not private")
    lines += [
        f"  steps                {summary['steps']} (selected step {summary['selected_step']})",
        f"  summary              {Path(run_dir) / 'summary.json'}",
    ]
    if "predictor" in summary:
        lines.append(f"  model for new rows   raco predict {run_dir} --data NEW.csv --out predictions.csv")
    if "mlflow" in summary:
        lines.append(f"  mlflow run           {summary['mlflow']['run_id']} ({summary['mlflow']['uri']})")
        if "model_uri" in summary["mlflow"]:
            lines.append(f"  mlflow model         {summary['mlflow']['model_uri']}")
    return lines


def hydra_entry() -> None:
    """Run the Hydra application on ``sys.argv`` (``train`` already stripped)."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    register_resolvers()

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def _task(cfg: DictConfig) -> float | None:
        hc = HydraConfig.get()
        run_dir = Path(hc.runtime.output_dir)
        multirun = hc.mode == RunMode.MULTIRUN
        sweep_dir = Path(hc.sweep.dir) if multirun else None
        group = OmegaConf.select(cfg, "raco_group", default=None)
        if group is not None:  # a sweep group job (raco_cli/cli/group.py): its runs' configs are in the file
            from raco_cli.cli.group import run_group_file

            return run_group_file(Path(str(group)), sweep_dir=sweep_dir)  # type: ignore[return-value]
        try:
            summary = train(cfg, run_dir=run_dir, sweep_dir=sweep_dir)
        except RacoError as exc:
            print(f"error: {exc}", file=sys.stderr)
            if multirun:  # one bad job must not stop the sweep; its failure is recorded
                if not isinstance(exc, TrackingError) and not _has_run(run_dir):
                    _record_quietly(cfg, run_dir, sweep_dir, exc)
                return None
            raise SystemExit(2) from None
        except Exception as exc:  # a bug: keep the traceback; in a sweep, record and go on
            if not multirun:
                raise
            log.exception("job failed")
            print(f"error: job {hc.job.num} failed: {type(exc).__name__}: {exc} (traceback in {run_dir})", file=sys.stderr)
            if not _has_run(run_dir):
                _record_quietly(cfg, run_dir, sweep_dir, exc)
            return None
        print(format_result(summary, run_dir), flush=True)
        # the job's value for an optimising sweeper: validation accuracy; NaN in scope=model,
        # which writes no exact validation statistic (None would mean "failed" to the sweeper)
        val = summary["metrics"].get("val")
        if val is None:
            return float("nan")
        return -float(val["mspe"]) if "mspe" in val else float(val["accuracy"])  # higher is better

    _task()
