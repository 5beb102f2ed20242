"""A trained ``dataset=table`` model as a self-contained artifact, and predictions with it.

The artifact is a directory with two files:

* ``predictor.json``: the table's schema (:class:`raco_cli.data.schema.TableSchema`: label
  rule, sensitive groups, every feature column's public bounds or level list, or under
  ``scope=paper`` the training part's statistics), the run's DP standardisation (the noisy
  mean/std of ``dataset.preprocessing=dp``, an accounted release), the model's name, options
  and shape, and public facts about the run (method, eps, scope, test accuracy);
* ``model.pt``: the state dict of the reported checkpoint.

Under ``privacy.scope=model`` everything in it is public configuration, an accounted release
or held-out test evaluation (docs/privacy.md), so it may be shared like the model.  A run
directory holds it inside an MLflow model (``<run_dir>/model/artifacts/predictor/``, see
:mod:`raco_cli.tracking.model_artifact`); :func:`find` accepts any of these directories.

Predictions encode new rows with the same code as training (:meth:`TableEncoder.encode`,
:func:`raco_cli.privacy.preprocessing.scale_rows`) and compute logits with the training
evaluation's own function (:func:`raco_cli.methods.training.predict_logits`), so on the same
device a run's test rows get the very predictions its test metrics were computed from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from raco_cli.data.schema import TableSchema
from raco_cli.errors import DataIntegrityError, DataNotFoundError

FORMAT = "raco-table-predictor"
VERSION = 1
PREDICTOR_FILE = "predictor.json"
WEIGHTS_FILE = "model.pt"
ARTIFACT_DIR = "model"  # in the run directory (an MLflow model directory)
PREDICTOR_SUBDIR = ("artifacts", "predictor")  # where MLflow keeps the artifact inside it
PREDICTED, PROBABILITY, GROUP = "predicted", "prob_", "group"


@dataclass(frozen=True)
class Prediction:
    """Predictions for a table.

    Attributes:
        frame: ``predicted`` (class name), ``prob_<class>`` per class and, when the
            sensitive columns are present, ``group`` (empty for a missing/unknown value).
        counts: column -> rule (``missing``, ``clipped``, ``unknown``) -> rows affected.
        accuracy: accuracy on the rows with a known label when the label column is present.
        labelled: rows with a known label (0 without the label column).
        group_unknown, group_missing: rows whose sensitive value is outside the model's
            groups, or missing (their ``group`` is empty).
        report: with the label column, the per-group report (:meth:`Predictor.report`).
    """

    frame: pd.DataFrame
    counts: dict[str, dict[str, int]]
    accuracy: float | None
    labelled: int
    group_unknown: int = 0
    group_missing: int = 0
    report: dict[str, Any] | None = None


class _Rows:
    """The part of :class:`~raco_cli.data.types.TabularData` that ``predict_logits`` reads."""

    def __init__(self, X: np.ndarray, n_classes: int) -> None:
        self.X, self.n_classes, self.input_shape = X, n_classes, tuple(X.shape[1:])

    def rows(self, idx: np.ndarray) -> np.ndarray:
        return self.X[idx]


@dataclass(frozen=True)
class Predictor:
    """Schema + standardisation + model (module docstring)."""

    schema: TableSchema
    feature_names: tuple[str, ...]
    class_names: tuple[str, ...]
    group_names: tuple[str, ...]
    scaling: tuple[tuple[float, ...], tuple[float, ...]] | None
    model: Mapping[str, Any]
    micro_batch: int
    run: Mapping[str, Any]
    state_dict: Mapping[str, Any]

    @classmethod
    def from_run(cls, data: Any, *, model: Mapping[str, Any], state_dict: Mapping[str, Any], micro_batch: int,
                 run: Mapping[str, Any]) -> Predictor:
        """The artifact of a trained run on ``dataset=table`` (``data.meta["schema"]``; the
        DP standardisation, if any, in ``data.meta["dp_scaling"]``)."""
        schema: TableSchema = data.meta["schema"]
        dp = data.meta.get("dp_scaling")
        scaling = None
        if dp:
            names = data.feature_names[: len(dp)]
            scaling = (tuple(float(dp[n]["mean"]) for n in names), tuple(float(dp[n]["std"]) for n in names))
        return cls(schema, tuple(data.feature_names), tuple(data.class_names), tuple(data.group_names), scaling,
                   dict(model), int(micro_batch), dict(run), dict(state_dict))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "schema": self.schema.to_dict(),
            "feature_names": list(self.feature_names),
            "class_names": list(self.class_names),
            "group_names": list(self.group_names),
            # dataset.preprocessing=dp: the noisy mean/std of u = (x + 1) / 2 for the leading
            # numeric columns (raco_cli/privacy/preprocessing.py), an accounted release
            "standardisation": None if self.scaling is None else {
                "columns": list(self.feature_names[: len(self.scaling[0])]), "mean": list(self.scaling[0]), "std": list(self.scaling[1])},
            "model": {**dict(self.model), "n_features": len(self.feature_names), "n_classes": len(self.class_names),
                      "micro_batch": self.micro_batch},
            "run": dict(self.run),
        }

    def save(self, directory: Path) -> Path:
        """Write ``predictor.json`` and ``model.pt`` into ``directory``."""
        import torch

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / PREDICTOR_FILE).write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")
        torch.save(dict(self.state_dict), directory / WEIGHTS_FILE)
        return directory

    @classmethod
    def load(cls, directory: Path) -> Predictor:
        """Read an artifact directory (the one holding ``predictor.json``).

        Raises:
            DataIntegrityError: the files are not a raco predictor of this version.
        """
        import torch

        directory = Path(directory)
        try:
            raw = json.loads((directory / PREDICTOR_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise DataIntegrityError(f"Cannot read {directory / PREDICTOR_FILE}: {exc}.") from None
        if raw.get("format") != FORMAT or raw.get("version") != VERSION:
            raise DataIntegrityError(f"{directory / PREDICTOR_FILE} is not a raco predictor of version {VERSION} "
                                     f"(format {raw.get('format')!r}, version {raw.get('version')!r}).")
        try:
            state = torch.load(directory / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, ValueError) as exc:
            raise DataIntegrityError(f"Cannot read the weights {directory / WEIGHTS_FILE}: {str(exc).splitlines()[0]}.") from None
        model = dict(raw["model"])
        micro_batch = int(model.pop("micro_batch"))
        model.pop("n_features"), model.pop("n_classes")
        std = raw.get("standardisation")
        scaling = None if std is None else (tuple(std["mean"]), tuple(std["std"]))
        schema = TableSchema.from_dict(raw["schema"])
        if schema.encoder.feature_names != tuple(raw["feature_names"]):
            raise DataIntegrityError(f"{directory / PREDICTOR_FILE}: its schema encodes features {list(schema.encoder.feature_names)[:5]}..., "
                                     f"the model was trained on {raw['feature_names'][:5]}...; the file was edited or damaged.")
        return cls(schema, tuple(raw["feature_names"]), tuple(raw["class_names"]), tuple(raw["group_names"]), scaling,
                   model, micro_batch, dict(raw.get("run", {})), state)

    def features(self, df: pd.DataFrame, *, where: str = "the input") -> tuple[np.ndarray, dict[str, dict[str, int]]]:
        """Model inputs ``(n, d)`` float32 for the rows of ``df``, and the rule counts.

        Raises:
            DataIntegrityError: a feature column is absent, or a numeric one holds text.
        """
        needed = self.schema.feature_columns
        absent = [c for c in needed if c not in df.columns]
        if absent:
            raise DataIntegrityError(
                f"{where} lacks the column(s) {', '.join(repr(c) for c in absent)} that the model was trained on; "
                f"it needs {', '.join(needed)} (the label and sensitive columns are optional)."
            )
        encoded = self.schema.encoder.encode(df, na_values=self.schema.na_values, where=where,
                                             fix="the model was trained on numbers in this column; fix the file, or leave the cell empty "
                                                 "(a missing value).")
        X = encoded.X
        if self.scaling is not None:
            from raco_cli.privacy.preprocessing import scale_rows

            missing = np.stack([encoded.masks[c.name]["missing"] for c in self.schema.encoder.numeric], axis=1)
            X = scale_rows(X, np.asarray(self.scaling[0]), np.asarray(self.scaling[1]), missing)
        counts = {col: {k: int(m.sum()) for k, m in kinds.items() if m.any()} for col, kinds in encoded.masks.items()}
        return X, {c: v for c, v in counts.items() if v}

    def logits(self, X: np.ndarray) -> np.ndarray:
        """Logits ``(n, K)`` float64 on the CPU, by the training evaluation's code path."""
        import torch

        from raco_cli import models
        from raco_cli.methods.gradients import engine_for
        from raco_cli.methods.training import EVAL_CHUNK, predict_logits

        net = models.build(str(self.model["name"]), input_shape=(len(self.feature_names),), n_classes=len(self.class_names),
                           options=dict(self.model))
        try:
            net.load_state_dict(dict(self.state_dict))
        except RuntimeError as exc:
            raise DataIntegrityError(f"The weights do not fit model={self.model['name']}: {str(exc).splitlines()[0]}.") from None
        net.eval()
        engine = engine_for(net, micro_batch=self.micro_batch, eval_chunk=min(EVAL_CHUNK, 4 * self.micro_batch))
        rows = _Rows(X, len(self.class_names))
        return predict_logits(engine, cast(Any, rows), np.arange(len(X)), torch.device("cpu"))

    def predict(self, df: pd.DataFrame, *, where: str = "the input") -> Prediction:
        """Predicted class, class probabilities and group of every row of ``df``."""
        X, counts = self.features(df, where=where)
        logits = self.logits(X)
        pred = logits.argmax(axis=1)  # as the training evaluation (raco_cli.metrics.evaluate)
        prob = softmax_rows(logits)
        frame = pd.DataFrame({PREDICTED: np.asarray(self.class_names, dtype=object)[pred]})
        for k, column in enumerate(probability_columns(self.class_names)):
            frame[column] = prob[:, k]
        groups = self.schema.groups
        g = np.full(len(df), -1, dtype=np.int64)
        unknown = missing = 0
        if all(c in df.columns for c in groups.columns):
            g, g_missing, g_unknown = groups.index(df, na_values=self.schema.na_values)
            names = np.asarray([*self.group_names, ""], dtype=object)
            frame[GROUP] = names[np.where(g < 0, len(self.group_names), g)]
            unknown, missing = int(g_unknown.sum()), int((g_missing & ~g_unknown).sum())
        accuracy, labelled, report = None, 0, None
        if self.schema.target.column in df.columns:
            y, _, _ = self.schema.target.classes(df, na_values=self.schema.na_values, where=where)
            known = y >= 0
            labelled = int(known.sum())
            if labelled:
                accuracy = float((pred[known] == y[known]).mean())
                report = self.report(logits, y, g)
        return Prediction(frame=frame, counts=counts, accuracy=accuracy, labelled=labelled, group_unknown=unknown,
                          group_missing=missing, report=report)

    def report(self, logits: np.ndarray, y: np.ndarray, group: np.ndarray) -> dict[str, Any]:
        """Accuracy, rates per group and the run's constraint on labelled rows: ``logits``
        (n, K), ``y`` class per row (-1: no known label), ``group`` (-1: no known group).

        The constraint is rebuilt from the run's ``constraint_families`` (its public
        configuration) and evaluated with the training evaluation's own code
        (:func:`raco_cli.metrics.evaluate.evaluate`) on the rows with a known label and group."""
        from raco_cli.constraints import build_parts, part_spec
        from raco_cli.metrics.evaluate import evaluate

        labelled = y >= 0
        both = labelled & (group >= 0)
        pred = logits.argmax(axis=1)
        out: dict[str, Any] = {
            "rows": int(len(y)), "labelled": int(labelled.sum()),
            "accuracy": float((pred[labelled] == y[labelled]).mean()) if labelled.any() else None,
            "rows_with_group": int(both.sum()), "groups": {}, "constraint": None,
        }
        if not both.any():
            return out
        families = self.run.get("constraint_families") or {}
        parts = [part_spec(f, dict(opts), key=f"constraint.families.{f}") for f, opts in families.items()]
        cons = build_parts(parts, n_classes=len(self.class_names), n_groups=len(self.group_names),
                           class_names=self.class_names, group_names=self.group_names)
        m = evaluate(logits[both], y[both], group[both], constraints=cons, temperature=1.0, group_names=self.group_names,
                     class_names=self.class_names)
        yb, gb, pb = y[both], group[both], pred[both]
        binary = len(self.class_names) == 2
        for z, name in enumerate(self.group_names):
            rows = gb == z
            entry: dict[str, Any] = {"rows": int(rows.sum())}
            if rows.any():
                entry["accuracy"] = float((pb[rows] == yb[rows]).mean())
                entry["predicted"] = {c: float((pb[rows] == k).mean()) for k, c in enumerate(self.class_names)}
                if binary:
                    pos, neg = rows & (yb == 1), rows & (yb == 0)
                    entry["tpr"] = float((pb[pos] == 1).mean()) if pos.any() else None
                    entry["fpr"] = float((pb[neg] == 1).mean()) if neg.any() else None
            out["groups"][name] = entry
        out["fairness"] = {k: m[k] for k in ("dp_gap", "eo_gap", "eop_gap", "fnr", "fpr") if k in m}
        if not cons.is_empty:
            out["constraint"] = {
                "name": self.run.get("constraint"), "families": m["constraints"], "max_hard": m["constraint_max_hard"],
                "max_violation_hard": m["violation_hard"], "satisfied": m["satisfied"],
            }
        return out


def find(path: Path) -> Path:
    """The artifact directory (holding ``predictor.json``) of a run directory, of its MLflow
    model directory, or the artifact directory itself.

    Raises:
        DataNotFoundError: no artifact there (the message says why: e.g. a run of another dataset).
    """
    path = Path(path)
    for candidate in (path, path.joinpath(*PREDICTOR_SUBDIR), path.joinpath(ARTIFACT_DIR, *PREDICTOR_SUBDIR)):
        if (candidate / PREDICTOR_FILE).is_file():
            return candidate
    summary = path / "summary.json"
    if summary.is_file():
        try:
            written = json.loads(summary.read_text())
        except ValueError:
            written = {}
        if "predictor" not in written:
            raise DataNotFoundError(f"{path} is a run of dataset={written.get('dataset')}, which keeps no predictor artifact; raco "
                                    "predict applies models trained with dataset=table (docs/your-own-data.md).")
    raise DataNotFoundError(f"No raco model in {path}: expected a run directory of dataset=table (with model/), its model/ "
                            f"directory, or a directory holding {PREDICTOR_FILE}.")


def probability_columns(class_names: Sequence[str]) -> list[str]:
    """``prob_<class>`` for each class, blanks replaced by ``_`` (``not good`` -> ``prob_not_good``),
    made unique with a ``_<k>`` suffix where two classes would share a name.

    >>> probability_columns(["not good", "good"]), probability_columns(["a b", "a_b"])
    (['prob_not_good', 'prob_good'], ['prob_a_b', 'prob_a_b_1'])
    """
    out: list[str] = []
    for k, name in enumerate(class_names):
        column = PROBABILITY + re.sub(r"\s+", "_", str(name).strip())
        out.append(column if column not in out else f"{column}_{k}")
    return out


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax (numerically stable).

    >>> softmax_rows(np.array([[0.0, np.log(3.0)]])).round(3).tolist()
    [[0.25, 0.75]]
    """
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def run_facts(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Public facts about a run for the artifact, taken from its *released* summary (so the
    scope's filter applies: ``raco_cli/tracking/summary.py`` STATUS)."""
    keys: Sequence[str] = ("method", "dataset", "constraint", "gamma", "constraint_families", "eps_target", "eps_spent", "delta",
                           "steps", "selected_step", "privacy_scope", "preprocessing", "config_hash", "seed")
    out = {k: summary[k] for k in keys if k in summary}
    test = (summary.get("metrics") or {}).get("test") or {}
    if "accuracy" in test:
        out["test_accuracy"] = test["accuracy"]
    return out
