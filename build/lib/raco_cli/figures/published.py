"""Published baseline curves for figure overlays (Lowy et al. 2023: DP-FERMI, Tran et al. 2021a/b,
Jagielski et al. 2019), transcribed with their source in ``published_lowy2023.csv`` beside this file.

These are *their* numbers under *their* protocol (sensitive-attribute DP, delta = 1/n^2, 3:1 split,
final iterate); an overlay shows them as reference points, not as runs of ours.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

PUBLISHED_LOWY2023 = Path(__file__).with_name("published_lowy2023.csv")


@dataclass(frozen=True)
class PublishedPoint:
    """One plotted point of a published curve (see the CSV header for each column)."""

    method: str
    dataset: str
    constraint: str
    epsilon: float
    point: int
    fermi_lambda: float | None
    test_accuracy: float
    violation: float
    violation_lower: float | None
    violation_upper: float | None


def _opt(value: str) -> float | None:
    return float(value) if value != "" else None


def load_published(
    *, dataset: str | None = None, constraint: str | None = None, epsilon: float | None = None,
    method: str | None = None, path: Path = PUBLISHED_LOWY2023,
) -> list[PublishedPoint]:
    """Points of the published curves, filtered; ordered as in the file (curve order).

    >>> pts = load_published(dataset="adult", constraint="dp", epsilon=1.0, method="DP-FERMI")
    >>> [(p.fermi_lambda, p.test_accuracy) for p in pts][3]
    (0.75, 0.82373)
    """
    with path.open(newline="") as fh:
        lines = [line for line in fh if not line.startswith("#")]
    out = []
    for r in csv.DictReader(lines):
        eps = float(r["epsilon"])  # "inf" parses to math.inf
        if dataset is not None and r["dataset"] != dataset:
            continue
        if constraint is not None and r["constraint"] != constraint:
            continue
        if epsilon is not None and not math.isclose(eps, epsilon):
            continue
        if method is not None and r["method"] != method:
            continue
        out.append(PublishedPoint(
            method=r["method"], dataset=r["dataset"], constraint=r["constraint"], epsilon=eps,
            point=int(r["point"]), fermi_lambda=_opt(r["fermi_lambda"]), test_accuracy=float(r["test_accuracy"]),
            violation=float(r["violation"]), violation_lower=_opt(r["violation_lower"]),
            violation_upper=_opt(r["violation_upper"]),
        ))
    return out


def best_accuracy_within(points: list[PublishedPoint], max_violation: float) -> float | None:
    """Highest test accuracy among points whose mean violation is <= max_violation.

    >>> best_accuracy_within(load_published(dataset="adult", constraint="dp", epsilon=1.0, method="DP-FERMI"), 0.05)
    0.82373
    """
    ok = [p.test_accuracy for p in points if p.violation <= max_violation]
    return max(ok) if ok else None
