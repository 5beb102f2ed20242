"""Method specs as the unit tests were written: the paper's protocol with seeded randomness, and
the settings a bare :class:`~raco_cli.methods.base.MethodSpec` held before its defaults came
from the packaged configs (2026-12-01; :mod:`raco_cli.defaults`).

``MethodSpec(name=...)`` now is what ``raco train method=<name>`` builds (scope=model, secret
randomness, the method file's hyperparameters); the tests that check a mechanism on a small
problem keep the small settings they were tuned on, and say so by building their specs here.
"""

from __future__ import annotations

from typing import Any

from raco_cli.methods.base import MethodSpec

TEST_SETTINGS: dict[str, Any] = {
    "batch_size": 1024, "steps": None, "max_steps": 2000, "lr": 0.5, "optimizer": "sgd", "momentum": 0.9, "clip_norm": 1.0,
    "noise_multiplier": 1.0, "hist_noise_multiplier": 2.0, "calibrate_noise": False, "lr_dual": 0.1, "lambda_max": 10.0,
    "temperature": 1.0, "dual": "soft", "sampling": "independent", "denominator_floor": 1.0, "eval_every": 20,
    "selection": "best_feasible", "micro_batch": 4096, "secure_rng": False, "scope": "paper",
}


def paper_spec(**kwargs: Any) -> MethodSpec:
    """``MethodSpec(**kwargs)`` over :data:`TEST_SETTINGS` (what it is not given)."""
    return MethodSpec(**{**TEST_SETTINGS, **kwargs})
