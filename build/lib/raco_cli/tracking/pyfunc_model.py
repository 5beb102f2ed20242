"""MLflow entry point of a ``dataset=table`` model (MLflow "models from code").

MLflow copies this file into the model directory and runs it when the model is loaded
(``mlflow.pyfunc.load_model("models:/<id>")``); it needs raco installed.  The model's
``predict`` takes a DataFrame with the training table's feature columns (and, optionally,
the sensitive ones) and returns the predicted class, the class probabilities and the group,
as ``raco predict`` writes them (:mod:`raco_cli.predictor`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class RacoTableModel(PythonModel):
    """A :class:`raco_cli.predictor.Predictor` behind MLflow's pyfunc interface."""

    def load_context(self, context: Any) -> None:
        from raco_cli.predictor import Predictor

        self.predictor = Predictor.load(Path(context.artifacts["predictor"]))

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return self.predictor.predict(pd.DataFrame(model_input)).frame


mlflow.models.set_model(RacoTableModel())
