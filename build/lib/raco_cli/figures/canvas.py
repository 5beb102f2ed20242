"""The matplotlib setup every figure module shares: a headless pyplot in the house style, and a
figure saved as PNG + PDF.

Apart from :mod:`raco_cli.figures.plots` (the dispatcher by figure kind) so that the modules it
dispatches to (:mod:`~raco_cli.figures.dro`, :mod:`~raco_cli.figures.group_mspe`) draw without
importing it back.  matplotlib is imported on first use: reading run records needs none of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed) with the figures' style.

    matplotlib's INFO lines say what it did on this machine (``generated new fontManager`` the
    first time it runs after an install), not anything of the run: kept out of the run's log,
    which a reader compares between runs (tests/e2e/test_neighbour_replay.py failed on it on a
    fresh machine)."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 7})
    return plt


def save(fig: Any, out_dir: Path, name: str) -> list[Path]:
    """Write ``fig`` as ``<out_dir>/<name>.png`` and ``.pdf`` and close it (figures are drawn by
    the dozen in one process); returns both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    pyplot().close(fig)
    return paths
