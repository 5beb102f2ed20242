"""The MLflow store a command reads when it is given none: ``conf/tracking/mlflow.yaml``'s ``uri``
(``raco figures``, ``raco report`` and the report after ``raco tune privacy.scope=paper``)."""

from __future__ import annotations

from raco_cli.cli.paths import CONF_DIR


def default_uri() -> str:
    """``tracking.uri`` of ``conf/tracking/mlflow.yaml`` (relative to the working directory)."""
    import yaml

    return str(yaml.safe_load((CONF_DIR / "tracking" / "mlflow.yaml").read_text())["uri"])
