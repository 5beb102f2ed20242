"""``raco audit``: empirical privacy audit of the training code (one training run, canaries).

Takes the same Hydra-style overrides as ``raco train`` (the audited configuration) plus
``audit.*`` keys of its own, which ``raco train`` does not accept.  Prints the empirical
lower bound on epsilon with its confidence next to the accounted epsilon, writes
``audit.json``, and exits 0 (no violation found), 1 (the bound exceeds the accounted
epsilon: a privacy bug) or 2 (bad input).  Never writes to the MLflow store.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from raco_cli.errors import ConfigError

AUDIT_KEYS = ("canaries", "beta", "label", "seed", "mechanism", "scale", "target", "out")

HELP = """\
usage: raco audit [key=value ...] [group=option ...] [audit.<key>=<value> ...]

One-run privacy audit (Steinke, Nasr, Jagielski 2023): m canary records, each included
with probability 1/2, one ordinary training run of the audited configuration, scores from
the released noisy values, and an epsilon lower bound at confidence 1 - beta.  The bound is
compared with the accounted epsilon of exactly this run; exit code 1 when it is larger (a bug).

audit.target=histogram (default): RaCO-DP's Laplace histogram; each canary is alone in a
  histogram cell of its own (method=raco_dp with a rate constraint).
audit.target=gradient: the Gaussian gradient sum of raco_dp or dp_sgd (model=logreg); each
  canary is a Dirac canary, a record with one feature of its own, whose clipped gradient fills
  one weight column that no other record touches (white box).

audited configuration: any `raco train` override (method, constraint, eps, method.clip_norm, ...)

audit keys:
  audit.canaries=2000     m, the number of canaries
  audit.beta=0.05         the bound holds with probability >= 1 - beta
  audit.seed=0            seed of the canaries' inclusion (independent of the run's seeds)
  audit.label=1           label of the canaries
  audit.scale=1.0         factor on the canaries' features (histogram: copies of random
                          test rows; gradient: the Dirac feature, 100 x scale)
  audit.target=histogram  histogram | gradient
  audit.mechanism=correct histogram: correct | broken_no_noise | broken_shared_class_noise
                          gradient:  correct | broken_noise_sigma | broken_clip_after_sum
                          (deliberately broken releases: the audit's own test cases)
  audit.out=<dir>         where audit.json goes (default: hydra.run.dir if given, else outputs/audits/<date>/<time>)

examples:
  raco audit dataset=adult eps=1
  raco audit dataset=adult eps=4 audit.mechanism=broken_shared_class_noise
  raco audit dataset=adult eps=1 method.clip_norm=4 audit.target=gradient
  raco audit dataset=adult eps=1 method=dp_sgd constraint=none audit.target=gradient audit.canaries=1000
  raco audit dataset=adult dataset.subset=5000 eps=1 audit.canaries=1000"""


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_audit_args(args: list[str]) -> tuple[dict[str, object], list[str]]:
    """Split ``audit.*`` overrides from the rest.

    Raises:
        ConfigError: an unknown audit key or a malformed override.
    """
    audit: dict[str, object] = {}
    rest = []
    for arg in args:
        if not arg.startswith("audit."):
            rest.append(arg)
            continue
        key, sep, value = arg[len("audit.") :].partition("=")
        if not sep:
            raise ConfigError(f"Malformed override {arg!r}; write audit.<key>=<value>.")
        if key not in AUDIT_KEYS:
            raise ConfigError(f"Unknown key audit.{key}. Allowed: {', '.join('audit.' + k for k in AUDIT_KEYS)}.")
        audit[key] = value if key in ("mechanism", "target", "out") else _value(value)
    return audit, rest


def format_result(result, out: Path) -> str:  # noqa: ANN001
    r = result
    s = r.settings
    conf = r.conformance
    per_score: dict[str, float] = {}
    for t in r.tests:
        per_score[t["score"]] = max(per_score.get(t["score"], 0.0), t["eps_lower_bound"])
    noise = (f"noise_multiplier={s['noise_multiplier']:g}, clip_norm={s['clip_norm']:g}" if r.target == "gradient"
             else f"hist_noise_multiplier={r.hist_noise_multiplier:g}")
    lines = [
        f"raco audit: {s['method']} on {s['dataset']} ({s['constraint']}), target={r.target}, mechanism={r.mechanism}",
        f"  accounted eps        {r.eps_accounted:.4f} at delta={r.delta:g} ({r.target} releases alone: "
        f"{r.eps_accounted_released:.4f}; target eps={r.eps_target:g})",
        f"  run                  T={r.steps} steps, q={r.sample_rate:.4g}, {noise}, sampling={s['sampling']}",
        f"  canaries             m={r.canaries} ({r.included} included{', Dirac' if r.target == 'gradient' else ''}), audit seed {s['seed']}",
        f"  empirical eps_LB     {r.eps_lower_bound:.4f} at {100 * r.confidence:g}% confidence "
        f"(one-run audit, {s['bonferroni_tests']} tests, Bonferroni)",
        f"  best test            score={r.best['score']} k={r.best['k']} correct={r.best['correct']}",
        "  per score            " + "  ".join(f"{k} {v:.3f}" for k, v in per_score.items()),
    ]
    if "zero_fraction" in conf:
        corr = conf.get("class_correlation")
        lines.append(
            f"  noise conformance    zeros {conf['zero_fraction']:.3f}  mean|noise|/scale {conf['mean_abs_over_scale']:.3f}"
            + (f"  class corr {corr:.3f}" if corr is not None else "")
            + ("  ok" if conf["ok"] else "  PROBLEMS: " + "; ".join(conf["problems"]))
        )
    if "mean_canary_contribution_over_c" in conf:
        lines.append(f"  canary gradients     {conf['gradient_releases']} releases scored; mean clipped contribution "
                     f"{conf['mean_canary_contribution_over_c']:.4f} x C along the canary's direction; noise multiplier "
                     f"measured {conf['measured_noise_multiplier']:.3f} (claimed {conf['claimed_noise_multiplier']:g})"
                     + ("" if conf["ok"] else "  PROBLEMS: " + "; ".join(conf["problems"])))
    verdict = (
        "VIOLATION: the empirical lower bound exceeds the accounted eps"
        if r.violation
        else "no violation found (eps_LB <= accounted eps)"
    )
    lines += [f"  verdict              {verdict}", f"  report               {out}"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(HELP)
        return 0
    if any(a in ("--multirun", "-m") or a.startswith("--") for a in argv):
        raise ConfigError("raco audit takes key=value overrides only (no flags, no --multirun); see raco audit --help.")
    audit_kw, rest = parse_audit_args(argv)
    run_dir = next((a.split("=", 1)[1] for a in rest if a.startswith("hydra.run.dir=")), None)  # as raco train reads it
    out_dir = Path(str(audit_kw.pop("out", None) or run_dir or Path("outputs") / "audits" / time.strftime("%Y-%m-%d/%H-%M-%S")))
    from raco_cli.audit.one_run import run_audit
    from raco_cli.audit.result import AuditSpec

    audit = AuditSpec(**audit_kw)  # type: ignore[arg-type]
    from raco_cli.cli.job_config import plain_job
    from raco_cli.cli.plugins import register_resolvers
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.prepare import prepare_run
    from raco_cli.run.train import check_writable

    register_resolvers()
    # the audit measures the mechanism's privacy: the run trains against gamma itself unless
    # constraint.confidence is given (a margin on small audit sets would refuse the run)
    cfg = compose_config(["++constraint.confidence=null", *rest])
    prep = prepare_run(plain_job(cfg))
    check_writable(out_dir)
    result = run_audit(prep, audit)
    path = out_dir / "audit.json"
    path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    print(format_result(result, path), flush=True)
    return 1 if result.violation else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
