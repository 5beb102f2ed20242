"""raco: differentially private learning under rate constraints (RaCO-DP and baselines).

The Python interface (docs/python.md), imported on first use so that ``import raco_cli`` and
``raco --help`` stay instant:

* :func:`train` (``raco train`` from Python) -> :class:`Result`; :func:`load` reads a run back;
* :class:`RacoClassifier`: a scikit-learn estimator (``fit(X, y, sensitive_features=A)``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["RacoClassifier", "Result", "load", "train", "__version__"]

# (by name: the package is a leaf of the layers, tests/unit/test_architecture.py, and these two
# modules sit at the top)
_LAZY = {"train": "raco_cli.api", "load": "raco_cli.api", "Result": "raco_cli.api", "RacoClassifier": "raco_cli.estimator"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'raco_cli' has no attribute {name!r}")
