"""What each paper figure / table shows: pure data (the sweep that feeds it, axes, filters).

The sweep file ``sweeps/<sweep>.yaml`` names the MLflow experiment (``tracking.experiment``);
several figures can be views of one experiment (Fig. 2b, Fig. 3 and Fig. 8b read the runs of
``fig4_adult``), and their sweep files write to that experiment, so running either one
reuses (skips) every run already finished.  Fig. 8b adds the hard-dual arm to that
experiment, so the other views keep ``method.dual = soft``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["tradeoff", "satisfaction", "clipping", "timing", "dro_table", "dro_noise", "dro_mia", "dro_gradnorm",
              "group_table", "mspe_vs_rho"]

# the constraint value on the x axis, by constraint registry key (summary.json metric names)
X_METRIC = {"dp": "dp_gap", "eo": "eo_gap", "fnr": "fnr", "fpr": "fpr"}
X_LABEL = {
    "dp_gap": "demographic parity gap (test)",
    "eo_gap": "equalized odds gap (test)",
    "fnr": "false negative rate (test)",
    "fpr": "false positive rate (test)",
    "constraint_max_hard": "max constraint value (test, hard)",
}
# published Lowy et al. 2023 baselines: our names -> the data's names
PUBLISHED_DATASET = {"adult": "adult", "credit": "credit", "parkinsons": "parkinsons"}
PUBLISHED_CONSTRAINT = {"dp": "dp", "eo": "eo"}


@dataclass(frozen=True)
class FigureSpec:
    """One figure (or table) of the paper.

    Attributes:
        name: output basename (``outputs/figures/<name>.png``) and ``make fig-<name>``.
        sweep: the sweep file whose experiment holds the runs (``make sweep-<sweep>``).
        kind: tradeoff (y vs constraint value, one curve per series), satisfaction (achieved
            constraint vs target gamma), clipping (train constraint vs clip norm), timing (table).
        title: figure title (paper caption, short).
        constraint: x-axis constraint (dp, eo, fnr) for tradeoff plots.
        y: ``accuracy`` or ``error`` (1 - accuracy), on the test split.
        where: keep runs whose param equals one of the values (e.g. ``{"eps": [1]}``).
        series: params that split runs into curves (besides the method).
        published: overlay the published Lowy et al. 2023 points (dataset, constraint, eps).
        gamma_lines: dashed lines at the gamma targets.
    """

    name: str
    sweep: str
    kind: Kind
    title: str
    constraint: str = "dp"
    y: Literal["accuracy", "error"] = "accuracy"
    where: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    series: tuple[str, ...] = ("eps",)
    published: Mapping[str, Any] | None = None
    gamma_lines: bool = False

    @property
    def x_metric(self) -> str:
        return X_METRIC.get(self.constraint, "constraint_max_hard")


# the fig4_adult experiment's own views: soft dual rates (fig8b_hard_soft adds hard-dual runs to it)
SOFT: Mapping[str, tuple[Any, ...]] = {"method.dual": ("soft",)}


def _pub(dataset: str, constraint: str, eps: tuple[float, ...]) -> dict[str, Any]:
    return {"dataset": PUBLISHED_DATASET[dataset], "constraint": PUBLISHED_CONSTRAINT[constraint], "eps": eps}


FIGURES: dict[str, FigureSpec] = {
    f.name: f
    for f in (
        FigureSpec("fig2a_celeba", "fig2a_celeba", "tradeoff", "CelebA, ResNet16, demographic parity (Fig. 2a)"),
        FigureSpec("fig2b_adult", "fig2b_adult", "tradeoff", "Adult, demographic parity, eps = 1 (Fig. 2b)",
                   where={"eps": (1,), **SOFT}, published=_pub("adult", "dp", (1,))),
        FigureSpec("fig2c_acs", "fig2c_acs", "tradeoff", "ACSEmployment, 18 DP constraints, eps = 1 (Fig. 2c)",
                   where={"eps": (1,)}),
        FigureSpec("fig3_satisfiability", "fig3_satisfiability", "satisfaction",
                   "Constraint satisfaction on Adult, eps = 1 (Fig. 3)", where={"eps": (1,), "method.name": ("raco_dp",), **SOFT}),
        FigureSpec("fig4_adult", "fig4_adult", "tradeoff", "Adult, demographic parity (Fig. 4a)", where=SOFT,
                   published=_pub("adult", "dp", (0.5, 1, 9))),
        FigureSpec("fig4_credit", "fig4_credit", "tradeoff", "Credit-Card, demographic parity (Fig. 4b)",
                   published=_pub("credit", "dp", (0.5, 1, 9))),
        FigureSpec("fig4_parkinsons", "fig4_parkinsons", "tradeoff", "Parkinsons, demographic parity (Fig. 4c)",
                   published=_pub("parkinsons", "dp", (0.5, 1, 9))),
        FigureSpec("fig5_adult", "fig5_adult", "tradeoff", "Adult, false negative rate (Fig. 5a)", constraint="fnr",
                   gamma_lines=True),
        FigureSpec("fig5_heart", "fig5_heart", "tradeoff", "Heart, false negative rate (Fig. 5b)", constraint="fnr",
                   gamma_lines=True),
        FigureSpec("fig6_credit", "fig6_credit", "tradeoff", "Credit-Card, equalized odds (Fig. 6)", constraint="eo",
                   published=_pub("credit", "eo", (0.5, 1, 3))),
        FigureSpec("fig7_acs", "fig7_acs", "tradeoff", "ACSEmployment, demographic parity (Fig. 7)"),
        FigureSpec("fig8a_clipping", "fig8a_clipping", "clipping",
                   "Adult, FNR <= 0 without noise: clipping norm (Fig. 8a)", constraint="fnr"),
        FigureSpec("fig8b_hard_soft", "fig8b_hard_soft", "tradeoff", "Adult, hard vs soft dual rates (Fig. 8b)",
                   y="error", where={"eps": (1,), "method.name": ("raco_dp",)}, series=("eps", "method.dual"), gamma_lines=True),
        FigureSpec("fig9_low_eps", "fig9_low_eps", "tradeoff", "Adult, demographic parity, small eps (Fig. 9)"),
        FigureSpec("table2_timing", "table2_timing", "timing", "Time per step, batch 512 (Table 2)"),
        # the DP-DRO paper (docs/dro.md): Table 3, Table 2, Figure 1
        FigureSpec("dro_table3", "dro_table3", "dro_table", "DP-DRO: test accuracy (DP-DRO paper, Table 3)"),
        FigureSpec("dro_noise", "dro_noise", "dro_noise",
                   "DP-DRO where privacy noise dominates: digits-ST, MLP [32], each method tuned alike (docs/dro.md)"),
        FigureSpec("dro_table2_mia", "dro_table2_mia", "dro_mia", "DP-DRO: membership-inference AUC (DP-DRO paper, Table 2)"),
        FigureSpec("dro_fig1_gradnorm", "dro_table3", "dro_gradnorm", "DP-DRO: |grad F| over training, eps = 1 (DP-DRO paper, Fig. 1)",
                   where={"eps": (1,)}),
        # the DPSE paper (papers/dpse-privacy-budget-tailoring.txt), docs/dpse.md
        FigureSpec("dpse_table1", "dpse_table1", "group_table", "DPSE paper Table 1: K = 5 groups, 20x, rho = 2",
                   where={"privacy.rho": (2,)}),
        FigureSpec("dpse_table2", "dpse_table2", "group_table", "DPSE paper Table 2: K = 5 groups, 20x, rho = 4.5",
                   where={"privacy.rho": (4.5,)}),
        FigureSpec("dpse_table3", "dpse_table3", "group_table", "DPSE paper Table 3: K = 5 groups, 20x, rho = 8",
                   where={"privacy.rho": (8,)}),
        FigureSpec("dpse_fig2", "dpse_fig2", "mspe_vs_rho", "DPSE paper Figure 2: two groups, smallest group's MSPE"),
    )
}

# the knob that moves a method along its curve (params are MLflow's flattened config keys)
KNOB = {"dp_fermi": "method.options.lam", "dp_sgd": None, "sgd": None}
DEFAULT_KNOB = "constraint.gamma"
METHOD_LABEL = {"raco_dp": "RaCO-DP", "dp_sgd": "DP-SGD", "sgd": "SGD", "sgda": "SGDA (non-private)",
                "dp_fermi": "DP-FERMI (ours)", "dpse": "DPSE", "dp_sgda": "DP-SGDA", "dp_private_diff": "PrivateDiff",
                "dp_double_spider": "DP Double-SPIDER", "dp_recursive_spider": "DP Recursive-SPIDER",
                "spider": "SPIDER (non-private)"}  # fmt: skip
