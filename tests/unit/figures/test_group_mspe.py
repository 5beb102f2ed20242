"""DPSE paper tables and Figure 2 from run records: variants, paired changes, the paper's numbers."""

from __future__ import annotations

import math

import pytest

from raco_cli.figures import group_mspe


def record(method, seed, values, *, allocation="sum", penalty="0.0", rho="2.0", private=True, slopes="[-10, 10]", ratio="5"):
    params = {"method.name": method, "method.options.allocation": allocation, "method.options.bgl_penalty": penalty,
              "privacy.rho": rho, "seed": str(seed), "dataset.options.slopes": slopes, "dataset.options.ratio": ratio}
    metrics = {f"final/test/group_mspe/group{k + 1}": v for k, v in enumerate(values)}
    return {"status": "FINISHED", "params": params, "metrics": metrics,
            "tags": {"method": method, "private": str(private).lower()}}


def test_the_paper_tables_are_transcribed():
    t1 = group_mspe.load_paper_table(2.0)
    assert t1[("DPNoSE", "group1")] == 1.02 and t1[("DPSE", "group5")] == 15.29
    assert group_mspe.load_paper_table(4.5)[("DPSE", "group3")] == 17.73
    assert group_mspe.load_paper_table(8.0)[("DPNoSE", "group4")] == 21.29
    assert len(group_mspe.load_paper_table(8.0)) == 10


def test_group_table_pairs_seeds_and_filters_the_budget():
    recs = [record("dpse", s, [1.0 + s, 10.0]) for s in range(3)]
    recs += [record("dpse", s, [2.0 + 2 * s, 8.0], allocation="uniform") for s in range(3)]
    recs += [record("dpse", 0, [100.0, 100.0], rho="8.0")]  # another budget: left out
    recs += [record("sgd", s, [1.0, 1.0], private=False, rho="8.0") for s in range(2)]  # non-private: always in
    by_seed = group_mspe.group_values_by_seed(recs, where={"privacy.rho": (2,)})
    assert by_seed[("DPSE", "group1")] == {0: 1.0, 1: 2.0, 2: 3.0}
    assert by_seed[("SGD (non-private)", "group2")] == {0: 1.0, 1: 1.0}
    header, rows = group_mspe.table_rows(by_seed, group_mspe.load_paper_table(2.0))
    assert header[:5] == ["group", "DPNoSE (paper)", "DPNoSE (ours)", "DPSE (paper)", "DPSE (ours)"]
    row1 = dict(zip(header, rows[0]))
    assert row1["DPSE (paper)"] == "1.27" and row1["DPSE vs DPNoSE, % (paper)"] == "+24.5"
    # paired per seed: 1/2, 2/4, 3/6 -> -50 % every seed, so the interval is 0
    assert row1["DPSE vs DPNoSE, % (ours, paired)"] == "-50.00 ± 0.00"
    assert dict(zip(header, rows[1]))["DPSE vs DPNoSE, % (ours, paired)"] == "+25.00 ± 0.00"


def test_variants_and_their_untailored_counterparts():
    assert group_mspe.variant("dpse", {"method.options.allocation": "max", "method.options.bgl_penalty": "0"}) == "DPSE"
    assert group_mspe.variant("dp_sgd", {}) == "DP-SGD"
    assert group_mspe.untailored("DPSE + BGL") == "DPNoSE + BGL"
    assert group_mspe._pairs(["DPNoSE", "DPSE", "DPSE + BGL"]) == [("DPSE", "DPNoSE")]


def test_smallest_group_points_and_the_figure(tmp_path):
    recs = [record("dpse", s, [1.0, 50.0 + s], rho=r) for s in range(3) for r in ("0.5", "50")]
    recs += [record("dpse", s, [1.0, 100.0], rho=r, allocation="uniform") for s in range(3) for r in ("0.5", "50")]
    pts = group_mspe.smallest_group_points(recs)
    assert pts[("[-10, 10]", "5", 0.5, "DPSE")] == {0: 50.0, 1: 51.0, 2: 52.0}
    change = group_mspe.paired_change(pts[("[-10, 10]", "5", 50.0, "DPSE")], pts[("[-10, 10]", "5", 50.0, "DPNoSE")])
    assert change.mean == pytest.approx(-49.0) and change.n == 3 and math.isfinite(change.ci)

    class Spec:
        name, title = "fig", "t"

    files = group_mspe.mspe_vs_rho(recs, Spec(), tmp_path)
    assert {f.suffix for f in files} == {".png", ".pdf", ".csv"}
    assert "DPSE vs DPNoSE (%)" in (tmp_path / "fig.csv").read_text()
