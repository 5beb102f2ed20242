"""The paper's numbers and claims per reproduced figure/table, transcribed with their source.

Source: Yaghini, Cebere, Menart, Bellet, Papernot, "RaCO-DP", ICLR 2026 (the text of the paper;
its figures give no numbers, so a figure is represented by the claims the text makes about it
and by the numbers the text states).  Published baseline curves (Lowy et al. 2023) are not here:
they are data in ``published_lowy2023.csv`` (:mod:`raco_cli.figures.published`), compared
automatically for every figure whose spec overlays them.

Each :class:`PaperNumber` says how *our* comparable number is computed from the figure's runs
(a :class:`Query`), so the reproduction table (:mod:`raco_cli.figures.reproduction`) puts the
two side by side.  These are transcriptions, not results of raco.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

QueryKind = Literal["best_y", "mean_metric"]


@dataclass(frozen=True)
class Query:
    """How our number is computed from one figure's finished runs.

    Attributes:
        kind: ``best_y``: over the seed-aggregated configurations of ``method`` (filtered by
            ``where``) whose mean test constraint value is <= ``max_x`` (None: any), the best
            mean ``y`` (highest accuracy / lowest error), with its 95 % CI, x and knob.
            ``mean_metric``: mean ± 95 % CI over the runs matching ``where`` of ``metric``.
        method: the method (tag ``method``); None for every method.
        where: MLflow params that must equal one of the values (``{"eps": (1,)}``).
        max_x: see ``best_y``.
        y: ``accuracy`` or ``error`` (1 - accuracy) on the test split.
        x_metric: the constraint value (default: the figure's, e.g. ``dp_gap``).
        metric: ``mean_metric``: an MLflow metric name (``final/train/fnr``, ``time_per_step_ms``).
        unbatched: ``mean_metric``: only runs not trained in a batched group (Table 2's per-run timing).
    """

    kind: QueryKind
    method: str | None = None
    where: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    max_x: float | None = None
    y: Literal["accuracy", "error"] = "accuracy"
    x_metric: str | None = None
    metric: str = ""
    unbatched: bool = False


@dataclass(frozen=True)
class PaperNumber:
    """One number or claim of the paper, its source, and the query for ours."""

    quantity: str
    paper: str
    source: str
    query: Query | None = None  # None: a qualitative claim our tables speak to


PAPER = "RaCO-DP (ICLR 2026)"
PARKINSONS_PAGE = "RaCO-DP project page, as quoted in issue 15"


def _best(method: str, eps: float | None, max_x: float | None, **kw: Any) -> Query:
    where = {"eps": (eps,)} if eps is not None else {}
    return Query("best_y", method=method, where=where | kw.pop("where", {}), max_x=max_x, **kw)


def _timing(dataset: str, method: str) -> Query:
    return Query("mean_metric", method=method, where={"dataset.name": (dataset,)}, metric="time_per_step_ms",
                 unbatched=True)


_TABLE2 = {  # App. E.5, Table 2: mean time of one step, batch 512, eight-core CPU
    ("adult", "sgd"): "0.018 ± 0.001 ms", ("adult", "dp_sgd"): "0.037 ± 0.001 ms",
    ("adult", "raco_dp"): "0.064 ± 0.010 ms", ("adult", "dp_fermi"): "85 ± 10 ms (public implementation)",
    ("credit", "sgd"): "0.020 ± 0.005 ms", ("credit", "dp_sgd"): "0.035 ± 0.004 ms",
    ("credit", "raco_dp"): "0.055 ± 0.003 ms", ("credit", "dp_fermi"): "88 ± 14 ms (public implementation)",
}  # fmt: skip

_DOMINATES = PaperNumber(
    "RaCO-DP vs private baselines, every eps",
    "RaCO-DP Pareto-dominates the private baselines and narrows the gap to non-private training",
    f"{PAPER}, Sec. 6 (Tabular data) and App. E.3",
)

PAPER_NUMBERS: dict[str, tuple[PaperNumber, ...]] = {
    "fig2b_adult": (
        PaperNumber("RaCO-DP, eps = 1", "higher accuracy at any fixed DP gap than all baselines", f"{PAPER}, Sec. 6, Fig. 2b"),
    ),
    "fig3_satisfiability": (
        PaperNumber("RaCO-DP, eps = 1, hard rate constraints", "consistently achieves the pre-specified gamma "
                    "(tau = 1 suffices)", f"{PAPER}, Sec. 6 (Satisfiability), Fig. 3"),
    ),
    "fig4_adult": (_DOMINATES,),
    "fig4_credit": (_DOMINATES,),
    "fig4_parkinsons": (
        _DOMINATES,
        PaperNumber("RaCO-DP, eps = 1: test error at DP gap <= 0.035", "0.043 (at gap 0.034)", PARKINSONS_PAGE,
                    _best("raco_dp", 1, 0.035, y="error")),
        PaperNumber("RaCO-DP, eps = 1: test error at DP gap <= 0.011", "0.052 (at gap 0.011)", PARKINSONS_PAGE,
                    _best("raco_dp", 1, 0.011, y="error")),
    ),
    "fig5_adult": (
        PaperNumber("RaCO-DP, FNR bound", "enforces FNR limits beyond fairness constraints", f"{PAPER}, App. E.3, Fig. 5a"),
    ),
    "fig5_heart": (
        PaperNumber("non-private SGDA: test accuracy at FNR <= 0.58", "0.875 (FNR 0.58)", f"{PAPER}, App. E.3 (Fig. 5b)",
                    _best("sgda", None, 0.58)),
        PaperNumber("RaCO-DP, eps = 1: test accuracy at FNR <= 0.60", "0.875 (FNR 0.60)", f"{PAPER}, App. E.3 (Fig. 5b)",
                    _best("raco_dp", 1, 0.60)),
        PaperNumber("RaCO-DP, small gamma", "fails to reduce FNR further beyond some threshold",
                    f"{PAPER}, App. E.3 and E.6"),
    ),
    "fig6_credit": (
        PaperNumber("RaCO-DP vs DP-FERMI (EO)", "trends mirror demographic parity; DP-FERMI points taken from "
                    "Lowy et al. 2023, unchanged across eps", f"{PAPER}, App. E.3, Fig. 6"),
    ),
    "fig8a_clipping": (
        PaperNumber("SGDA, no noise, FNR <= 0: train FNR at C = 2", "> 0.6 (C <= 2)", f"{PAPER}, App. E.6, Fig. 8a",
                    Query("mean_metric", where={"method.clip_norm": (2,)}, metric="final/train/fnr")),
        PaperNumber("... at C = 12.5", "meets the target (C >= 12.5)", f"{PAPER}, App. E.6, Fig. 8a",
                    Query("mean_metric", where={"method.clip_norm": (12.5,)}, metric="final/train/fnr")),
        PaperNumber("... at C = 50", "meets the target (C >= 12.5)", f"{PAPER}, App. E.6, Fig. 8a",
                    Query("mean_metric", where={"method.clip_norm": (50,)}, metric="final/train/fnr")),
    ),
    "fig8b_hard_soft": (
        PaperNumber("soft vs hard dual rates, eps = 1", "similar utility and constraint satisfaction for most "
                    "targets", f"{PAPER}, App. E.4, Fig. 8b"),
        PaperNumber("soft dual: test error at DP gap <= 0.05", "(figure only)", f"{PAPER}, Fig. 8b",
                    _best("raco_dp", 1, 0.05, y="error", where={"method.dual": ("soft",)})),
        PaperNumber("hard dual: test error at DP gap <= 0.05", "(figure only)", f"{PAPER}, Fig. 8b",
                    _best("raco_dp", 1, 0.05, y="error", where={"method.dual": ("hard",)})),
    ),
    "fig9_low_eps": (
        PaperNumber("RaCO-DP, eps = 1: best test accuracy", "about 0.85", f"{PAPER}, App. E.8", _best("raco_dp", 1, None)),
        PaperNumber("RaCO-DP, eps = 0.1: best test accuracy", "about 0.82", f"{PAPER}, App. E.8", _best("raco_dp", 0.1, None)),
        PaperNumber("RaCO-DP, eps = 0.01: best test accuracy", "about 0.80", f"{PAPER}, App. E.8",
                    _best("raco_dp", 0.01, None)),
        PaperNumber("95 % CI width of the DP gap", "about 0.05 at eps = 0.1, about 0.10 at eps = 0.01 "
                    "(mean gap about 0.17)", f"{PAPER}, App. E.8"),
    ),
    "table2_timing": tuple(
        PaperNumber(f"{dataset}, {method}: time per step (batch 512)", value, f"{PAPER}, App. E.5, Table 2",
                    _timing(dataset, method))
        for (dataset, method), value in _TABLE2.items()
    ),
}
