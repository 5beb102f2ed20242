"""The packaged configs (``raco_cli/conf``) as the one source of every default.

``raco train`` composes ``conf/config.yaml`` and its groups with Hydra; a spec built in Python
(:class:`raco_cli.methods.base.MethodSpec`) fills what it is not given from the same files, so
``MethodSpec(name="raco_dp")`` is the method spec ``raco train method=raco_dp`` builds
(``tests/unit/test_defaults.py``).  Read with PyYAML (no Hydra: the method files hold plain
values), once per process.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parent / "conf"

#: the values a spec holds for an ``auto`` setting until the run resolves it from the data
#: (``prepare_run``: the batch size from the training size, the dual step from the plan and the
#: cell sizes, the dual's rates from the confidence margins)
AUTO_PLACEHOLDERS: dict[str, Any] = {"batch_size": 1024, "lr_dual": 0.1, "dual": "soft"}


@cache
def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    with open(path) as fh:
        loaded = yaml.safe_load(fh) or {}
    return {k: v for k, v in loaded.items() if k != "defaults"}


def root_defaults() -> dict[str, Any]:
    """``conf/config.yaml`` without its defaults list (eps, delta, seed, privacy.*, ...)."""
    return dict(_yaml(CONF_DIR / "config.yaml"))


def group_defaults(group: str, option: str) -> dict[str, Any]:
    """``conf/<group>/<option>.yaml`` as plain values; empty for an option without a packaged file."""
    path = CONF_DIR / group / f"{option}.yaml"
    return dict(_yaml(path)) if path.is_file() else {}


def method_defaults(name: str) -> dict[str, Any]:
    """``conf/method/<name>.yaml`` (every key a method spec takes, ``auto`` where the run
    resolves it); empty for a name without a packaged file."""
    return group_defaults("method", name)


def privacy_scope() -> str:
    """``privacy.scope``'s default: ``model`` (eps covers everything a run writes)."""
    return str((root_defaults().get("privacy") or {}).get("scope", "model"))


def secure_rng(value: Any, scope: str) -> bool:
    """``privacy.secure_rng`` resolved: ``auto`` is secret randomness under ``scope=model``.

    >>> secure_rng("auto", "model"), secure_rng("auto", "paper"), secure_rng(False, "model")
    (True, False, False)
    """
    return scope == "model" if value == "auto" else bool(value)


def selection(value: Any, scope: str) -> Any:
    """``method.selection`` resolved: ``auto`` is the tail average under ``scope=model``, the
    paper's best feasible checkpoint under ``paper``.

    >>> selection("auto", "model"), selection("auto", "paper"), selection("last", "model")
    ('average', 'best_feasible', 'last')
    """
    if value == "auto":
        return "average" if scope == "model" else "best_feasible"
    return value
