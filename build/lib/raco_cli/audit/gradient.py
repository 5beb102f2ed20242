"""One-training-run privacy audit of the gradient release with white-box Dirac canaries
(Steinke, Nasr, Jagielski, NeurIPS 2023, Section 6: white-box gradient canaries).

The histogram audit (:mod:`raco_cli.audit.one_run`) cannot see the gradient path; this one
audits the noisy clipped gradient sum of ``raco_dp`` and ``dp_sgd`` (logistic regression).

1. Every row gets m extra feature columns, zero for the real rows.  Canary i is a record whose
   only non-zero feature is column ``d + i`` (value ``DIRAC * audit.scale``), label
   ``audit.label``, a group (histogram cell) of its own; it is included iff ``S_i = +1``
   (uniform signs from the audit's seed).  A canary's per-sample gradient then lives in
   weight column ``d + i`` (plus a bias part ``1/DIRAC`` as large) and no other record
   touches that column: its clipped contribution is ``C * u_i`` (up to 1e-4) as long as
   ``|p_i - e_y| * value >= C``, with ``u_i = (p_i - e_y) / |p_i - e_y|`` known to the
   auditor from the current parameters (white box).  Its cell carries no constraint weight, so the regularizer leaves it alone.
2. One ordinary training run of the audited configuration on the augmented data; the release
   hook (``on_release(step, "gradient", G)``) sees every noisy gradient sum before the update.
3. Scores per canary, streamed over steps (post-processing of the releases), with
   ``r_{i,t} = <G_t[:, d+i], u_i> / C`` and ``a_{i,t}`` the canary's clipped contribution in
   units of C (1 when clipped):

   * ``sum``: ``sum_t r_{i,t}`` = times sampled + N(0, sigma^2 T) under the claim;
   * ``llr``: ``sum_t log(1 - q + q exp((a r - a^2/2) / sigma^2))``, the exact log-likelihood
     ratio of the claimed subsampled Gaussian release along ``u_i``;
   * ``llr_fit``: the same with sigma replaced by the noise level measured in the release,
     ``1.4826 * MAD_i(r_{i,t})`` over the m canary columns of step t (at most a few percent
     of them hold a sampled canary).  Any function of the releases is a valid score; this one
     is sharp when the noise is smaller than claimed (std sigma instead of sigma C), where the
     claimed-sigma LLR is nearly linear in r and no better than ``sum``.

   A canary's logit moves with the noise in its column (``Dirac * lr * sigma C / (q n)`` per
   step), so its gradient does not stay at full norm; ``a`` is computed exactly from the
   current parameters (white box), which keeps every score valid and only costs power.

4. Guesses: +1 for the k highest scores, 3 scores x 3 values of k fixed in advance, bound at
   Bonferroni level beta / 9 (:func:`raco_cli.audit.stats.eps_lower_bound_one_run`).

The claim compared with the bound is the accounted eps of exactly this run (q = B / (n +
included canaries)); the eps of the gradient releases alone is reported beside it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np

from raco_cli.audit.canaries import check_auditable, with_canaries
from raco_cli.audit.result import build_result
from raco_cli.errors import UnsupportedError
from raco_cli.methods.base import NullReporter

log = logging.getLogger(__name__)

SCORES = ("sum", "llr", "llr_fit")
DIRAC = 100.0  # canary feature value: gradient norm |p - e_y| * 100, clipped unless p is near e_y
METHODS = ("raco_dp", "dp_sgd")


def augment(data, audit, S: np.ndarray):  # noqa: ANN001, ANN201
    """The augmented dataset for the inclusion signs ``S`` (m,) in {-1, +1}: real rows padded
    with m zero columns, then the included canaries (one Dirac feature each).

    Returns:
        ``(augmented TabularData, Xc (m, d + m) float32 rows of all m canaries, d)``.
    """
    check_auditable(data, audit)
    d = int(np.prod(data.X.shape[1:]))
    m, n = audit.canaries, len(data.y)
    value = np.float32(DIRAC * audit.scale)
    inc = np.flatnonzero(S == 1)
    X = np.zeros((n + len(inc), d + m), dtype=np.float32)
    X[:n, :d] = np.asarray(data.X, dtype=np.float32).reshape(n, d)
    X[n + np.arange(len(inc)), d + inc] = value
    Xc = np.zeros((m, d + m), dtype=np.float32)
    Xc[np.arange(m), d + np.arange(m)] = value
    aug = with_canaries(data, audit, X, inc, feature_names=tuple(data.feature_names) + tuple(f"canary{i}" for i in range(m)))
    return aug, Xc, d


class _GradientScores(NullReporter):
    """Release hook: streams the scores per canary from the noisy gradient sums (progress and
    evaluations are dropped)."""

    def __init__(self, *, d: int, m: int, Xc, model, label: int, q: float, sigma: float, clip: float, value: float) -> None:  # noqa: ANN001
        import torch

        self.torch = torch
        self.d, self.m, self.Xc, self.model, self.label = d, m, Xc, model, label
        self.q, self.sigma, self.clip, self.value = q, sigma, clip, value
        self.scores = {name: torch.zeros(m, dtype=torch.float64) for name in SCORES}
        self.releases = 0
        self.contribution_sum = 0.0  # mean a (diagnostic: 1 = every canary gradient clipped)
        self.measured_sigma_sum = 0.0  # mean measured noise multiplier (diagnostic: vs the claimed sigma)

    def on_release(self, step: int, name: str, value) -> None:  # noqa: ANN001
        torch = self.torch
        if name != "gradient":
            return
        self.releases += 1
        weight = value[0].detach().to("cpu", torch.float64)  # (K, d + m): nn.Linear's weight gradient
        cols = weight[:, self.d : self.d + self.m].t()  # (m, K): canary i's column
        with torch.no_grad():
            p = torch.softmax(self.model(self.Xc).double().cpu(), dim=1)
        g = p - torch.nn.functional.one_hot(torch.full((self.m,), self.label), p.shape[1]).double()
        norm = g.norm(dim=1).clamp(min=1e-300)
        u = g / norm[:, None]
        # the canary's clipped gradient along u, in units of C (weight part of its gradient)
        a = torch.minimum(norm * self.value, torch.full_like(norm, self.clip * self.value / math.sqrt(self.value**2 + 1))) / self.clip
        r = (cols * u).sum(dim=1) / self.clip
        self.scores["sum"] += r
        measured = max(1.4826 * float((r - r.median()).abs().median()), 1e-6)
        for name, sigma in (("llr", self.sigma), ("llr_fit", measured)):
            ell = (a * r - a * a / 2) / sigma**2
            self.scores[name] += torch.logaddexp(torch.full_like(ell, math.log1p(-self.q)), math.log(self.q) + ell) if self.q < 1 else ell
        self.contribution_sum += float(a.mean())
        self.measured_sigma_sum += measured


def _conformance(scorer: _GradientScores, sigma: float) -> dict[str, Any]:
    """Diagnostics: the canaries' mean clipped contribution and the noise multiplier measured in
    the canary columns (robust MAD; a few percent of sampled canaries bias it up slightly)."""
    n = max(scorer.releases, 1)
    measured = scorer.measured_sigma_sum / n
    problems = [] if measured >= 0.8 * sigma else [f"measured noise multiplier {measured:.3g} is below the claimed {sigma:g}"]
    return {"gradient_releases": scorer.releases, "mean_canary_contribution_over_c": scorer.contribution_sum / n,
            "claimed_noise_multiplier": sigma, "measured_noise_multiplier": measured, "ok": not problems, "problems": problems}


def run_gradient_audit(prep, audit):  # noqa: ANN001, ANN201
    """Audit the gradient release of the prepared run with m Dirac canaries.

    Raises:
        UnsupportedError: a method other than raco_dp / dp_sgd, or a model other than logreg.
    """
    import dp_accounting as dpa
    import torch

    from raco_cli import models
    from raco_cli.audit.faults import gradient_mechanism
    from raco_cli.methods.planning import run_event
    from raco_cli.privacy import accountant, events

    method = prep.spec.method.name
    if method not in METHODS or prep.spec.model["name"] != "logreg":
        raise UnsupportedError(
            f"audit.target=gradient audits the noisy gradient sum of raco_dp and dp_sgd with model=logreg "
            f"(got method={method}, model={prep.spec.model['name']}); use one of them."
        )
    ss = np.random.SeedSequence(audit.seed).spawn(2)
    rng_signs, rng_ties = np.random.default_rng(ss[0]), np.random.default_rng(ss[1])
    m = audit.canaries
    S = np.where(rng_signs.random(m) < 0.5, 1, -1)
    data, Xc, d = augment(prep.data, audit, S)
    cons = prep.constraints.with_audit_cells(m, label=audit.label)
    steps = prep.plan.steps
    spec = replace(prep.plan.spec, eval_every=steps, selection="last")  # evaluation is not the mechanism
    n_train = len(data.splits["train"])
    q = min(1.0, spec.batch_size / n_train)
    sigma, clip = float(spec.required("noise_multiplier")), float(spec.required("clip_norm"))
    event = run_event(prep.method, spec, q, steps, constrained=prep.constrained)
    eps_acc = accountant.epsilon(event, prep.plan.spec.accounting_delta(prep.spec.delta), discretization=prep.spec.discretization)
    grad_event = events.repeated(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    eps_grad = accountant.epsilon(grad_event, prep.spec.delta, discretization=prep.spec.discretization)

    model = models.build("logreg", input_shape=data.input_shape, n_classes=data.n_classes, options=prep.spec.model)
    value = DIRAC * audit.scale
    scorer = _GradientScores(d=d, m=m, Xc=torch.as_tensor(Xc, device=prep.device), model=model, label=audit.label, q=q,
                             sigma=sigma, clip=clip, value=value)  # fmt: skip
    log.info("Gradient audit: m=%d Dirac canaries (%d included), T=%d, q=%.4g, C=%g, sigma=%g, mechanism=%s",
             m, int((S == 1).sum()), steps, q, clip, sigma, audit.mechanism)
    with gradient_mechanism(audit.mechanism, clip_norm=clip, expected_batch=q * n_train):
        prep.method.fit(data, model, cons, spec, steps=steps, seeds=prep.seeds, device=prep.device, reporter=scorer)

    return build_result(
        prep, audit, spec, S=S, scores={k: v.numpy() for k, v in scorer.scores.items()}, rng=rng_ties, q=q, event=event,
        eps_accounted=eps_acc, eps_released=eps_grad, eps_histogram=None,
        hist_noise_multiplier=spec.hist_noise_multiplier if prep.constrained and method == "raco_dp" else None,
        conformance=_conformance(scorer, sigma),
        settings={"gradient_releases": scorer.releases, "noise_multiplier": sigma, "clip_norm": clip, "dirac_value": value},
    )
