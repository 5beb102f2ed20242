"""The ``summary.json`` of a run: a stable, documented schema (``schema_version``).

Top-level keys (version 1):

=================  ==========================================================================
key                meaning
=================  ==========================================================================
schema_version     1
method             method registry key (raco_dp, dp_sgd, sgd, sgda, ...)
dataset            dataset registry key; for dataset=table the table's name (dataset.options.name,
                   else the file's stem)
constraint         constraint registry key (``none`` for unconstrained runs; a combination is its
                   families joined by ``+``, e.g. ``dp+fnr``)
constraints        names of the J rate constraints
gamma              ``constraint.gamma`` (for a combination: the gamma of parts without their own)
constraint_gammas  (added in v1, optional) gamma_j of each of the J constraints
constraint_families (added in v1, optional) family -> its settings ({gamma, positive_class, ...})
partition_cells    (added in v1, optional) Q, cells of the derived global partition (histogram rows)
eps_target         the requested epsilon (null for non-private methods)
eps_spent          epsilon of the accounted DpEvent tree of the steps actually run (null: not private)
delta              delta of the guarantee
rho_target         (added in v1, optional) ``privacy.rho``, the rho-zCDP budget eps was derived from
rho_spent          (added in v1, optional) zCDP rho of the same tree (null: a release without a
                   zCDP bound, e.g. Poisson-subsampled, or not private)
task               (added in v1, optional) classification | regression
private            whether the method is differentially private
event              the accounted DpEvent tree, as text
steps              steps run (T)
sample_rate        Poisson rate q = batch_size / train_size
train_size         (added in v1, optional) the training size the run used: under scope=model the
                   released DP count n~ of the training rows (raco_cli/privacy/size.py), else n
sampling           independent | shared
seed, seeds        run seed and the derived init / sampling / noise / selection /
                   preprocessing / size seeds (all but init: null with secure_rng, the
                   default under scope=model)
confidence         (added in v1, optional) ``constraint.confidence`` when the released model's
                   certificate holds (``certificate``), else null
margins            (added in v1, optional) constraint name -> its generalisation margin m_j: the run
                   trained and selected against gamma_j - m_j (raco_cli/constraints/margin.py)
confidence_note    (added in v1, optional) why no confidence is claimed: the certificate does not
                   support it (with the gamma it supports), or ``constraint.confidence=auto``
                   applied no margin (the data cannot support it); else null
certificate        (added in v1, optional) the released model's certificate
                   (raco_cli/constraints/certificate.py): ``holds``, ``confidence``, ``achieved``
                   (the confidence it gives at gamma), ``slack`` (it holds at gamma + slack),
                   ``candidates`` (the union bound's N), ``count_sd`` (sigma_Z of the released
                   counts; 0: exact), per constraint ``estimate`` and ``sd``; null without one
tuned_on           (added in v1, optional) ``method.tuned_on`` (dataset, split, protocol where the
                   hyperparameters were chosen) with ``outside_eps``: chosen non-privately on
                   this very dataset
secure_rng         whether the noise came from os.urandom (privacy.secure_rng)
selection          checkpoint rule; ``selected_step`` the reported step
satisfied          whether the released model meets every constraint's gamma (as asked for,
                   hard predictions) on the held-out test split: ``metrics.test.satisfied``,
                   the result table's holds/VIOLATED rows, the same for raco train and raco tune;
                   the training-side signal is ``metrics.release.satisfied`` (scope=model: the
                   noisy histograms) or ``metrics.train.satisfied`` (full records)
metrics            ``metrics.<split>.<name>`` for split in train/val/test at the selected step:
                   accuracy, loss, constraint_values_hard/soft (J lists), constraint_max_hard/soft
                   (max_j Gamma_j), violation_hard/soft (max_j Gamma_j - gamma_j), satisfied,
                   dp_gap, eo_gap, eop_gap, fnr, fpr, group_accuracy, group_positive_rate (maps
                   group -> value), n, and (added in v1, optional) ``constraints.<family>`` for
                   each constraint family of the run: names, gamma, values_hard/values_soft
                   (the family's Gamma_j), max_hard/max_soft, max_violation_hard/soft
                   (max_j Gamma_j - gamma_j), satisfied, standard (the family's fairlearn-defined
                   metric: dp -> dp_gap, eo -> eo_gap, eop -> eop_gap, fnr -> fnr, fpr -> fpr);
                   ``task=regression`` instead: n, mspe, loss, group_mspe (group -> mean squared
                   prediction error), worst_group_mspe, mspe_gap, satisfied (true: no constraint)
last_metrics       the same at the last step
lambda             final dual variables
hyperparameters    the method spec used (after noise calibration)
group_sizes        rows per sensitive group in each split
label_counts       (added in v1, optional; classification) ``label_counts.test``: rows of each class in
                   the test split (the accuracy of predicting its most frequent class everywhere)
stats              mean batch size, clip fraction, nonfinite_rows (NaN/inf per-sample gradients
                   dropped), time per step (ms), throughput_images_per_s (gradient-batch rows per
                   second of step time, evaluation excluded), wall time (s), ...
config_hash        hash of the computing part of the config (sweep resume)
mlflow             {run_id, experiment, uri} when tracking is enabled (+ model_uri: dataset=table)
privacy_scope      (added in v1, optional) ``privacy.scope``: model | paper
preprocessing      (added in v1, optional) how features were scaled: public | dp | empirical
estimates          (added in v1, optional; dataset=table) the private values of the table, estimated
                   from its training split in one accounted release: bounds, levels,
                   missing_indicator, types (private column types), noise_multiplier, columns, std,
                   threshold, reserved_delta
search             (added in v1, optional; ``raco tune`` under scope=model) the private search whose best
                   trial this run is: protocol, repetitions (kind, mean, shape), candidates,
                   eps_trial, score_noise, and the trial's noisy validation score (noisy_val_correct,
                   noisy_val_rows, noisy_val_accuracy, noisy_feasible); eps_spent is the search's
predictor          (added in v1, optional; dataset=table) the run-directory folder of the
                   self-contained model for ``raco predict`` (``model``); its MLflow logged
                   model is ``mlflow.model_uri``
=================  ==========================================================================

Privacy status of every key (``privacy.scope=model``, :data:`STATUS`): ``public``
(configuration, or a function of it), ``release`` (an accounted noisy release or
post-processing of the releases), ``test`` (evaluation on the held-out test split) or
``exact`` (an exact statistic of training/validation records).  In ``scope=model`` a private
run writes no ``exact`` key, in summary.json or MLflow; keys not declared here count as
``exact`` (safe by default).  ``scope=paper`` (and non-private methods) write everything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
REQUIRED_KEYS = (
    "schema_version", "method", "dataset", "constraint", "gamma", "eps_target", "eps_spent",
    "delta", "steps", "sampling", "seed", "selected_step", "metrics",
)  # fmt: skip
REQUIRED_METRICS = (
    "accuracy", "constraint_max_hard", "constraint_max_soft", "satisfied", "dp_gap", "group_accuracy",
)  # fmt: skip
REQUIRED_REGRESSION_METRICS = ("mspe", "group_mspe", "worst_group_mspe")


PUBLIC, RELEASE, TEST, EXACT = "public", "release", "test", "exact"
# "mia": membership-inference AUCs of training vs validation rows (scope=paper only) (methods/dro/common.py): exact
_SPLITS = {"train": EXACT, "val": EXACT, "test": TEST, "release": RELEASE, "mia": EXACT}
STATUS: dict[str, Any] = {
    # hyperparameters: the config, with method.batch_size=auto / method.lr_dual=auto resolved from
    # the released size and cell counts (post-processing of releases: safe to write either way)
    **dict.fromkeys(
        ("schema_version", "method", "dataset", "constraint", "constraints", "gamma", "constraint_gammas",
         "constraint_families", "partition_cells", "eps_target", "eps_spent", "delta", "private", "event", "steps",
         "sampling", "seed", "seeds", "secure_rng", "selection", "hyperparameters", "config_hash", "device", "mlflow",
         "privacy_scope", "preprocessing", "predictor", "rho_target", "rho_spent", "task", "tuned_on"),
        PUBLIC,
    ),
    # constraint.confidence: computed from the released cell counts (scope=model); the claim from
    # the released model's training signal (the noisy histograms)
    "margins": RELEASE, "confidence_note": RELEASE, "confidence": RELEASE,
    # the released model's certificate: its validation prediction counts released once (scope=model,
    # privacy/certificate.py), or exact (full records); every field post-processing of them
    "certificate": RELEASE,
    # scope=model: q = B / n~ and n~, the released DP count of the training rows (privacy/size.py)
    "sample_rate": RELEASE, "train_size": RELEASE,
    # dataset=table's private bounds / levels / missing indicators: one accounted release (privacy/estimates.py)
    "estimates": RELEASE,
    # a private search's best trial (run/private_search.py): its settings are configuration; its
    # plan (planned from n~) and its score are releases; the number of trials is never recorded
    "search": {**dict.fromkeys(("protocol", "eps_covers", "repetitions", "mean", "shape", "candidates",
                                "score_noise"), PUBLIC),
               **dict.fromkeys(("usable_candidates", "eps_trial", "noisy_val_correct", "noisy_val_rows", "noisy_val_accuracy",
                                "noisy_feasible"), RELEASE)},
    # the selected step and the multipliers are functions of noisy releases; ``satisfied`` is
    # the released model's constraint on the held-out test split (metrics.test.satisfied)
    "selected_step": RELEASE, "lambda": RELEASE, "satisfied": TEST,
    "metrics": _SPLITS, "last_metrics": _SPLITS,
    "group_sizes": {"train": EXACT, "val": EXACT, "test": TEST},
    "label_counts": {"train": EXACT, "val": EXACT, "test": TEST},
    # releases per kind and q are fixed by the config; everything else in stats (batch sizes,
    # clip fractions, gradient norms, non-finite rows, step times) is exact
    "stats": {"releases": PUBLIC, "sample_rate": RELEASE, "fermi_lambda": PUBLIC, "group_proportions": RELEASE,
              # DPSE: the zCDP split is config; the allocation is post-processing of its stage-1 releases
              "rho_total": PUBLIC, "rho_stage1": PUBLIC, "rho_stage2": PUBLIC, "precursor_ridge": PUBLIC,
              "budget_weights": RELEASE, "standard_errors": RELEASE, "noise_multipliers": RELEASE, "rho_realized": RELEASE,
              "se_sums": RELEASE, "se_fallback": RELEASE, "penalty_active_fraction": RELEASE,
              "penalized_groups": RELEASE,
              # the random iterate's step tau is drawn from the selection seed before training
              "random_iterate_step": PUBLIC},
}  # fmt: skip


def released_model_satisfied(metrics: Mapping[str, Any]) -> bool | None:
    """summary.json's top-level ``satisfied``, one meaning for every command (``raco train``,
    ``raco tune`` in both scopes, sweeps, groups): the released model meets every constraint's
    gamma, as the user asked for it, with hard predictions on the held-out test split (the
    ``holds``/``VIOLATED`` rows of the result table; ``metrics.test.satisfied``).  The
    training-side signal is ``metrics.release.satisfied`` (scope=model: the noisy histograms)
    or ``metrics.train.satisfied`` (full records).

    >>> released_model_satisfied({"test": {"satisfied": False}, "release": {"satisfied": True}})
    False
    """
    value = (metrics.get("test") or {}).get("satisfied")
    return None if value is None else bool(value)


def training_signal(summary: Mapping[str, Any]) -> bool | None:
    """Whether the released model met its training target on the training side: the noisy
    histograms' feasibility (``metrics.release``, scope=model) or the exact training split's
    hard constraint (``metrics.train``, full records); None when neither tells."""
    metrics = summary.get("metrics") or {}
    for split in ("release", "train"):
        value = (metrics.get(split) or {}).get("satisfied")
        if value is not None:
            return bool(value)
    return None


def status_of(path: str) -> str:
    """Privacy status of a dotted summary key (undeclared keys: ``exact``).

    >>> status_of("metrics.test.accuracy"), status_of("stats.mean_grad_norm"), status_of("eps_spent")
    ('test', 'exact', 'public')
    """
    node: Any = STATUS
    for part in path.split("."):
        if not isinstance(node, dict):
            return node
        if part not in node:
            return EXACT
        node = node[part]
    return node if isinstance(node, str) else EXACT


def released(summary: dict[str, Any], *, scope: str, private: bool) -> dict[str, Any]:
    """The part of ``summary`` a run may write: everything in ``scope=paper`` or for a
    non-private method, else only the ``public``, ``release`` and ``test`` keys."""
    if scope == "paper" or not private:
        return summary
    return _keep(summary, STATUS)


def _keep(node: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        st = status.get(key, EXACT)
        if isinstance(st, dict):
            if isinstance(value, dict):
                kept = _keep(value, st)
                if kept:
                    out[key] = kept
        elif st != EXACT:
            out[key] = value
    return out


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> null, numpy scalars -> Python."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write(summary: dict[str, Any], path: Path) -> Path:
    """Write summary.json atomically (a crash never leaves a half-written file), with the mode
    of the run's other files (:mod:`raco_cli.tracking.files`)."""
    from raco_cli.tracking.files import atomic_write

    text = json.dumps(_clean(summary), indent=2, sort_keys=False)
    return atomic_write(Path(path), lambda fh: fh.write(text + "\n"))


def validate(summary: dict[str, Any]) -> list[str]:
    """Problems with a summary (empty when it follows the schema; a ``scope=model`` record of
    a private run has test metrics only)."""
    problems = [f"missing key {k}" for k in REQUIRED_KEYS if k not in summary]
    model_scope = summary.get("privacy_scope") == "model" and summary.get("private")
    for split in ("test",) if model_scope else ("train", "val", "test"):
        m = summary.get("metrics", {}).get(split)
        if m is None:
            problems.append(f"missing metrics.{split}")
            continue
        required = REQUIRED_REGRESSION_METRICS if summary.get("task") == "regression" else REQUIRED_METRICS
        problems += [f"missing metrics.{split}.{k}" for k in required if k not in m]
    return problems


def write_config(resolved: dict[str, Any], path: Path) -> Path:
    """Write the run's resolved config as ``config.yaml`` (plain YAML, keys in config order;
    the same text OmegaConf writes for these plain containers).  libyaml's safe dumper where
    PyYAML has it: the same text, 1.4 vs 6.3 ms a run (compared on 50 stored configs)."""
    import yaml

    path = Path(path)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump(resolved, Dumper=dumper, sort_keys=False, default_flow_style=False, allow_unicode=True), encoding="utf-8")
    return path
