"""``raco_cli.RacoClassifier``: a private, fair classifier with scikit-learn's interface.

``RacoClassifier(constraint="dp", gamma=0.05, eps=1).fit(X, y, sensitive_features=A)`` is
``raco train dataset=table`` on the table (X, y, A) (docs/your-own-data.md): the same schema
rules, split (train / validation / held-out test), private estimates, training, certificate and
records, under the same privacy scope (``model``: eps covers the model and everything the run
writes).  The table is declared, not described from the data: every column of X is a feature,
numeric unless it holds strings or categories; numeric bounds and category levels are yours to
declare public (``bounds``, ``levels``) or are estimated privately inside eps (the default
``private``); the classes and the groups are ``classes`` / ``groups`` when given, else the values
present in ``y`` and ``sensitive_features`` (treated as public facts, as a declared label list
is).  The run's directory stays in :attr:`RacoClassifier.run_dir_` (a temporary directory
unless ``output_dir`` is given); the copy of the table written for the run is deleted after it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raco_cli.errors import ConfigError

try:  # scikit-learn is a dependency; the import stays local to this module
    from sklearn.base import BaseEstimator, ClassifierMixin
except ImportError:  # pragma: no cover - scikit-learn missing
    BaseEstimator = ClassifierMixin = object  # type: ignore[assignment, misc]

LABEL, GROUP = "__raco_label__", "__raco_group__"


class RacoClassifier(ClassifierMixin, BaseEstimator):  # type: ignore[misc]
    """A differentially private classifier under rate constraints (RaCO-DP and its baselines).

    Args:
        method: ``raco_dp`` (default), ``dp_sgd``, ``dp_fermi``, ``dpse``, ``sgd``, ``sgda``.
        constraint: ``dp``, ``eo``, ``fnr``, ... (``conf/constraint``), ``none``.
        gamma: the allowed gap of each rate constraint.
        eps, delta: the privacy budget of the whole fit (everything it writes).
        confidence: ``auto`` (0.9 under scope=model), ``None`` (train against gamma) or a
            probability: hold gamma on new data with at least that probability.
        scope: ``model`` (default) or ``paper`` (the paper's protocol: eps covers training only).
        bounds: column -> ``[lo, hi]`` public bounds of a numeric column, or ``private``
            (estimated inside eps); columns not named are ``private``.
        levels: column -> public level list of a categorical column, or ``private``.
        classes: the public class labels (default: the values of ``y``).
        groups: the public values of the sensitive feature (default: those in it).
        seed: the run seed (model initialisation; noise and batches are secret under scope=model).
        overrides: more ``raco train`` overrides (``["method.batch_size=256"]``).
        output_dir: where the run writes (default: a new temporary directory).
        tracking: record the run in MLflow (``output_dir``/mlflow.db).
    """

    def __init__(self, method: str = "raco_dp", constraint: str = "dp", gamma: float = 0.05, eps: float = 1.0, delta: float = 1e-5,
                 confidence: float | str | None = "auto", scope: str = "model", bounds: Mapping[str, Any] | None = None,
                 levels: Mapping[str, Any] | None = None, classes: Sequence[Any] | None = None, groups: Sequence[Any] | None = None,
                 seed: int = 0, overrides: Sequence[str] = (), output_dir: str | None = None, tracking: bool = False) -> None:
        self.method = method
        self.constraint = constraint
        self.gamma = gamma
        self.eps = eps
        self.delta = delta
        self.confidence = confidence
        self.scope = scope
        self.bounds = bounds
        self.levels = levels
        self.classes = classes
        self.groups = groups
        self.seed = seed
        self.overrides = overrides
        self.output_dir = output_dir
        self.tracking = tracking

    # --- scikit-learn's interface ------------------------------------------------------------

    def fit(self, X: Any, y: Any, *, sensitive_features: Any = None) -> RacoClassifier:
        """Train on (X, y) with the groups ``sensitive_features`` (one group when None: no
        rate constraint applies then, ``constraint`` must be ``none``).

        Raises:
            RacoError: what ``raco train`` would refuse (one line: bad settings, a budget the
                table cannot support, too few rows).
        """
        import pandas as pd
        from sklearn.utils.multiclass import check_classification_targets
        from sklearn.utils.validation import validate_data

        from raco_cli.api import train

        # scikit-learn's checks of X and y (shapes, sparse or complex input, a continuous
        # target); they set n_features_in_ and feature_names_in_
        checked, y = validate_data(self, X, y, dtype=None, ensure_all_finite="allow-nan")
        check_classification_targets(y)
        frame = self._features(X if hasattr(X, "columns") else checked)
        classes = list(self.classes) if self.classes is not None else sorted(pd.unique(y).tolist())
        if len(classes) < 2:
            raise ConfigError(f"y holds {len(classes)} class ({classes}); a classifier needs at least two (pass classes=[...]).")
        group = np.zeros(len(y), dtype=np.int64) if sensitive_features is None else np.asarray(sensitive_features)
        if group.ndim != 1 or len(group) != len(frame):
            raise ConfigError(f"sensitive_features must be one value per row of X (got shape {group.shape}); pass a 1-D array or Series.")
        if sensitive_features is None and self.constraint != "none":
            raise ConfigError(f"constraint={self.constraint!r} needs sensitive_features (the groups it constrains); pass "
                              "fit(X, y, sensitive_features=A), or constraint='none'.")
        groups = list(self.groups) if self.groups is not None else sorted(pd.unique(group).tolist())
        table = frame.assign(**{LABEL: [str(v) for v in y], GROUP: [str(v) for v in group]})
        root = Path(self.output_dir) if self.output_dir is not None else Path(tempfile.mkdtemp(prefix="raco-classifier-"))
        conf = root / "conf" / "dataset"
        conf.mkdir(parents=True, exist_ok=True)
        data_file = root / "table.parquet"
        table.to_parquet(data_file, index=False)
        try:
            (conf / "raco_classifier.yaml").write_text(self._dataset_yaml(frame, data_file, classes, groups))
            run_dir = root / "run"
            result = train(self._overrides(root), config_dir=root / "conf", run_dir=run_dir)
        finally:
            data_file.unlink(missing_ok=True)  # the run's records stay; the copy of your data does not
        self.result_ = result
        self.run_dir_ = result.run_dir
        self.classes_ = np.asarray(classes)
        self.eps_spent_ = result.eps_spent
        self.constraint_ = {"satisfied_on_test": result.satisfied, "confidence": result.summary.get("confidence"),
                            "test": {k: v for k, v in result.test.items() if k in ("constraints", "violation_hard", "satisfied")}}
        self.summary_ = result.summary
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities (n, K), columns in the order of :attr:`classes_`."""
        from sklearn.utils.validation import validate_data

        from raco_cli.predictor import Predictor, find, probability_columns

        self._check_fitted()
        checked = validate_data(self, X, reset=False, dtype=None, ensure_all_finite="allow-nan")  # (its features, as fitted)
        predictor = getattr(self, "_predictor", None)
        if predictor is None:
            predictor = self._predictor = Predictor.load(find(self.run_dir_))
        frame = self._features(X if hasattr(X, "columns") else checked)
        out = predictor.predict(frame.assign(**{GROUP: ""}), where="X").frame
        return out[probability_columns([str(c) for c in self.classes_])].to_numpy(dtype=np.float64)

    def predict(self, X: Any) -> np.ndarray:
        """Predicted classes (n,), labels from :attr:`classes_`."""
        self._check_fitted()
        return self.classes_[self.predict_proba(X).argmax(axis=1)]

    def __sklearn_tags__(self):  # noqa: ANN204 - scikit-learn's Tags (sklearn >= 1.6)
        tags = super().__sklearn_tags__()
        tags.non_deterministic = True  # secret noise and batches under scope=model
        tags.input_tags.allow_nan = True  # a missing value is imputed or its row dropped (options.missing)
        tags.input_tags.string = True  # categorical columns of a DataFrame
        return tags

    # --- the table ---------------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "result_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("This RacoClassifier is not fitted yet; call fit(X, y, sensitive_features=A) first.")

    def _features(self, X: Any):  # noqa: ANN202 - a pandas DataFrame
        """X as a DataFrame: its own columns (pandas), or ``x0 .. x{d-1}`` (arrays)."""
        import pandas as pd

        if isinstance(X, pd.DataFrame):
            frame = X.reset_index(drop=True)
            frame.columns = [str(c) for c in frame.columns]
        else:
            arr = np.asarray(X)
            if arr.ndim != 2:
                raise ConfigError(f"X must be 2-D (rows x features), got shape {arr.shape}; reshape a single feature with X.reshape(-1, 1).")
            frame = pd.DataFrame(arr, columns=[f"x{j}" for j in range(arr.shape[1])])
        if {LABEL, GROUP} & set(frame.columns):
            raise ConfigError(f"X has a column named {LABEL!r} or {GROUP!r}, the names RacoClassifier gives y and the groups; rename it.")
        return frame

    def _dataset_yaml(self, frame: Any, data_file: Path, classes: list[Any], groups: list[Any]) -> str:
        """The dataset config of the table: every type, bound and level declared."""
        import pandas as pd
        import yaml

        bounds, levels = dict(self.bounds or {}), dict(self.levels or {})
        types: dict[str, str] = {}
        for col in frame.columns:
            numeric = pd.api.types.is_numeric_dtype(frame[col]) and not pd.api.types.is_bool_dtype(frame[col])
            types[col] = "numeric" if numeric else "categorical"
            if numeric:
                bounds.setdefault(col, "private")
            else:
                levels.setdefault(col, "private")
        unknown = sorted(set(bounds) - set(frame.columns)) + sorted(set(levels) - set(frame.columns))
        if unknown:
            raise ConfigError(f"bounds/levels name columns X does not have: {unknown}; X's columns are {list(frame.columns)[:10]}.")
        config = {
            "defaults": ["table", "_self_"],
            "options": {
                "path": str(data_file), "label": LABEL, "sensitive": [GROUP], "features": list(frame.columns), "types": types,
                "levels": {**{k: v if v == "private" else [str(x) for x in v] for k, v in levels.items()},
                           LABEL: [str(c) for c in classes], GROUP: [str(g) for g in groups]},
                "class_names": [str(c) for c in classes], "name": "raco_classifier",
            },
            "bounds": {k: v if v == "private" else [float(v[0]), float(v[1]), *v[2:]] for k, v in bounds.items()},
        }
        return yaml.safe_dump(config, sort_keys=False)

    def _overrides(self, root: Path) -> list[str]:
        from raco_cli.api import hydra_value

        # (the batch size from the table's size, raco train's default for every method)
        out = [f"method={self.method}", f"constraint={self.constraint}", "dataset=raco_classifier", "method.batch_size=auto",
               f"eps={hydra_value(self.eps)}",
               f"delta={hydra_value(self.delta)}", f"seed={int(self.seed)}", f"privacy.scope={self.scope}",
               f"constraint.confidence={hydra_value(self.confidence)}"]
        if self.constraint != "none":
            out.append(f"constraint.gamma={hydra_value(self.gamma)}")
        if self.tracking:
            out.append(f"tracking.uri=sqlite:///{root / 'mlflow.db'}")
        else:
            out.append("tracking=none")
        return [*out, *self.overrides]

