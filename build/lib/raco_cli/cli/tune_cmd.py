"""``raco tune``: hyperparameter search, private by default.

    raco tune [--config-dir DIR] dataset=adult constraint=dp eps=1 constraint.gamma=0.05
              [tune.repetitions=poisson] [tune.mean=10] [tune.shape=1]
              [tune.candidates=8] [tune.score_noise=30] [tune.study=NAME]
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
K, the candidates and each trial's candidate and seed are drawn from the OS CSPRNG (as the
private noise is), never from a seed: there is no ``tune.sampler_seed`` in this scope, and the
search is not reproducible by design.  No record tells how long the search or a trial took (no
process times, MLflow start = end time; liveness lives in a lock file under ``.raco-locks/``
beside the store, removed when the run ends): its duration would tell K.

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
``tune.sampler_seed`` (this scope only) seeds the TPE sampler, moved on by the number of trials
a resumed study already holds (a resumed search does not redraw the first session's points).
An adaptive sampler (TPE) reads earlier trials' scores, which the private search's theorem does
not cover: it stays in this protocol.

Search space, and why its learning rates leave the paper's range: :mod:`raco_cli.run.tune_space`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from raco_cli.errors import ConfigError

TUNE_KEYS = {
    "trials": 200, "trial_seeds": 5, "seeds": 20, "storage": "sqlite:///outputs/optuna.db",
    "study": None, "retrain": True, "timeout": None, "sampler_seed": 0, "out": "outputs/tune",
}  # fmt: skip
PRIVATE_KEYS = {
    "repetitions": "poisson", "mean": 10, "shape": 1.0, "candidates": 8, "score_noise": 30.0,
    "study": None, "out": "outputs/tune",
}  # fmt: skip


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

    from raco_cli.cli.overrides import config_dirs

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
            why = ("the private search draws its number of trials, its candidates and its trials' seeds from the OS CSPRNG, "
                   "never from a seed (a seed would make the secret number of trials recomputable)") \
                if scope != "paper" and key == "sampler_seed" else \
                ("the private search draws its number of trials from tune.repetitions, trains one seed per trial, writes "
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
    }
    for key, (ok, allowed) in checks.items():
        v = opts[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
            raise ConfigError(f"tune.{key} must be {allowed} (got tune.{key}={v!r}).")
    return opts, overrides


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    opts, overrides = parse_args(argv)
    if scope_of(overrides) != "paper":
        from raco_cli.cli.tune_private import private_main

        return private_main(opts, overrides)
    from raco_cli.cli.tune_paper import paper_main

    return paper_main(opts, overrides)
