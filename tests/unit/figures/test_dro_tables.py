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


def test_noise_table_gives_mean_and_student_t_95_ci_of_each_column(tmp_path):
    """F, |grad F|, test and worst-group accuracy per (eps, method): mean ± t_{0.975, n-1} s / sqrt(n)."""
    from raco_cli.figures.dro import noise_table

    def rec(method: str, eps: float | None, seed: int, acc: float) -> dict:
        r = _rec(method, eps, seed, 0.5)
        r["metrics"] = {"final/test/accuracy": acc, "final/test/worst_group_accuracy": acc - 0.1,
                        "final/train/dro_objective": 1.0 + seed, "final/train/grad_norm": 0.5}
        return r

    records = [rec("dp_double_spider", 0.5, s, a) for s, a in enumerate((0.60, 0.70, 0.80))] + [rec("sgda", None, 0, 0.9)]
    files = noise_table(records, FIGURES["dro_noise"], tmp_path)
    lines = next(f for f in files if f.suffix == ".md").read_text().splitlines()
    assert lines[0] == "| dataset | eps | method | seeds | train F | train ‖∇F‖ | test accuracy | worst-group accuracy |"
    row = next(line for line in lines if "DP Double-SPIDER" in line)
    # acc: mean 0.7, s = 0.1, t_{0.975, 2} = 4.3027 -> 0.2484; F: 1, 2, 3 -> 2 ± 2.484
    assert "| 0.5 | DP Double-SPIDER | 3 | 2.000 ± 2.484 | 0.500 ± 0.000 | 0.7000 ± 0.2484 | 0.6000 ± 0.2484 |" in row
    assert any("| non-private | SGDA (non-private) | 1 | 1.000 | 0.500 | 0.9000 | 0.8000 |" in line for line in lines)  # one seed: no interval
