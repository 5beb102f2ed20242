"""Hydra callbacks (registered in ``conf/hydra/default.yaml``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class CloseSweep(Callback):
    """At the end of a multirun, end its MLflow parent run (FINISHED, or FAILED when a job
    did not finish), so no sweep parent stays RUNNING forever."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        tracking: Any = config.get("tracking") or {}
        if not tracking.get("enabled") or not tracking.get("uri"):
            return
        try:
            from raco_cli.tracking.mlflow_store import close_sweep

            close_sweep(str(tracking.uri), Path(config.hydra.sweep.dir))
        except Exception as exc:  # noqa: BLE001 - closing the parent must not fail the sweep
            log.warning("Could not close the sweep's MLflow parent run: %s", exc)
