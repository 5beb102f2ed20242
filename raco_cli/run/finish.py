"""Finish a trained run: re-account, build the summary, write the run's outputs and its final
MLflow records.

Every output is built from the *released* summary (:func:`raco_cli.tracking.summary.released`:
what the run's privacy scope lets it write), never from the full one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from raco_cli.run.certify import certificate_of, claim
from raco_cli.run.records import log_final

log = logging.getLogger(__name__)


def finish_run(prep: Any, result: Any, run_dir: Path, recorder: Any, *, started: float | None, curves: bool,
               stats: Mapping[str, Any] | None = None, search: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Re-account a trained run, write summary.json, model.pt, config.yaml (and curves.png)
    and its final MLflow records; return the summary.

    ``stats``: extra run statistics (a group's share of wall time).  ``search``: the run is the
    released best trial of a private search (:mod:`raco_cli.run.private_search`), whose
    ``eps_target``, ``eps_spent``, ``event`` and ``tuned_on`` replace the trial's and whose
    ``search`` block is recorded.

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
    full = prep.full_records
    nonfinite = int(result.stats.get("nonfinite_rows", 0))
    if nonfinite and full:  # an exact training statistic: not in scope=model records
        log.warning(
            "%d per-sample gradients were non-finite (NaN/inf) and were dropped from the clipped sum "
            "(summary.json stats.nonfinite_rows); the model stayed finite. Lower method.lr or check the data.",
            nonfinite,
        )
    event = run_event(method, pplan.spec, pplan.sample_rate, result.steps, constrained=prep.constrained)
    # a private level estimate's threshold reserved part of delta (raco_cli/privacy/estimates.py)
    eps_spent = accountant.cached_epsilon(event, pplan.spec.accounting_delta(spec.delta), discretization=spec.discretization) \
        if private else None
    rho_spent = event_rho(event) if private else None  # zCDP of the same tree (None: no zCDP bound)
    if eps_spent is not None and eps_spent > spec.eps:  # the plan guarantees this never happens
        raise RuntimeError(f"eps_spent={eps_spent} exceeds eps={spec.eps}")
    rec = result.selected_record
    requested = prep.requested if prep.requested is not None else cons
    metrics, last_metrics = (requested_metrics(m, requested) for m in (rec.metrics, result.history[-1].metrics))
    satisfied = summary_mod.released_model_satisfied(metrics)
    # the confidence only the released model's certificate supports (run/certify.py): one
    # accounted release of its validation prediction counts under scope=model
    certificate = certificate_of(prep, result)
    confidence, confidence_note = claim(certificate, spec.constraint.gamma)
    summary = {
        "schema_version": summary_mod.SCHEMA_VERSION,
        "method": spec.method.name,
        "dataset": spec.dataset.display,
        "constraint": spec.constraint.name,
        "constraints": list(cons.names),
        "gamma": spec.constraint.gamma,
        "constraint_gammas": [float(g) for g in requested.gamma],
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
        "train_size": pplan.spec.size_of(len(data.splits["train"])),
        "sampling": pplan.spec.sampling,
        "seed": spec.seed,
        "seeds": {
            "init": seeds.init,
            "sampling": None if spec.secure_rng else seeds.sampling,
            "noise": None if spec.secure_rng else seeds.noise,
            "selection": None if spec.secure_rng or not pplan.spec.selection_eps else seeds.selection,
            "preprocessing": None if spec.secure_rng or prep.preprocessing != "dp" else seeds.preprocessing,
            "size": None if spec.secure_rng or not pplan.spec.size_noise else seeds.size,
            "estimates": None if spec.secure_rng or not pplan.spec.estimate_noise else seeds.estimates,
        },
        "secure_rng": spec.secure_rng,
        "tuned_on": tuned_on(spec),
        "selection": pplan.spec.selection,
        "selected_step": rec.step,
        "satisfied": satisfied,
        "metrics": metrics,
        "last_metrics": last_metrics,
        "confidence": confidence,
        "margins": None if prep.margins is None else {n: float(m) for n, m in zip(cons.names, prep.margins.margin)},
        "confidence_note": confidence_note or prep.confidence_note,
        "certificate": None if certificate is None else certificate.record(tuple(requested.names)),
        "lambda": result.lam,
        "hyperparameters": spec_dict(pplan.spec),
        "group_sizes": {s: data.group_sizes(s) for s in ("train", "val", "test")},
        # the wall time only in full records (scope=model: no process timing, docs/privacy.md "Timing")
        "stats": {**result.stats, **({"wall_time_s": time.time() - started} if full and started is not None else {}),
                  **dict(stats or {}), "releases": result.releases},
        "config_hash": spec.config_hash,
        "device": str(prep.device),
        "privacy_scope": spec.scope,
        "preprocessing": prep.preprocessing,
    }
    if data.target is None:  # the result table's baseline: the accuracy of the constant most-frequent-class model
        summary["label_counts"] = {"test": data.label_counts("test")}
    if search is not None:  # eps covers the search, not only this trial (its zCDP rho does not hold for the search)
        summary.update({k: search[k] for k in ("eps_target", "eps_spent", "event", "tuned_on", "search")}, rho_spent=None)
    if recorder is not None:
        summary["mlflow"] = {"run_id": recorder.run_id, "experiment": spec.tracking.experiment, "uri": spec.tracking.uri}
    if "schema" in data.meta:  # dataset=table: the self-contained model for `raco predict`
        summary["predictor"] = "model"
    if "estimates" in data.meta:  # dataset=table's private values: a release (raco_cli/privacy/estimates.py)
        summary["estimates"] = data.meta["estimates"]
    # what the scope lets the run write (tracking/summary.py STATUS): every output below
    # is built from this, never from the full summary
    summary = summary_mod.released(summary, scope=spec.scope, private=private)
    try:
        if "predictor" in summary:
            write_predictor(run_dir / summary["predictor"], summary, data, spec, pplan.spec, result.state_dict, recorder)
        summary_path = summary_mod.write(summary, run_dir / "summary.json")
        artifacts = [summary_path]
        if curves:
            artifacts.append(plot_training_curves(
                result.history, gamma=common_gamma(requested.gamma, spec.constraint.gamma), path=run_dir / "curves.png",
                title=f"{spec.method.name} {spec.dataset.display} {spec.constraint.name} eps={spec.eps:g}",
            ))
        artifacts.append(summary_mod.write_config(resolved, run_dir / "config.yaml"))
        torch.save(result.state_dict, run_dir / "model.pt")
    except OSError as exc:  # disk full or directory gone mid-run: one line, run marked FAILED
        from raco_cli.errors import OUTPUT_NOT_WRITABLE, OutputError

        raise OutputError(OUTPUT_NOT_WRITABLE.format(path=run_dir, reason=exc.strerror or exc)) from None
    if recorder is not None:
        log_final(recorder, summary, artifacts, extra={"stats/nonfinite_rows": float(nonfinite)} if full else {})
    return summary


def requested_metrics(metrics: dict[str, Any], requested: Any) -> dict[str, Any]:
    """An evaluation's constraint metrics against the gammas the user asked for (a run with
    ``constraint.confidence`` trains against gamma - margin); the ``release`` split (the noisy
    training signal) stays against the training targets."""
    from raco_cli.metrics.evaluate import against_gamma

    families = {f: requested.family_indices(f) for f in requested.families}
    return {split: m if split == "release" else against_gamma(m, requested.gamma, families) for split, m in metrics.items()}


def tuned_on(spec: Any) -> dict[str, Any] | None:
    """``method.tuned_on`` with ``outside_eps``: whether the hyperparameters were chosen
    non-privately on this very dataset (exact statistics of its train/val split, which the
    run's epsilon does not cover)."""
    if not spec.tuned_on:
        return None
    here = spec.tuned_on.get("dataset") == spec.dataset.name and spec.tuned_on.get("protocol") == "non-private"
    return {**spec.tuned_on, "outside_eps": bool(here)}


def write_predictor(target: Path, summary: dict[str, Any], data: Any, spec: Any, method_spec: Any, state_dict: Any,
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


def common_gamma(gammas: Any, default: float) -> float | None:
    """The gamma shared by every constraint (``default`` when there is none), else None.

    >>> common_gamma([0.05, 0.05], 0.1), common_gamma([], 0.1), common_gamma([0.05, 0.1], 0.1)
    (0.05, 0.1, None)
    """
    values = {float(g) for g in gammas}
    if not values:
        return default
    return values.pop() if len(values) == 1 else None


def spec_dict(spec: Any) -> dict[str, Any]:
    """A method spec as plain containers (summary.json ``hyperparameters``)."""
    return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(spec).items()}
