"""``best.yaml``: the settings a ``raco tune`` search chose, as an experiment config with where
they came from (the paper's Optuna search and the private search each write one)."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROTOCOL_LINE = "Papernot & Steinke 2022"


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


def write_best_private(best: Any, search: Any, *, study_name: str, overrides: Sequence[str], out: Path) -> Path:
    """``best.yaml`` of a private search: the chosen settings as an experiment config whose
    ``method.tuned_on`` records the protocol and the eps of the search; ``overrides``: the search's."""
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
        f"# Search overrides: {' '.join(overrides)}",
        "# Running these settings again on the same data spends a new eps (it composes with the search's).",
    ]
    path = out / "best.yaml"
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(nested, sort_keys=True))
    return path

