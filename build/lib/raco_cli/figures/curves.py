"""Training curves of one run (logged as an MLflow artifact)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot_training_curves(history: Sequence[Any], *, gamma: float | None, path: Path, title: str) -> Path:
    """Accuracy (val/test), hard train constraint and max lambda against the step.

    Args:
        history: evaluation records with ``step``, ``metrics[split][name]`` and ``lam``.
        gamma: the common gamma of the constraints: the middle panel shows max_j Gamma_j
            against it; ``None`` (gammas differ, e.g. a combination) shows the violation
            max_j (Gamma_j - gamma_j) against 0.
    """
    from raco_cli.figures.canvas import pyplot

    plt = pyplot()
    steps = [r.step for r in history]
    present = [split for split in ("train", "val", "test") if history and split in history[0].metrics]
    if history and "mspe" in history[0].metrics["test"]:  # task=regression: MSPE and per-group MSPE
        return _regression_curves(history, steps, present, plt, path=Path(path), title=title)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for split in present:  # scope=model records hold the test split only
        axes[0].plot(steps, [r.metrics[split]["accuracy"] for r in history], label=split)
        key = "constraint_max_hard" if gamma is not None else "violation_hard"
        axes[1].plot(steps, [r.metrics[split][key] for r in history], label=split)
    axes[1].axhline(gamma if gamma is not None else 0.0, color="k", ls="--", lw=1, label="gamma" if gamma is not None else "0")
    axes[2].plot(steps, [max(r.lam) if r.lam else 0.0 for r in history], color="C3")
    axes[0].set_ylabel("accuracy")
    axes[1].set_ylabel("max hard constraint value" if gamma is not None else "max hard violation")
    axes[2].set_ylabel("max lambda")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _regression_curves(history: Sequence[Any], steps: list[int], present: list[str], plt: Any, *, path: Path, title: str) -> Path:
    """MSPE per split and the test MSPE of every group against the step (``task=regression``)."""
    # (a fixed layout, not tight_layout: Monte Carlo sweeps draw thousands of these)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.86, wspace=0.25)
    for split in present:
        axes[0].plot(steps, [r.metrics[split]["mspe"] for r in history], label=split)
    for group in history[0].metrics["test"]["group_mspe"]:
        axes[1].plot(steps, [r.metrics["test"]["group_mspe"][group] for r in history], label=group)
    axes[0].set_ylabel("MSPE")
    axes[1].set_ylabel("test MSPE per group")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
