"""Training methods behind one interface (see :mod:`raco_cli.methods.base`)."""

from __future__ import annotations

import importlib
from types import ModuleType

from raco_cli.errors import unknown_name

METHODS: dict[str, str] = {
    "raco_dp": "raco_cli.methods.raco_dp",
    "dp_sgd": "raco_cli.methods.dp_sgd",
    "sgd": "raco_cli.methods.sgd",
    "sgda": "raco_cli.methods.sgda",
    "dp_fermi": "raco_cli.methods.dp_fermi",
    "dpse": "raco_cli.methods.dpse",
}


def get(name: str) -> ModuleType:
    """The method module registered under ``name``.

    Raises:
        ConfigError: unknown method (the message lists the available ones).
    """
    if name not in METHODS:
        raise unknown_name("method", name, METHODS)
    return importlib.import_module(METHODS[name])
