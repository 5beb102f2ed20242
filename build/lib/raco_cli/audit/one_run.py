"""One-training-run privacy audit of RaCO-DP's histogram release (Steinke, Nasr, Jagielski 2023).

(``audit.target=histogram``, the default; the gradient release is audited by
:mod:`raco_cli.audit.gradient`, ``audit.target=gradient``.)

Design (research note ``audit.md``; docs/privacy.md "Privacy audit"):

1. m canary records; canary i is included in the training set iff ``S_i = +1``, with
   ``S_i`` uniform on {-1, +1}, drawn from the audit's own seed (independent of the
   training seeds).  Canary i has the features of a random test row, label ``label`` and
   a group value of its own (``n_groups + i``), so it lands in a *dedicated* histogram cell
   (:meth:`ConstraintSet.with_audit_cells`); the real constraints are unchanged.
2. One ordinary training run of the unmodified method (``method.fit``) on the augmented
   data, with the audited configuration's noise, batch size, steps and sampling mode.  A
   release hook (``on_release``) sees every noisy histogram the run releases.
3. White-box scores, streamed per step from the released rows ``R_{i,t}`` (K entries) of
   the canary cells (all post-processing of DP releases):

   * ``mass``: ``sum_t sum_k R_{i,t,k}`` = times sampled + noise (missing/too small noise);
   * ``spread``: ``sum_t sum_k |R_{i,t,k} - mean_k R_{i,t}|`` (noise shared across the
     predicted-class axis: the row of an excluded canary is then exactly flat);
   * ``llr``: ``sum_t log(1 - q + q exp(l_{i,t}))``, ``l = (|R|_1 - |R - p|_1) / b``, the
     exact log-likelihood ratio of the claimed subsampled Laplace release, with ``p`` the
     canary's tempered-softmax prediction under the current parameters.

4. Guesses: +1 for the k highest scores (one-sided; k fixed in advance from the expected
   number of included-and-sampled canaries), for 3 scores x 3 values of k, Bonferroni at
   beta / 9.  The bound is the largest of the 9; each is valid at 1 - beta/9, so the
   maximum is valid at 1 - beta.

The accounted eps of exactly this run (sample rate ``B / (n + included canaries)``, the
same T) is the claim the bound is compared with.  On a correct mechanism the bound stays
far below it (one-run audits are loose); a broken histogram gives a bound near the
attainable maximum (about 5 for m = 2000).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np

from raco_cli.audit.canaries import check_auditable, with_canaries
from raco_cli.audit.faults import histogram_mechanism
from raco_cli.audit.gradient import run_gradient_audit
from raco_cli.audit.result import AuditResult, AuditSpec, build_result
from raco_cli.errors import UnsupportedError
from raco_cli.methods.base import NullReporter

log = logging.getLogger(__name__)

SCORES = ("mass", "spread", "llr")


class _CanaryScores(NullReporter):
    """Release hook: streams the three scores and the noise diagnostics per step (progress
    and evaluations are dropped)."""

    def __init__(self, *, first_cell: int, m: int, X, model, q: float, b: float, temperature: float, hard: bool, out_mask) -> None:  # noqa: ANN001
        import torch

        self.torch = torch
        self.first, self.m = first_cell, m
        self.X, self.model = X, model
        self.q, self.b, self.temperature, self.hard = q, b, temperature, hard
        self.scores = {name: torch.zeros(m, dtype=torch.float64) for name in SCORES}
        self.out = torch.as_tensor(out_mask)
        self.diag = {"rows": 0, "entries": 0, "zeros": 0, "abs_sum": 0.0, "s0": 0.0, "s1": 0.0, "s00": 0.0, "s11": 0.0, "s01": 0.0}
        self.releases = 0

    def on_release(self, step: int, name: str, H) -> None:  # noqa: ANN001
        torch = self.torch
        if name != "histogram":
            return
        self.releases += 1
        R = H[self.first : self.first + self.m].detach().to("cpu", torch.float64)
        with torch.no_grad():
            z = self.model(self.X).double().cpu()
        if self.hard:
            p = torch.nn.functional.one_hot(z.argmax(dim=1), z.shape[1]).double()
        else:
            p = torch.softmax(self.temperature * z, dim=1)
        s = self.scores
        s["mass"] += R.sum(dim=1)
        s["spread"] += (R - R.mean(dim=1, keepdim=True)).abs().sum(dim=1)
        ell = (R.abs().sum(dim=1) - (R - p).abs().sum(dim=1)) / self.b
        s["llr"] += torch.log1p(self.q * torch.expm1(ell))  # log(1 - q + q e^l), |l| <= 1/b
        # noise conformance on the excluded canaries' cells (empty: pure noise)
        Ro = R[self.out]
        d = self.diag
        d["rows"] += Ro.shape[0]
        d["entries"] += Ro.numel()
        d["zeros"] += int((Ro == 0).sum())
        d["abs_sum"] += float(Ro.abs().sum())
        if R.shape[1] >= 2:
            a, c = Ro[:, 0], Ro[:, 1]
            d["s0"] += float(a.sum()); d["s1"] += float(c.sum())  # noqa: E702
            d["s00"] += float((a * a).sum()); d["s11"] += float((c * c).sum()); d["s01"] += float((a * c).sum())  # noqa: E702

    def conformance(self, b: float) -> dict[str, Any]:
        d = self.diag
        out: dict[str, Any] = {"entries": d["entries"]}
        if d["entries"] == 0:
            return out
        out["zero_fraction"] = d["zeros"] / d["entries"]
        out["mean_abs_over_scale"] = d["abs_sum"] / d["entries"] / b
        if d["s00"] > 0 and d["s11"] > 0:
            n = d["rows"]
            cov = d["s01"] / n - (d["s0"] / n) * (d["s1"] / n)
            v0 = d["s00"] / n - (d["s0"] / n) ** 2
            v1 = d["s11"] / n - (d["s1"] / n) ** 2
            out["class_correlation"] = cov / math.sqrt(v0 * v1) if v0 > 0 and v1 > 0 else 1.0
        problems = []
        if out["zero_fraction"] > 0.01:
            problems.append("empty cells released exact zeros: histogram noise missing")
        if abs(out["mean_abs_over_scale"] - 1.0) > 0.1:
            problems.append(f"mean |noise| is {out['mean_abs_over_scale']:.2f} x the claimed scale")
        if abs(out.get("class_correlation", 0.0)) > 0.2:
            problems.append("noise correlated across predicted classes")
        out["ok"] = not problems
        out["problems"] = problems
        return out


def augment(data, audit: AuditSpec, rng: np.random.Generator):  # noqa: ANN001, ANN201
    """Canaries and the augmented dataset.

    Returns:
        ``(augmented TabularData, S (m,) in {-1, +1}, canary features (m, d) float32)``.
    """
    check_auditable(data, audit)
    m = audit.canaries
    test = np.asarray(data.splits["test"])
    rows = rng.choice(test, size=m, replace=len(test) < m)
    Xc = (np.asarray(data.X[rows], dtype=np.float32) * np.float32(audit.scale)).reshape(m, -1)
    S = np.where(rng.random(m) < 0.5, 1, -1)
    inc = np.flatnonzero(S == 1)
    X = np.concatenate([np.asarray(data.X), Xc[inc].reshape((len(inc), *data.X.shape[1:]))])
    aug = with_canaries(data, audit, X, inc, feature_names=data.feature_names)
    return aug, S, Xc


def run_audit(prep, audit: AuditSpec) -> AuditResult:  # noqa: ANN001
    """Audit the prepared run (:func:`raco_cli.run.prepare.prepare_run`) with m canaries.

    Raises:
        UnsupportedError: ``target=histogram`` and the method releases no histogram (only
            ``raco_dp`` with a constraint does), ``target=gradient`` and a method or model it
            does not support, or the data is not tabular.
    """
    if audit.target == "gradient":
        return run_gradient_audit(prep, audit)
    import dp_accounting as dpa
    import torch

    from raco_cli.methods.planning import run_event
    from raco_cli.privacy import accountant, events

    if prep.spec.method.name != "raco_dp" or not prep.constrained:
        raise UnsupportedError(
            f"raco audit audits the private histogram of RaCO-DP: it needs method=raco_dp and a rate constraint "
            f"(got method={prep.spec.method.name}, constraint={prep.spec.constraint.name}); "
            "audit.target=gradient audits the gradient release."
        )
    ss = np.random.SeedSequence(audit.seed).spawn(2)
    rng_canaries, rng_ties = np.random.default_rng(ss[0]), np.random.default_rng(ss[1])
    data, S, Xc = augment(prep.data, audit, rng_canaries)
    m = audit.canaries
    base = prep.constraints
    cons = base.with_audit_cells(m, label=audit.label)
    steps = prep.plan.steps
    # evaluation is not part of the mechanism: only at the start and the end (it is slow with
    # m extra groups); the reported checkpoint is the last
    spec = replace(prep.plan.spec, eval_every=steps, selection="last")
    n_train = len(data.splits["train"])
    q = min(1.0, spec.batch_size / n_train)
    b = float(spec.hist_noise_multiplier)
    event = run_event(prep.method, spec, q, steps, constrained=True)
    eps_acc = accountant.epsilon(event, prep.plan.spec.accounting_delta(prep.spec.delta), discretization=prep.spec.discretization)
    # the histogram releases alone (what the scores look at): a tighter reference
    hist_event = events.repeated(dpa.PoissonSampledDpEvent(q, dpa.LaplaceDpEvent(b)), steps)
    eps_hist = accountant.epsilon(hist_event, prep.spec.delta, discretization=prep.spec.discretization)

    from raco_cli import models

    model = models.build(prep.spec.model["name"], input_shape=data.input_shape, n_classes=data.n_classes, options=prep.spec.model)
    scorer = _CanaryScores(
        first_cell=base.Q, m=m, X=torch.as_tensor(Xc, device=prep.device), model=model, q=q, b=b,
        temperature=spec.temperature, hard=spec.dual == "hard", out_mask=S == -1,
    )
    log.info("Audit run: m=%d canaries (%d included), T=%d, q=%.4g, mechanism=%s", m, int((S == 1).sum()), steps, q, audit.mechanism)
    with histogram_mechanism(audit.mechanism):
        prep.method.fit(data, model, cons, spec, steps=steps, seeds=prep.seeds, device=prep.device, reporter=scorer)

    return build_result(
        prep, audit, spec, S=S, scores={name: scorer.scores[name].numpy() for name in SCORES}, rng=rng_ties, q=q,
        event=event, eps_accounted=eps_acc, eps_released=eps_hist, eps_histogram=eps_hist, hist_noise_multiplier=b,
        conformance=scorer.conformance(b), settings={"histogram_releases": scorer.releases},
    )
