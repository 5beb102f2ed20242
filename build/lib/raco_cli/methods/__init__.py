"""Training methods behind one interface (see :mod:`raco_cli.methods.base`).

The registry names where each method lives; nothing is imported until :func:`get` (torch
stays out of ``raco --help``).  The top-level modules are what every family uses (the
interface, privacy planning, per-sample gradients, training pieces, the batched engine); the
families are ``sgda/`` (the SGDA loop and the ERM methods on it), ``dro/`` (the DRO methods),
:mod:`.dp_fermi` and :mod:`.dpse`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from raco_cli.errors import unknown_name

if TYPE_CHECKING:
    from raco_cli.methods.base import Method

DRO_METHODS = ("dp_double_spider", "dp_recursive_spider", "dp_sgda", "dp_private_diff", "spider")

# name -> "module" (a method module) or "module:attribute" (a method object, e.g. the DRO
# family's DroMethod); either has the attributes of raco_cli.methods.base
METHODS: dict[str, str] = {
    "raco_dp": "raco_cli.methods.sgda.raco_dp",
    "dp_sgd": "raco_cli.methods.sgda.dp_sgd",
    "sgd": "raco_cli.methods.sgda.sgd",
    "sgda": "raco_cli.methods.sgda.sgda",
    "dp_fermi": "raco_cli.methods.dp_fermi",
    "dpse": "raco_cli.methods.dpse",
    **{name: f"raco_cli.methods.dro.methods:{name}" for name in DRO_METHODS},
}
# the objectives each method optimises (``objective=<name>``; absent: erm only) and the
# methods with a random-iterate output (``method.selection=random``); static, so the config
# layer checks them without importing torch
OBJECTIVES: dict[str, tuple[str, ...]] = {
    "sgda": ("erm", "dro"),
    **dict.fromkeys(DRO_METHODS, ("dro",)),
}
RANDOM_ITERATE = DRO_METHODS
# the methods with ``fit_many`` (the batched engine, docs/batched.md); static, so the sweeper
# groups a sweep's jobs without importing torch (~2 s of every sweep command; a test checks it
# against the modules)
BATCHED = ("raco_dp", "dp_sgd", "sgd", "sgda", "dp_fermi")


def objectives_of(name: str) -> tuple[str, ...]:
    return OBJECTIVES.get(name, ("erm",))


def get(name: str) -> Method:
    """The method registered under ``name``: a module, or an object with the same attributes.

    Raises:
        ConfigError: unknown method (the message lists the available ones).
    """
    if name not in METHODS:
        raise unknown_name("method", name, METHODS)
    module, _, attribute = METHODS[name].partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found
