"""The run directory's ``model/``: a ``dataset=table`` predictor as an MLflow model.

``<run_dir>/model/`` is an MLflow pyfunc model directory (``MLmodel`` with the signature,
``requirements.txt``, the entry point :mod:`raco_cli.tracking.pyfunc_model`) whose
``artifacts/predictor/`` holds the self-contained artifact (:mod:`raco_cli.predictor`).  The
same directory is logged to MLflow as a logged model of the run
(:meth:`raco_cli.tracking.mlflow_store.RunRecorder.log_model`), from where ``raco predict``
fetches it back (:func:`logged_model_location`, :func:`download`).  No input example is saved:
it would be rows of the training data.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from raco_cli.data.schema import NumericColumn
from raco_cli.errors import OutputError
from raco_cli.predictor import GROUP, PREDICTED, Predictor, probability_columns

ENTRY_POINT = Path(__file__).with_name("pyfunc_model.py")


def signature(predictor: Predictor) -> Any:
    """Inputs: the feature columns (numeric: double, others: string) and, optional, the
    sensitive ones; outputs: predicted class, one probability per class, the group."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    schema = predictor.schema
    inputs: list[Any] = [ColSpec("double" if isinstance(c, NumericColumn) else "string", c.name) for c in schema.encoder.columns]
    inputs += [ColSpec("string", c, required=False) for c in schema.groups.columns if c not in schema.feature_columns]
    outputs: list[Any] = [ColSpec("string", PREDICTED)] + [ColSpec("double", c) for c in probability_columns(predictor.class_names)]
    outputs.append(ColSpec("string", GROUP, required=False))
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))


def requirements() -> list[str]:
    import numpy
    import pandas
    import torch

    return [f"torch=={torch.__version__.split('+')[0]}", f"pandas=={pandas.__version__}", f"numpy=={numpy.__version__}"]


def save(predictor: Predictor, target: Path) -> Path:
    """Write ``target`` (an MLflow model directory holding the predictor artifact)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per local copy otherwise
    import mlflow.pyfunc

    target = Path(target)
    if target.exists():  # a run repeated into the same run directory
        if not (target / "MLmodel").is_file():
            raise OutputError(f"Cannot write the model to {target}: it exists and is not an MLflow model directory. "
                              "Choose another run directory with hydra.run.dir=<dir>.")
        shutil.rmtree(target)
    with tempfile.TemporaryDirectory() as tmp:
        artifact = predictor.save(Path(tmp) / "predictor")
        with warnings.catch_warnings():  # no input example, on purpose (module docstring)
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            mlflow.pyfunc.save_model(
                path=str(target), python_model=str(ENTRY_POINT), artifacts={"predictor": str(artifact)},
                signature=signature(predictor), pip_requirements=requirements(),
                metadata={"raco": "needs raco installed (pip install -e <raco checkout>); raco predict reads artifacts/predictor"},
            )
    return target


def logged_model_location(source: str, uri: str) -> str:
    """The artifact location of an MLflow 3 logged model named by ``models:/<model_id>`` or
    ``runs:/<run_id>/<name>``, looked up through this store's client (MLflow resolves those
    URIs through its global tracking URI otherwise); any other URI unchanged."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri, registry_uri=uri)
    if source.startswith("models:/m-"):
        return str(client.get_logged_model(source[len("models:/"):].strip("/")).artifact_location)
    if source.startswith("models:/"):  # a registered model: models:/<name>/<version or @alias>
        name, _, version = source[len("models:/"):].strip("/").partition("/")
        alias = version.lstrip("@")
        mv = client.get_model_version(name, version) if version.isdigit() else client.get_model_version_by_alias(name, alias)
        return logged_model_location(str(mv.source), uri) if str(mv.source) != source else str(mv.source)
    if source.startswith("runs:/"):
        run_id, _, name = source[len("runs:/"):].partition("/")
        run = client.get_run(run_id)
        found = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run_id}' AND name = '{name}'")
        if found:
            return str(found[0].artifact_location)
    return source


def download(location: str, uri: str, dst: str) -> Path:
    """The artifacts at the MLflow URI ``location`` of the store ``uri``, copied into ``dst``."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per download otherwise
    import mlflow.artifacts

    return Path(mlflow.artifacts.download_artifacts(artifact_uri=location, tracking_uri=uri, dst_path=dst))
