"""The short result table ``raco train`` prints after a run (from its released summary)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raco_cli.tracking.summary import training_signal

SCOPE_NOTES = {
    "model": "model (eps covers the model and every record written; test metrics: exact, on the held-out test split)",
    # privacy.secure_rng=false under scope=model: the recorded seed replays every batch and noise draw
    "model-seeded": "model, seeded (eps holds only against readers without this run's seed: privacy.secure_rng=false)",
    "paper": "paper (eps covers training only: not the exact-data checkpoint choice, "
             "preprocessing statistics or training statistics in the records)",
}


def scope_note(summary: Mapping[str, Any]) -> str:
    """What the printed epsilon covers, in one line (:data:`SCOPE_NOTES`)."""
    scope = summary.get("privacy_scope", "paper")
    if scope == "model" and not summary.get("secure_rng"):
        scope = "model-seeded"
    return SCOPE_NOTES.get(scope, "")


def format_result(summary: Mapping[str, Any], run_dir: Path) -> str:
    """The short result table printed after a run."""
    test = summary["metrics"]["test"]
    if "mspe" in test:  # task=regression
        lines = [f"{summary['method']} on {summary['dataset']} (regression)", f"  test MSPE            {test['mspe']:.4f}"]
        lines += [f"  test MSPE {group:<10} {'-' if v is None else f'{v:.4f}'}" for group, v in test["group_mspe"].items()]
        return "\n".join(lines + _privacy_lines(summary, run_dir))
    majority = majority_rate(summary)
    baseline = "" if majority is None else f"   (predicting the majority class {majority[0]} everywhere: {majority[1]:.4f})"
    headline, later = model_warnings(summary), data_warnings(summary)
    lines = [
        f"{summary['method']} on {summary['dataset']} ({summary['constraint']}, gamma={summary['gamma']:g})",
        *headline,  # a near-constant model or one below the majority rate: said before any number
        f"  test accuracy        {test['accuracy']:.4f}{baseline}",
    ]
    if "dp_gap" in test and "dp" not in (test.get("constraints") or {}):
        lines.append(f"  test DP gap (hard)   {test['dp_gap']:.4f}   (not constrained)")
    lines += constraint_lines(test)
    certificate = summary.get("certificate") or {}
    if certificate.get("holds") and summary.get("confidence") is not None:  # claimed only when certified (run/certify.py)
        how = "noisy validation counts" if certificate.get("count_sd") else "exact validation counts"
        lines.append(f"  confidence           {summary['confidence']:g}   (certified on {how}: meets gamma on new data of the "
                     f"test split's size w.p. >= {summary['confidence']:g})")
    elif summary.get("confidence_note"):
        lines.append(f"  confidence           none   ({summary['confidence_note']})")
    signal = training_signal(summary)
    if signal is not None and "release" in summary["metrics"]:
        shown = "feasible" if signal else "infeasible"
        lines.append(f"  training signal      noisy histograms at the training target: {shown} (a training-side signal, not a test result)")
    elif signal is not None:
        lines.append(f"  training constraint  {'satisfied' if signal else 'violated'} on the training split (exact)")
    return "\n".join(lines + _privacy_lines(summary, run_dir) + later)


NEAR_CONSTANT = 0.02  # a predicted positive rate this close to 0 or 1 in every group: a (near-)constant model

def majority_rate(summary: Mapping[str, Any]) -> tuple[str, float] | None:
    """(the test split's most frequent class, its share): the accuracy of the constant model a
    released model must beat (``label_counts.test``, an evaluation on the test split); None
    when the summary has no label counts (regression, older records)."""
    counts = (summary.get("label_counts") or {}).get("test") or {}
    n = sum(counts.values())
    if n <= 0:
        return None
    majority = max(counts, key=lambda k: counts[k])
    return str(majority), counts[majority] / n


def _against(found: tuple[str, float] | None) -> str:
    return "" if found is None else f"; predicting class {found[0]} everywhere scores {found[1]:.4f}"


def warning_lines(summary: Mapping[str, Any]) -> list[str]:
    """One-line warnings about what the test numbers cannot show (from the test split only):
    :func:`model_warnings` (the table's first lines) then :func:`data_warnings`."""
    return model_warnings(summary) + data_warnings(summary)


def model_warnings(summary: Mapping[str, Any]) -> list[str]:
    """The warnings that the numbers below them are not a useful model, said before any of
    them: a released model that predicts one class for (nearly) every row of every group, whose
    accuracy is then the base rate and whose gap is 0 by construction; a test accuracy below
    that of predicting the test split's most frequent class everywhere."""
    test = summary["metrics"]["test"]
    out = []
    accuracy, found = test.get("accuracy"), majority_rate(summary)
    rates = [r for r in (test.get("group_positive_rate") or {}).values() if r is not None]
    if rates and (max(rates) <= NEAR_CONSTANT or min(rates) >= 1 - NEAR_CONSTANT):
        which = "negative" if max(rates) <= NEAR_CONSTANT else "positive"
        out.append(f"  warning              the released model predicts the {which} class for >= {1 - NEAR_CONSTANT:.0%} of every test "
                   f"group (a near-constant model: its DP gap is ~0 by construction{_against(found)}); try a larger eps, a looser constraint.gamma, "
                   "more training rows or method.lr (docs/your-own-data.md)")
    if isinstance(accuracy, (int, float)) and found is not None:
        majority, base = found
        if accuracy < base:
            out.append(f"  warning              test accuracy {accuracy:.4f} is below {base:.4f}, the accuracy of predicting the most "
                       f"frequent class ({majority}) for every test row: the released model is worse than a constant; try a larger "
                       "eps, more training rows, another method or method.lr (docs/your-own-data.md)")
    return out


def data_warnings(summary: Mapping[str, Any]) -> list[str]:
    """Test groups too small to measure a rate to within gamma (95 % half-width
    1.96 * 0.5 / sqrt(n) > gamma): the test gap cannot show the constraint holds."""
    out = []
    gamma = summary.get("gamma")
    sizes = (summary.get("group_sizes") or {}).get("test") or {}
    if isinstance(gamma, (int, float)) and gamma > 0 and summary.get("constraint") != "none":
        small = {g: n for g, n in sizes.items() if isinstance(n, int) and n > 0 and 0.98 / n ** 0.5 > gamma}
        if small:
            worst = min(small, key=lambda g: small[g])
            listed = ", ".join(f"{g} ({n} rows)" for g, n in sorted(small.items(), key=lambda kv: kv[1]))
            out.append(f"  warning              test groups too small to measure a rate to within gamma={gamma:g}: {listed} (group "
                       f"{worst}: +-{0.98 / small[worst] ** 0.5:.2f} at 95 %); the test gap cannot show the constraint holds: "
                       "use a larger test split, merge small groups (dataset.options.sensitive) or a looser gamma")
    return out


def constraint_lines(test: Mapping[str, Any]) -> list[str]:
    """One row per constrained family on the test split: its value against gamma and whether it
    holds (every constraint of the families whose constraints each mean one rate: fnr, fpr,
    custom), plus the family's standard metric."""
    lines = []
    for family, fm in (test.get("constraints") or {}).items():
        gammas = fm.get("gamma") or []
        if family in ("fnr", "fpr", "custom"):
            rows = list(zip(fm["names"], fm["values_hard"], gammas))
        else:
            rows = [(f"{family} max Gamma", fm["max_hard"], max(gammas) if gammas else 0.0)]
        for name, value, gamma in rows:
            verdict = "holds" if value <= gamma else "VIOLATED"
            lines.append(f"  test {name:<16}{value:.4f}   (gamma {gamma:g}: {verdict} on the test split)")
        for name, value in (fm.get("standard") or {}).items():
            if isinstance(value, (int, float)) and family not in ("fnr", "fpr"):
                lines.append(f"  test {name:<16}{value:.4f}")
    return lines


def _privacy_lines(summary: Mapping[str, Any], run_dir: Path) -> list[str]:
    lines = []
    if summary["eps_spent"] is not None:
        lines.append(f"  eps spent            {summary['eps_spent']:.4f} of {summary['eps_target']:g} (delta={summary['delta']:g})"
                     + (" for the whole search" if summary.get("search") else ""))
        lines += search_lines(summary)
        if summary.get("rho_spent") is not None:  # zCDP of the same event tree (privacy.rho: the target)
            target = f" of {summary['rho_target']:g}" if summary.get("rho_target") is not None else ""
            lines.append(f"  rho spent (zCDP)     {summary['rho_spent']:.4f}{target}")
        lines.append(f"  privacy scope        {scope_note(summary)}")
        tuned = summary.get("tuned_on") or {}
        if tuned.get("outside_eps") and summary.get("privacy_scope") == "model":
            lines.append(f"  hyperparameters      chosen non-privately on this data ({tuned.get('split', 'train/val')}; outside eps)")
    else:
        lines.append("  eps spent            not private")
    lines += [
        f"  steps                {summary['steps']} (selected step {summary['selected_step']})",
        f"  summary              {Path(run_dir) / 'summary.json'}",
    ]
    if "predictor" in summary:
        lines.append(f"  model for new rows   raco predict {run_dir} --data NEW.csv --out predictions.csv")
    if "mlflow" in summary:
        lines.append(f"  mlflow run           {summary['mlflow']['run_id']} ({summary['mlflow']['uri']})")
        if "model_uri" in summary["mlflow"]:
            lines.append(f"  mlflow model         {summary['mlflow']['model_uri']}")
    return lines


def search_lines(summary: Mapping[str, Any]) -> list[str]:
    """What a released best trial of a private search (``raco tune``, scope=model) adds: the
    protocol, the trial budget and the best trial's noisy validation score (all in
    ``summary.search``; the number of trials is never shown)."""
    search = summary.get("search")
    if not search:
        return []
    verdict = "noisy-feasible" if search.get("noisy_feasible") else "no trial noisy-feasible: the closest to gamma"
    kind, mean = search["repetitions"], float(search["mean"])
    reps = {"fixed": f"fixed: {mean:g} trials", "poisson": f"poisson: mean {mean:g} trials"}.get(
        kind, f"{kind.replace('_', ' ')}: mean {mean:g} trials, shape {search.get('shape')}")
    return [f"  search               {search['protocol']}, {reps}, over "
            f"{search['usable_candidates']} of {search['candidates']} candidates, each trial at eps {search['eps_trial']:.4g}",
            f"  best trial           noisy validation accuracy {search['noisy_val_accuracy']:.4f} ({verdict})"]


def print_result(summary: Mapping[str, Any], run_dir: Path) -> None:
    """Print a finished run's result table (flushed: sweep jobs interleave)."""
    print(format_result(summary, run_dir), flush=True)
