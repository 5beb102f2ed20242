"""The DP-DRO tables (raco_cli/figures/dro.py) from hand-made run records."""

from __future__ import annotations

from raco_cli.figures.dro import mia_table
from raco_cli.figures.specs import FIGURES


def _rec(method: str, eps: float | None, seed: int, auc: float) -> dict:
    private = eps is not None
    params = {"dataset.name": "adult", "method.name": method, "seed": str(seed), **({"eps": str(eps)} if private else {})}
    return {"status": "FINISHED", "params": params, "tags": {"method": method, "private": str(private).lower()},
            "metrics": {"final/mia/auc_loss": auc, "final/mia/auc_confidence": auc + 0.01}}


def test_mia_table_gives_the_non_private_references_their_own_column(tmp_path):
    records = [_rec("dp_sgda", 1.0, s, 0.50 + 0.01 * s) for s in range(3)] + [_rec("sgda", None, s, 0.6) for s in range(2)]
    md, _csv = mia_table(records, FIGURES["dro_table2_mia"], tmp_path)
    lines = md.read_text().splitlines()
    assert lines[0] == "| dataset | method | eps=1 | non-private |"
    dp, ref = (next(line for line in lines if f"| {label} |" in line) for label in ("DP-SGDA", "SGDA (non-private)"))
    assert dp.endswith("| - |") and "0.5100 ± 0.0100" in dp  # mean and sample std of 0.50, 0.51, 0.52
    assert ref.split(" | ")[2] == "-" and "0.6000 ± 0.0000 (conf. 0.6100 ± 0.0000)" in ref
