"""Training methods behind one interface (see :mod:`raco_cli.methods.base`)."""

from __future__ import annotations

import importlib
from types import ModuleType

from raco_cli.errors import unknown_name

METHODS: dict[str, str] = {
    "raco_dp": "raco_cli.methods.sgda.raco_dp",
    "dp_sgd": "raco_cli.methods.sgda.dp_sgd",
    "sgd": "raco_cli.methods.sgda.sgd",
    "sgda": "raco_cli.methods.sgda.sgda",
    "dp_fermi": "raco_cli.methods.dp_fermi",
    "dpse": "raco_cli.methods.dpse",
    "dp_double_spider": "raco_cli.methods.dp_double_spider",
    "dp_recursive_spider": "raco_cli.methods.dp_recursive_spider",
    "dp_sgda": "raco_cli.methods.dp_sgda",
    "dp_private_diff": "raco_cli.methods.dp_private_diff",
    "spider": "raco_cli.methods.spider",
}
# the objectives each method optimises (``objective=<name>``; absent: erm only) and the
# methods with a random-iterate output (``method.selection=random``); static, so the config
# layer checks them without importing torch
OBJECTIVES: dict[str, tuple[str, ...]] = {
    "sgda": ("erm", "dro"),
    **dict.fromkeys(("dp_double_spider", "dp_recursive_spider", "dp_sgda", "dp_private_diff", "spider"), ("dro",)),
}
RANDOM_ITERATE = ("dp_double_spider", "dp_recursive_spider", "dp_sgda", "dp_private_diff", "spider")


def objectives_of(name: str) -> tuple[str, ...]:
    return OBJECTIVES.get(name, ("erm",))


def get(name: str) -> ModuleType:
    """The method module registered under ``name``.

    Raises:
        ConfigError: unknown method (the message lists the available ones).
    """
    if name not in METHODS:
        raise unknown_name("method", name, METHODS)
    return importlib.import_module(METHODS[name])
