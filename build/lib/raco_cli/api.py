"""raco from Python: ``raco_cli.train(...)`` and ``raco_cli.load(run_dir)`` (docs/python.md).

``train`` is ``raco train`` without the shell: the same configs (the packaged ``conf/`` and any
``config_dir``), the same validation and one-line errors, the same run (summary.json, model,
MLflow record), the same privacy scope.  It returns a :class:`Result`; ``load`` reads one back
from a run directory.  Sweeps, figures and the private search stay command-line tools.

::

    import raco_cli
    res = raco_cli.train(["dataset=adult", "constraint=dp", "eps=1"])
    res.eps_spent, res.test["accuracy"], res.satisfied
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raco_cli.errors import ConfigError


@dataclass
class Result:
    """A finished run: what it wrote to ``run_dir``.

    Attributes:
        run_dir: the run directory (summary.json, config.yaml, model.pt; a table's
            predictor.json).
        summary: summary.json (docs/methods.md: every key and what eps covers it).
        config: the resolved config of the run (config.yaml).
    """

    run_dir: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    _model: Any = field(default=None, repr=False)

    @property
    def eps_spent(self) -> float | None:
        """The epsilon the run spent (its whole accounted release; <= the target); None for a
        non-private method."""
        value = self.summary.get("eps_spent")
        return None if value is None else float(value)

    @property
    def test(self) -> dict[str, Any]:
        """The released model's metrics on the held-out test split."""
        return dict(self.summary["metrics"]["test"])

    @property
    def satisfied(self) -> bool | None:
        """Whether the released model meets every rate constraint on the test split."""
        return self.summary.get("satisfied")

    @property
    def model(self) -> Any:
        """The released model (a ``torch.nn.Module`` in eval mode), its weights from model.pt."""
        if self._model is None:
            self._model = _rebuild_model(self.config, self.run_dir / "model.pt")
        return self._model

    def predict_proba(self, X: Any) -> Any:
        """Class probabilities (n, K) of rows already in the model's encoding (the dataset's
        features as raco encodes them; a user's raw table rows: ``raco predict``)."""
        import numpy as np
        import torch

        x = torch.as_tensor(np.asarray(X, dtype=np.float32))
        with torch.no_grad():
            return torch.softmax(self.model(x).double(), dim=1).numpy()

    def predict(self, X: Any) -> Any:
        """Predicted class indices (n,) (raco's rule: the first most probable class)."""
        return self.predict_proba(X).argmax(axis=1)


def train(overrides: Sequence[str] | Mapping[str, Any] = (), *, config_dir: str | Path | None = None,
          run_dir: str | Path | None = None) -> Result:
    """Run one ``raco train`` job from Python and return its :class:`Result`.

    Args:
        overrides: ``raco train``'s overrides (``["dataset=adult", "eps=1"]``) or a mapping of
            keys to values (``{"dataset": "adult", "constraint.gamma": 0.02}``).
        config_dir: a directory of your own config groups (``raco train --config-dir``).
        run_dir: where the run writes (default ``outputs/runs/<date>/<time>``, as ``raco train``;
            relative to the working directory).

    Raises:
        RacoError: bad config, missing data, an unreachable budget: the command line's one-line
            errors (``ConfigError``, ``DataNotFoundError``, ``PrivacyBudgetError``, ...).
    """
    from raco_cli.cli.job_config import plain_job
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.train import train as train_run

    args = [*(["--config-dir", str(config_dir)] if config_dir is not None else []), *_override_list(overrides)]
    cfg = plain_job(compose_config(args))  # (the run layer takes plain dicts, as from every command)
    out = Path(run_dir) if run_dir is not None else _new_run_dir()
    train_run(cfg, run_dir=out)
    return load(out)


def load(run_dir: str | Path) -> Result:
    """A finished run read back from its directory (summary.json, config.yaml, model.pt).

    Raises:
        ConfigError: ``run_dir`` holds no finished run.
    """
    import yaml

    path = Path(run_dir)
    summary = path / "summary.json"
    if not summary.is_file():
        raise ConfigError(f"run_dir={str(path)!r} holds no finished run (no summary.json); pass the directory a run wrote "
                          "(its summary line in the result table, or raco_cli.train(...).run_dir).")
    config = path / "config.yaml"
    return Result(run_dir=path, summary=json.loads(summary.read_text()),
                  config=(yaml.safe_load(config.read_text()) or {}) if config.is_file() else {})


def _override_list(overrides: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """Overrides as ``key=value`` strings (a mapping's values written as Hydra reads them)."""
    if isinstance(overrides, Mapping):
        return [f"{key}={hydra_value(value)}" for key, value in overrides.items()]
    if isinstance(overrides, str):
        raise ConfigError(f"overrides={overrides!r} must be a list of key=value strings or a mapping, not one string; "
                          f"e.g. raco_cli.train([{overrides!r}]).")
    return [str(o) for o in overrides]


def hydra_value(value: Any) -> str:
    """A Python value as a Hydra override value (``None`` -> null, lists -> [a,b])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return str(value)


def _new_run_dir() -> Path:
    """``outputs/runs/<date>/<time with microseconds>``: conf/hydra/default.yaml's run directory."""
    now = _dt.datetime.now()
    return Path("outputs") / "runs" / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S-%f")


def _rebuild_model(config: Mapping[str, Any], weights: Path) -> Any:
    """The run's model with its weights: built as the run built it (``config["model"]``), its
    input size read from the weights (the first linear layer's columns, or an image model's
    input of the dataset's images)."""
    import torch

    from raco_cli import models

    state = torch.load(weights, map_location="cpu", weights_only=True)
    model_cfg = dict(config.get("model") or {"name": "logreg"})
    name = str(model_cfg.get("name", "logreg"))
    linear = [v for k, v in state.items() if k.endswith("weight") and v.dim() == 2]
    n_classes = int(next(v for k, v in reversed(list(state.items())) if k.endswith("weight")).shape[0])
    if name in ("logreg", "linear", "mlp") and linear:
        input_shape: tuple[int, ...] = (int(linear[0].shape[1]),)
    else:
        size = int(((config.get("dataset") or {}).get("options") or {}).get("image_size", 64))
        input_shape = (3, size, size)
    model = models.build(name, input_shape=input_shape, n_classes=n_classes, options=model_cfg)
    model.load_state_dict(state)
    return model.eval()
