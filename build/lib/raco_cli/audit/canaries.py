"""The training set of an audit run: the real dataset with the included canaries appended.

Both audits (:mod:`~raco_cli.audit.one_run`, :mod:`~raco_cli.audit.gradient`) choose their
canaries' features differently and append them the same way: as training rows labelled
``audit.label``, canary i alone in a group (histogram cell) of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from raco_cli.audit.result import AuditSpec
from raco_cli.errors import ConfigError, UnsupportedError

if TYPE_CHECKING:  # the data package is imported when an audit runs, not with this module
    from raco_cli.data.types import TabularData


def check_auditable(data: TabularData, audit: AuditSpec) -> None:
    """Canaries are rows appended to features held in memory, with a label the data has.

    Raises:
        UnsupportedError: the features are not held in memory (image datasets).
        ConfigError: ``audit.label`` is not one of the data's classes.
    """
    if not isinstance(data.X, np.ndarray):
        raise UnsupportedError("raco audit supports tabular datasets only (features held in memory).")
    if audit.label >= data.n_classes:
        raise ConfigError(f"audit.label must be in 0..{data.n_classes - 1} (got audit.label={audit.label}); it is the canaries' label.")


def with_canaries(data: TabularData, audit: AuditSpec, X: np.ndarray, included: np.ndarray, *, feature_names: tuple[str, ...]) -> TabularData:
    """``data`` with the ``included`` canaries (indices into 0..m-1) as extra training rows.

    Args:
        X: the features of every row, the real rows first, then one per included canary.
        feature_names: the names of ``X``'s columns.

    Returns:
        Canary i in group ``n_groups + i``, named ``canary<i>``; ``meta["audit_canaries"] = m``.
    """
    from raco_cli.data.types import TabularData

    m, n = audit.canaries, len(data.y)
    splits = dict(data.splits)
    splits["train"] = np.concatenate([np.asarray(splits["train"]), n + np.arange(len(included))])
    return TabularData(
        name=data.name,
        X=X,
        y=np.concatenate([data.y, np.full(len(included), audit.label, dtype=np.int64)]),
        group=np.concatenate([data.group, data.n_groups + included.astype(np.int64)]),
        feature_names=feature_names,
        class_names=data.class_names,
        group_names=tuple(data.group_names) + tuple(f"canary{i}" for i in range(m)),
        splits=splits,
        source=data.source,
        meta={**dict(data.meta), "audit_canaries": m},
    )
