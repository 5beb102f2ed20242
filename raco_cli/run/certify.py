"""Certify a trained run's released model (``constraint.confidence``): its validation
prediction counts -> one accounted release (scope=model) -> the certificate -> the claim.

The statistics are in :mod:`raco_cli.constraints.certificate`, the release in
:mod:`raco_cli.privacy.certificate`; this module feeds them the released model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raco_cli.constraints.certificate import Certificate, certify, prediction_counts


class _ScaledRows:
    """A split's rows as the run's model reads them: a sweep group's public encoding with the
    run's DP standardisation applied (:func:`raco_cli.privacy.preprocessing.scale_rows`, the
    arithmetic :func:`~raco_cli.privacy.preprocessing.dp_standardize` uses)."""

    def __init__(self, data: Any, scaling: tuple[np.ndarray, np.ndarray]) -> None:
        self.data, self.scaling = data, scaling
        self.input_shape, self.n_classes = data.input_shape, data.n_classes
        missing = data.meta.get("numeric_missing")
        self.missing = None if missing is None else np.asarray(missing)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        from raco_cli.privacy.preprocessing import scale_rows

        X = np.asarray(self.data.rows(idx))
        return scale_rows(X, self.scaling[0], self.scaling[1], None if self.missing is None else self.missing[idx])


def released_predictions(prep: Any, state_dict: Any, split: str) -> np.ndarray:
    """The released model's hard predictions on ``split`` (the evaluation's prediction rule)."""
    import copy

    from raco_cli.methods.gradients import engine_for
    from raco_cli.methods.training import EVAL_CHUNK, predict_logits
    from raco_cli.metrics.evaluate import predictions

    model = copy.deepcopy(prep.model)
    model.load_state_dict(dict(state_dict))
    model.to(prep.device).eval()
    micro = int(prep.plan.spec.micro_batch)
    engine = engine_for(model, micro_batch=micro, eval_chunk=min(EVAL_CHUNK, 4 * micro))
    data: Any = prep.data if prep.scaling is None else _ScaledRows(prep.data, prep.scaling)  # (rows() is all it reads)
    idx = np.asarray(prep.data.splits[split])
    return predictions(predict_logits(engine, data, idx, prep.device))


def certificate_of(prep: Any, result: Any) -> Certificate | None:
    """The certificate of the run's released model, or None when the run does not certify
    (:func:`raco_cli.run.prepare.certifies`).  Under scope=model with a private method the
    counts are released with the noise its plan accounted; otherwise they are exact (records
    that hold exact statistics anyway).

    The union bound's N: the evaluated checkpoints when ``best_feasible`` chose among them
    (its choice reads the validation rows), else 1."""
    from raco_cli.privacy.certificate import noisy_counts
    from raco_cli.privacy.discrete import discrete_gaussian_for
    from raco_cli.privacy.mechanisms import noise_source
    from raco_cli.run.prepare import certifies

    spec, data = prep.spec, prep.data
    if not certifies(spec, prep.method, prep.constraints, data):
        return None
    requested = prep.requested if prep.requested is not None else prep.constraints
    val = np.asarray(data.splits["val"])
    counts = prediction_counts(requested, data.y[val], data.group[val], released_predictions(prep, result.state_dict, "val"))
    sigma = float(prep.plan.spec.certificate_noise)
    count_sd = 0.0
    if sigma > 0:
        counts = noisy_counts(counts, noise_multiplier=sigma, source=noise_source(prep.seeds.certificate, "cpu", secure=spec.secure_rng))
        count_sd = float(discrete_gaussian_for(sigma))
    candidates = len(result.history) if prep.plan.spec.selection == "best_feasible" else 1
    assert spec.constraint.confidence is not None
    return certify(requested, counts, confidence=spec.constraint.confidence, count_sd=count_sd, candidates=candidates)


def claim(found: Certificate | None, gamma: float) -> tuple[float | None, str | None]:
    """(the confidence the run may print, else None; the one-line note when it may not).

    >>> import numpy as np
    >>> ok = Certificate(confidence=0.9, holds=True, achieved=0.97, slack=-0.01, estimate=np.zeros(1), sd=np.ones(1),
    ...                  candidates=1, count_sd=51.0)
    >>> claim(ok, 0.05)
    (0.9, None)
    >>> claim(None, 0.05)
    (None, None)
    """
    if found is None:
        return None, None
    if found.holds:
        return found.confidence, None
    supported = "no gamma up to 2" if not np.isfinite(found.slack) else f"gamma >= {gamma + found.slack:.3f}"
    return None, (f"the certificate on validation does not support {found.confidence:g} at gamma {gamma:g} (it gives "
                  f"{found.achieved:.2f}); it supports {found.confidence:g} at {supported}")
