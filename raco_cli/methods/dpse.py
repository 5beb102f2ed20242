"""DPSE: group-aware privacy-budget tailoring (``papers/dpse-privacy-budget-tailoring.txt``):
linear regression as in the paper (``task=regression``) and its extension to logistic
regression / classifiers, accounted under record-level add/remove DP with parallel
composition over the (disjoint) groups.

Stage 1 (paper Alg. 1; a share ``tau`` = ``options.se_share`` of the zCDP budget rho):

* noisy group counts ``n~_k`` (Gaussian, l2 sensitivity 1, ``options.count_noise_multiplier``;
  drawn as exact integers from the discrete Gaussian it covers, :mod:`raco_cli.privacy.discrete`):
  the paper treats the n_k as public; under add/remove they are not, so every later use of a
  group size (normalising sums, the weights n_k/n) reads these noisy counts instead;
* a private *precursor* OLS by Analyze-Gauss (Lemma C.1): rows ``x~ = [x, 1]`` are clipped to
  ``|x~| <= U`` (``options.row_bound``; the paper's "U bounds the values" is private only as a
  norm bound), ``X^T X + N`` (symmetric noise, sensitivity U^2) and ``X^T Y + N`` (sensitivity
  U V) with ``Y`` the real-valued target clipped to ``[-V, V]`` (``options.target_bound``, 0 = U)
  under ``task=regression`` (the paper's precursor), the one-hot labels (V = 1: a linear
  probability model) otherwise; each with rho = tau/4; ``beta = (X^T X + r I)^-1 X^T Y`` with a
  public ridge r (post-processing) large enough for the noise (``options.precursor_ridge``,
  default 3 * noise std * sqrt(d));
* per group k a private "standard error" from bounded residuals of the precursor:
  regression: the squared residual ``min((t_i - x~_i beta)^2, B)`` (Alg. 1 l. 17, clipped at
  the loss bound B = Delta^2, so the noise ``Delta^4 / (2 tau_k)`` of l. 17 has sensitivity
  Delta^2); classification: the Brier residual ``min(|e_{y_i} - clip(p_i)|^2 / 2, 1)``
  (sensitivity 1).  ``S_k = sum_{i in k} r_i + N(0, (nm_S * sens)^2)`` with rho = tau/2,
  ``s_k = sqrt(S_k / n~_k)``; any ``S_k <= 0`` (or a singular precursor) falls back to
  ``s = 1/sqrt(K) 1`` (paper l. 12, l. 19).

Stage 2 (paper Alg. 2 and 3, full-batch DP gradient descent with budget mu = (1 - tau) rho):
per step and group k, with budget weight ``w_k``:

* ``M1_k = sum_{i in k} clip_C(grad l_i) + N(0, (nm_k C)^2)`` (``method.clip_norm`` C), l the
  squared error ``(<theta, x_i> - t_i)^2`` (regression, Alg. 3 l. 6) or the cross-entropy;
* with the bounded-group-loss penalty (``options.bgl_penalty`` G > 0, Alg. 2) also
  ``M2_k = sum_{i in k} clip(l_i, 0, B) + N(0, (nm_k B)^2)`` (``options.loss_bound`` B, 0 = C^2
  for regression (Delta^2, Alg. 2 l. 13), 3 ln(#classes) for classification), each release
  rho ``w_k mu / (2T)``: ``nm_k = sqrt(T / (w_k mu))``; without it (G = 0, Alg. 3) the gradient
  alone, rho ``w_k mu / T``: ``nm_k = sqrt(T / (2 w_k mu))``;
* objective h = f(L) + G max(0, g(L)) with L_k the group mean losses, ``f = sum_k (n_k/n) L_k``
  (the pooled mean) and ``g = max_k (L_k - eta)``; its gradient
  ``sum_k (n_k/n) grad L_k + G 1[g >= 0] grad L_{k*}`` (paper eq. 1-2, Alg. 2 l. 17) from the
  noisy ``M1_k / n~_k``, ``M2_k / n~_k``; ``theta <- Pi(theta - lr_t grad)``, ``lr_t = lr / sqrt(t)``,
  Pi the box ``[-R, R]^P`` (``options.param_bound``).

The paper's ambiguities, each with an option (docs/dpse.md, section 2): ``group_objective``
(``pooled``: f the pooled mean loss, Alg. 3's ``M 1_K`` of group *sums*; ``group_mean``: Alg. 2
l. 10 normalises each group's gradient by its own n_k and f averages the K group losses, so every
group weighs 1/K), ``residual_clip`` (``delta_squared``: Alg. 1 l. 17's squared residual clipped at
Delta^2, the sensitivity its noise ``Delta^4 / (2 tau_k)`` implies; ``delta``: at Delta, as printed,
:func:`residual_sensitivity`) and ``init`` (``model``: theta_1 the seeded init, Alg. 2 l. 4's
"arbitrarily"; ``precursor``: theta_1 = the precursor beta~, post-processing of stage 1).

Budget weights (``options.allocation``): the paper gives group k the share
``w_k = s_k^2 / sum_j s_j^2`` (``sum``) and accounts the groups sequentially.  The groups are
disjoint, so a record is in exactly one group's releases and the guarantee is the *worst case
over groups* (parallel composition).  Because w_k is itself a DP output, the plan must hold for
every value it can take: the only data-independent bound is w_k <= 1, so ``sum`` is accounted
as if every group spent mu (it spends less: the paper's normalisation wastes budget under
parallel composition).  ``max`` normalises ``w_k = s_k^2 / max_j s_j^2``: still proportional to
s_k^2, and the worst-case group (w = 1) spends exactly mu.  A Gaussian with more noise is a
post-processing of one with less, so the w = 1 event dominates every group's releases
(adaptive composition of dominating pairs).  ``uniform`` (w_k = 1, no stage 1 except the
counts) is the paper's DPNoSE, "standard linear regression computed via DPGD (budget of rho)":
without the penalty it releases the *pooled* clipped gradient sum once per step (per-group
releases would add K times the noise for the same guarantee).  The worst-case record's run is::

    Composed[Gaussian(nm_count), Gaussian(nm_pre), Gaussian(nm_pre), Gaussian(nm_S),
             SelfComposed(Composed[Gaussian(nm_2), Gaussian(nm_2)], T)]

(without the penalty one Gaussian per step; ``uniform`` has no precursor or SE releases).

``method.noise_multiplier`` is sigma_run: the tau + mu part is equivalent to one Gaussian with
this noise multiplier (rho = 1 / (2 sigma_run^2): zCDP adds over Gaussians, so the paper's
tau/mu split is a split of rho); with ``calibrate_noise: true`` the plan scales it (and the
count noise) so the PLD accountant's epsilon of the tree above meets the target -- no zCDP to
(eps, delta) conversion is needed, the PLD of Gaussians is exact.  With ``privacy.rho`` the
target is the eps of the rho-zCDP Gaussian, so the calibrated run is exactly rho-zCDP, counts
included (docs/dpse.md).
"""

from __future__ import annotations

import math
import time
from typing import Any

import dp_accounting as dpa
import numpy as np
import torch
from torch import nn

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.data.types import TabularData
from raco_cli.errors import ConfigError, UnsupportedError
from raco_cli.methods import training
from raco_cli.methods.base import MethodSpec, Reporter, Seeds, TrainResult, read_options
from raco_cli.methods.gradients import engine_for, loss_of, squared_error
from raco_cli.methods.timing import StepClock
from raco_cli.privacy import releases
from raco_cli.privacy.discrete import discrete_gaussian, discrete_gaussian_for
from raco_cli.privacy.mechanisms import NoiseSource, gaussian_noise, noise_source

NAME = "dpse"
PRIVATE = True
TASKS = ("classification", "regression")  # task=regression: squared loss on the linear model (docs/dpse.md)
FULL_BATCH = True

ALLOCATIONS = ("max", "sum", "uniform")
GROUP_OBJECTIVES = ("pooled", "group_mean")
RESIDUAL_CLIPS = ("delta_squared", "delta")
INITS = ("model", "precursor")
DEFAULTS: dict[str, Any] = {
    "se_share": 0.2,
    "allocation": "max",
    "target_bound": 0.0,
    "bgl_penalty": 1.0,
    "bgl_eta": 0.0,
    "loss_bound": 0.0,
    "row_bound": 4.0,
    "precursor_ridge": 0.0,
    "count_noise_multiplier": 100.0,
    "param_bound": 5.0,
    "lr_decay": "sqrt",
    # the paper's ambiguities (docs/dpse.md, section 2): each option's other value is the other reading
    "group_objective": "pooled",      # f = sum_k (n_k/n) L_k (Alg. 3's pooled sum) | group_mean: f = (1/K) sum_k L_k (Alg. 2 l. 10)
    "residual_clip": "delta_squared",  # Alg. 1 l. 17: squared residual clipped at Delta^2 (what its noise implies) | delta (as printed)
    "init": "model",                  # Alg. 2 l. 4 "arbitrarily set theta_1": the model's seeded init | precursor: theta_1 = beta~
}


def options(spec: MethodSpec) -> dict[str, Any]:
    """Validated options with defaults (``loss_bound`` / ``precursor_ridge`` 0 = automatic)."""
    o = read_options(spec, DEFAULTS)
    if not 0 < o["se_share"] < 1:
        raise ConfigError(f"method.options.se_share must be in (0, 1) (got {o['se_share']}); it is the share tau of the budget spent on stage 1.")
    if o["allocation"] not in ALLOCATIONS:
        raise ConfigError(f"method.options.allocation must be one of {', '.join(ALLOCATIONS)} (got {o['allocation']!r}); "
                          "max: w_k = s_k^2 / max_j s_j^2, sum: the paper's s_k^2 / sum_j s_j^2, uniform: DPNoSE.")
    if o["lr_decay"] not in ("sqrt", "none"):
        raise ConfigError(f"method.options.lr_decay must be one of sqrt, none (got {o['lr_decay']!r}).")
    for key, choices, meaning in (
        ("group_objective", GROUP_OBJECTIVES, "pooled: the pooled mean loss (Alg. 3); group_mean: the mean of the group means (Alg. 2 l. 10)"),
        ("residual_clip", RESIDUAL_CLIPS, "delta_squared: the squared residual clipped at Delta^2; delta: at Delta, as Alg. 1 l. 17 prints"),
        ("init", INITS, "model: the seeded initialisation; precursor: theta_1 = the stage-1 precursor beta (regression)"),
    ):
        if o[key] not in choices:
            raise ConfigError(f"method.options.{key} must be one of {', '.join(choices)} (got method.options.{key}={o[key]!r}); {meaning}.")
    if o["init"] == "precursor" and o["allocation"] == "uniform":
        raise ConfigError("method.options.init=precursor needs stage 1 (method.options.allocation=sum or max); "
                          "allocation=uniform (DPNoSE) computes no precursor. Use method.options.init=model.")
    for key in ("bgl_penalty", "loss_bound", "precursor_ridge", "target_bound"):
        if o[key] < 0:
            raise ConfigError(f"method.options.{key} must be >= 0 (got method.options.{key}={o[key]}).")
    for key in ("row_bound", "count_noise_multiplier", "param_bound"):
        if o[key] <= 0:
            raise ConfigError(f"method.options.{key} must be > 0 (got method.options.{key}={o[key]}).")
    return o


def validate(spec: MethodSpec, constraints: ConstraintSet, data: TabularData | None = None) -> None:
    """DPSE optimises its own bounded-group-loss objective: no rate constraint.

    Raises:
        UnsupportedError: a rate constraint is requested.
        ConfigError: bad options, or no fixed number of steps.
    """
    options(spec)
    if not constraints.is_empty:
        family = constraints.constraints[0].family
        raise UnsupportedError(
            f"method=dpse does not model the rate constraint '{family}' (its fairness notion is bounded group loss, "
            "set by method.options.bgl_penalty and bgl_eta). Use constraint=none."
        )
    if options(spec)["init"] == "precursor" and data is not None and data.target is None:
        raise ConfigError("method.options.init=precursor needs task=regression (the precursor is a linear regression; "
                          "for classification it is a linear probability model). Use method.options.init=model.")
    if spec.steps is None:
        raise ConfigError(
            "method.steps must be set for dpse (got null): it is full-batch, so the budget fixes the noise "
            "(method.calibrate_noise=true), not the number of steps."
        )


def budget_split(spec: MethodSpec) -> tuple[float, float]:
    """``(tau, mu)`` in zCDP units: ``rho = 1 / (2 sigma_run^2)``, tau = se_share * rho.

    With ``allocation: uniform`` there is no stage 1 (tau = 0, mu = rho).
    """
    o = options(spec)
    rho = 1.0 / (2.0 * spec.required("noise_multiplier") ** 2)
    if o["allocation"] == "uniform":
        return 0.0, rho
    return o["se_share"] * rho, (1.0 - o["se_share"]) * rho


def _nm(rho: float) -> float:
    """Noise multiplier of a Gaussian release that is rho-zCDP: 1 / sqrt(2 rho)."""
    return 1.0 / math.sqrt(2.0 * rho)


def penalized(spec: MethodSpec) -> bool:
    """Whether stage 2 has the bounded-group-loss penalty (Alg. 2: group losses are released too)."""
    return options(spec)["bgl_penalty"] > 0


def pooled(spec: MethodSpec) -> bool:
    """DPNoSE without the penalty, on the pooled objective: one release of the pooled clipped
    gradient sum per step."""
    o = options(spec)
    return o["allocation"] == "uniform" and not penalized(spec) and o["group_objective"] == "pooled"


def residual_sensitivity(o: dict[str, Any], bound: float) -> tuple[float, float]:
    """``(clip, sensitivity)`` of a squared residual in the stage-1 sums (regression).

    ``delta_squared``: clipped at B = Delta^2, sensitivity B (Alg. 1 l. 17's noise
    ``Delta^4 / (2 tau_k)`` has exactly this sensitivity).  ``delta``: clipped at Delta = sqrt(B)
    as printed, sensitivity Delta; the noise is the printed one (Delta^2) when Delta >= 1, where it
    over-covers Delta, and Delta's own below 1, where the printed noise would not cover it.

    >>> residual_sensitivity({"residual_clip": "delta_squared"}, 4.0), residual_sensitivity({"residual_clip": "delta"}, 4.0)
    ((4.0, 4.0), (2.0, 4.0))
    >>> residual_sensitivity({"residual_clip": "delta"}, 0.25)
    (0.5, 0.5)
    """
    if o["residual_clip"] == "delta":
        delta = math.sqrt(bound)
        return delta, max(delta, bound)
    return bound, bound


def noise_multipliers(spec: MethodSpec, steps: int) -> dict[str, float]:
    """Noise multipliers of every release, for the worst-case group (w = 1)."""
    o = options(spec)
    tau, mu = budget_split(spec)
    per_step = 2.0 if penalized(spec) else 1.0  # releases per step and group: gradient (+ loss)
    out = {"count": o["count_noise_multiplier"], "stage2": _nm(mu / (per_step * steps))}
    if tau > 0:
        out.update(precursor=_nm(tau / 4.0), se=_nm(tau / 2.0))
    return out


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = False) -> dpa.DpEvent:
    """One stage-2 step for a record of the worst-case group: its group's gradient (and loss) sums."""
    g = dpa.GaussianDpEvent(noise_multipliers(spec, spec.steps or 1)["stage2"])
    return dpa.ComposedDpEvent([g, g]) if penalized(spec) else g


def run_event(spec: MethodSpec, sample_rate: float, steps: int, *, constrained: bool = False) -> dpa.DpEvent:
    """The releases a record of the worst-case group takes part in (module docstring)."""
    nm = noise_multipliers(spec, steps)
    stage1 = [dpa.GaussianDpEvent(nm["count"])]
    if "precursor" in nm:
        stage1 += [dpa.GaussianDpEvent(nm["precursor"])] * 2 + [dpa.GaussianDpEvent(nm["se"])]
    g = dpa.GaussianDpEvent(nm["stage2"])
    step = dpa.ComposedDpEvent([g, g]) if penalized(spec) else g
    return dpa.ComposedDpEvent([*stage1, dpa.SelfComposedDpEvent(step, int(steps))])


def budget_weights(s: torch.Tensor, allocation: str) -> torch.Tensor:
    """Budget weights w_k in (0, 1] from the standard errors s_k (module docstring).

    >>> s = torch.tensor([1.0, 2.0], dtype=torch.float64)
    >>> budget_weights(s, "max").tolist(), budget_weights(s, "sum").tolist()
    ([0.25, 1.0], [0.2, 0.8])
    """
    if allocation == "uniform":
        return torch.ones_like(s)
    sq = s**2
    return sq / (sq.sum() if allocation == "sum" else sq.max())


def _sym_noise(d: int, std: float, generator: NoiseSource) -> torch.Tensor:
    """Symmetric Gaussian noise: i.i.d. upper triangle (with diagonal), mirrored (Analyze-Gauss)."""
    z = gaussian_noise((d, d), std, generator, dtype=torch.float64)
    upper = torch.triu(z)
    return upper + torch.triu(z, diagonal=1).t()


@torch.no_grad()
def precursor_weights(
    X: torch.Tensor, Y: torch.Tensor, groups: torch.Tensor, counts: torch.Tensor,
    *, o: dict[str, Any], nm: dict[str, float], generator: NoiseSource, regression: bool = False, bound: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Stage 1 after the counts: private precursor, per-group s_k, budget weights w_k.

    Args:
        X: (n, d) features; Y: (n, m) the one-hot labels, or (n, 1) the real-valued target
            (``regression``).
        bound: the clip of the squared residual (regression: B, the loss bound).

    Returns:
        ``(w, s, info)``: w (k,) in (0, 1] (:func:`budget_weights`); s (k,) the private
        standard errors; info: the public ridge, the noisy sums ``se_sums`` and ``se_fallback``.
    """
    k = len(counts)
    dev = X.device
    Xt = torch.cat([X.double(), torch.ones(len(X), 1, dtype=torch.float64, device=dev)], dim=1)
    U = o["row_bound"]
    V = (o["target_bound"] or U) if regression else 1.0  # |y| <= V: one-hot rows have norm 1
    Xt = Xt * torch.clamp(U / (Xt.norm(dim=1, keepdim=True) + 1e-12), max=1.0)
    Y = Y.double()
    Yc = Y.clamp(-V, V) if regression else Y
    d, m = Xt.shape[1], Y.shape[1]
    std_xx, std_xy = nm["precursor"] * U * U, nm["precursor"] * U * V
    XX_exact, XY_exact = Xt.t() @ Xt, Xt.t() @ Yc
    XX = releases.release("precursor_xx", lambda: XX_exact + _sym_noise(d, std_xx, generator).to(dev))
    XY = releases.release("precursor_xy", lambda: XY_exact + gaussian_noise((d, m), std_xy, generator, dtype=torch.float64).to(dev))
    ridge = o["precursor_ridge"] or 3.0 * std_xx * math.sqrt(d)
    info: dict[str, Any] = {"precursor_ridge": float(ridge)}
    try:
        beta = torch.linalg.solve(XX + ridge * torch.eye(d, dtype=torch.float64, device=dev), XY)
    except RuntimeError:  # singular even with the ridge: uniform weights (post-processing)
        beta = None
    if regression:
        clip, B = residual_sensitivity(o, bound)
        pred = Xt @ beta if beta is not None else torch.zeros_like(Y)
        r = ((Y - pred) ** 2).sum(dim=1).clamp(max=clip)  # squared residual clipped at Delta^2 (or Delta: Alg. 1 l. 17)
    else:
        B = 1.0
        p = (Xt @ beta).clamp(0.0, 1.0) if beta is not None else torch.full_like(Y, 1.0 / m)
        r = (((Y - p) ** 2).sum(dim=1) / 2.0).clamp(max=1.0)  # Brier residual, sensitivity 1
    S_exact = torch.zeros(k, dtype=torch.float64, device=dev).index_add_(0, groups, r)
    S = releases.release("group_se", lambda: S_exact + gaussian_noise((k,), nm["se"] * B, generator, dtype=torch.float64).to(dev))
    info["se_sums"] = [float(v) for v in S.cpu()]
    if beta is not None:  # post-processing of the two precursor releases (options.init=precursor)
        info["precursor_beta"] = [float(v) for v in beta[:, 0].cpu()]
    if beta is None or bool((S <= 0).any()):  # paper l. 12 and l. 19: no information, 1/sqrt(K) 1
        s = torch.full((k,), 1.0 / math.sqrt(k), dtype=torch.float64, device=dev)
        return budget_weights(s, o["allocation"]), s, {**info, "se_fallback": 1.0}
    s = torch.sqrt(S / counts)
    return budget_weights(s, o["allocation"]), s, {**info, "se_fallback": 0.0}


def residual_bound(o: dict[str, Any], *, regression: bool, clip_norm: float, n_classes: int = 2) -> float:
    """B: the bound of a per-example loss release (``options.loss_bound``; 0 = automatic:
    ``C^2`` for the squared error (the paper's Delta^2 with Delta = C), ``3 ln K`` for the
    cross-entropy)."""
    if o["loss_bound"]:
        return float(o["loss_bound"])
    return clip_norm**2 if regression else 3.0 * math.log(max(n_classes, 2))


def fit(
    data: TabularData,
    model: torch.nn.Module,
    constraints: ConstraintSet,
    spec: MethodSpec,
    *,
    steps: int,
    seeds: Seeds,
    device: torch.device,
    reporter: Reporter,
) -> TrainResult:
    validate(spec, constraints, data)
    if spec.clip_norm is None or spec.noise_multiplier is None:
        raise ValueError("dpse needs clip_norm and noise_multiplier")
    o = options(spec)
    nm = noise_multipliers(spec, steps)
    tau, mu = budget_split(spec)
    regression = data.target is not None
    train_idx = np.asarray(data.splits["train"])
    n, k, n_cls = len(train_idx), data.n_groups, data.n_classes
    groups_np = data.group[train_idx]
    rows = training.Rows(data, train_idx, groups_np, device)
    members = [torch.as_tensor(np.flatnonzero(groups_np == j), device=device) for j in range(k)]

    training.initialize(model, seeds.init)
    model.to(device)
    engine = engine_for(model, micro_batch=spec.micro_batch, loss=loss_of(data.task))
    optimizer = training.make_optimizer(engine.params, spec)
    g_noise = noise_source(seeds.noise, device, secure=spec.secure_rng)
    per_group = [dict.fromkeys(("gaussian_count", "gaussian_precursor", "gaussian_group_se", "gaussian_gradient", "gaussian_group_loss"), 0) for _ in range(k)]
    C = spec.clip_norm
    B = residual_bound(o, regression=regression, clip_norm=C, n_classes=n_cls)
    G = o["bgl_penalty"]
    one_release = pooled(spec)

    def released(kind: str, groups: range | list[int]) -> None:
        for j in groups:
            per_group[j][kind] += 1

    t0 = time.perf_counter()
    # stage 1: noisy counts (one per group: parallel), precursor (all rows), per-group SE
    counts = torch.as_tensor(np.bincount(groups_np, minlength=k), dtype=torch.int64, device=device)
    sigma_z = discrete_gaussian_for(nm["count"])  # exact integer noise, covered by GaussianDpEvent(nm["count"])
    counts = releases.release(
        "group_counts", lambda c=counts: (c + discrete_gaussian((k,), sigma_z, g_noise).to(device)).to(torch.float64)  # type: ignore[misc]
    ).clamp(min=1.0)
    released("gaussian_count", range(k))
    info: dict[str, Any] = {}
    if o["allocation"] != "uniform":
        X_all = rows.features(torch.arange(n, device=device)).flatten(1)
        Y_all = rows.y[:, None] if regression else nn.functional.one_hot(rows.y, n_cls)
        w, s, info = precursor_weights(
            X_all, Y_all, rows.cells, counts, o=o, nm=nm, generator=g_noise, regression=regression, bound=B
        )
        released("gaussian_precursor", range(k))
        released("gaussian_precursor", range(k))
        released("gaussian_group_se", range(k))
    else:
        w = torch.ones(k, dtype=torch.float64, device=device)
        s = torch.full((k,), 1.0 / math.sqrt(k), dtype=torch.float64, device=device)
    stage1_ms = 1000.0 * (time.perf_counter() - t0)
    if o["init"] == "precursor":  # theta_1 = beta~ (Alg. 2 l. 4; post-processing of stage 1), onto the box
        _init_from_precursor(engine, info.get("precursor_beta"), o["param_bound"])
    nm_k = [nm["stage2"] / math.sqrt(float(wj)) for wj in w.cpu()]
    n_noisy = float(counts.sum())
    # full batch: every step sees the same rows, gathered once
    all_rows = rows.batch(torch.arange(n, device=device), labels=True) if one_release else None
    batches = [] if one_release else [rows.batch(idx, labels=True) if len(idx) else None for idx in members]

    checkpoints = training.Checkpoints(engine, model, data, constraints, spec, device=device, reporter=reporter,
                                       selection_seed=seeds.selection, steps=steps)
    zero = torch.zeros((), device=device)
    clipped, nonfinite, penalty_on = zero.long(), zero.long(), 0
    penalized = [0] * k  # steps on which each group was the penalised k* (a function of the noisy losses)
    clock = StepClock()
    checkpoints.record(0, [])
    for t in range(1, steps + 1):
        t1 = time.perf_counter()
        if all_rows is not None:  # DPNoSE (Alg. 3 with s_k = 1/sqrt(K) pooled): one noisy sum, all rows
            g_sum, clipped, nonfinite = _clipped(engine, all_rows, C, clipped, nonfinite)
            g_noisy = releases.release(
                "gradient", lambda sums=g_sum, std=nm["stage2"] * C: [gs + gaussian_noise(tuple(gs.shape), std, g_noise, dtype=gs.dtype) for gs in sums]  # type: ignore[misc]
            )
            released("gaussian_gradient", range(k))
            total = [gn / n_noisy for gn in g_noisy]
        else:
            grads_k, loss_k = [], []
            for j in range(k):
                b = batches[j]
                if b is not None:
                    g_sum, clipped, nonfinite = _clipped(engine, b, C, clipped, nonfinite)
                    loss_sum = _loss_sum(engine, b, B, regression=regression) if G > 0 else zero
                else:  # an empty group: its sums are pure noise
                    g_sum, loss_sum = [torch.zeros_like(p) for p in engine.params], zero
                std_g, std_l = nm_k[j] * C, nm_k[j] * B
                g_noisy = releases.release(
                    "group_gradient", lambda sums=g_sum, std=std_g: [gs + gaussian_noise(tuple(gs.shape), std, g_noise, dtype=gs.dtype) for gs in sums]  # type: ignore[misc]
                )
                released("gaussian_gradient", [j])
                n_j = float(counts[j])
                grads_k.append([gn / n_j for gn in g_noisy])
                if G > 0:
                    l_noisy = releases.release(
                        "group_loss", lambda total=loss_sum, std=std_l: total + gaussian_noise((), std, g_noise, dtype=torch.float32).to(device)  # type: ignore[misc]
                    )
                    released("gaussian_group_loss", [j])
                    loss_k.append(float(l_noisy) / n_j)
            # f = the pooled mean: sum_k (n~_k / n~) M1_k / n~_k; group_mean: (1/K) sum_k M1_k / n~_k
            weight = [1.0 / k if o["group_objective"] == "group_mean" else float(counts[j]) / n_noisy for j in range(k)]
            total = [sum(weight[j] * grads_k[j][i] for j in range(k)) for i in range(len(engine.params))]
            if G > 0:  # bounded group loss (paper eq. 1-2): g = max_k (L_k - eta)
                gaps = [lk - o["bgl_eta"] for lk in loss_k]
                worst = int(np.argmax(gaps))
                if gaps[worst] >= 0:
                    penalty_on += 1
                    penalized[worst] += 1
                    total = [tot + G * gw for tot, gw in zip(total, grads_k[worst])]
        decay = 1.0 / math.sqrt(t) if o["lr_decay"] == "sqrt" else 1.0
        optimizer.step(total, scale=decay)
        with torch.no_grad():  # projection onto the box C_P = [-R, R]^P
            for p in engine.params:
                p.clamp_(-o["param_bound"], o["param_bound"])
        clock.add(time.perf_counter() - t1)
        reporter.on_step(t, steps, {"penalty": float(penalty_on)})
        if t % spec.eval_every == 0 or t == steps:
            checkpoints.record(t, [])

    history, selected, state = checkpoints.finish()
    if any(pg != per_group[0] for pg in per_group):  # every record takes part in the same releases
        raise RuntimeError(f"unequal per-group releases: {per_group}")
    T = max(steps, 1)
    names = data.group_names
    by_group = lambda values: {nm_: float(v) for nm_, v in zip(names, values)}  # noqa: E731
    return TrainResult(
        history=history,
        selected=selected,
        steps=steps,
        lam=[],
        state_dict=state,
        stats={
            "mean_batch_size": float(n),
            "clip_fraction": float(clipped) / max(n * T, 1),
            "nonfinite_rows": float(nonfinite),
            "time_per_step_ms": clock.steady_ms,  # first (warm-up) step excluded
            "first_step_ms": clock.first_ms,
            "stage1_ms": stage1_ms,
            "sample_rate": 1.0,
            "rho_total": tau + mu,
            "rho_stage1": tau,
            "rho_stage2": mu,
            "penalty_active_fraction": penalty_on / T,
            "penalized_groups": by_group(c / T for c in penalized),
            "budget_weights": by_group(w.cpu()),
            "standard_errors": by_group(s.cpu()),
            "noise_multipliers": by_group(nm_k),
            "rho_realized": by_group(tau + float(v) * mu for v in w.cpu()),
            **{key: value for key, value in info.items() if key != "precursor_beta"},
        },
        releases=dict(per_group[0]),
    )


@torch.no_grad()
def _init_from_precursor(engine, beta: list[float] | None, bound: float) -> None:
    """Set a linear model to the precursor's coefficients ``beta = (w, intercept)``: the weight
    row(s) to w, the bias (if any) to the intercept; the model's own init when stage 1 fell back."""
    if beta is None:
        return
    params = list(engine.params)
    weight = params[0]
    w = torch.as_tensor(beta[: weight.shape[-1]], dtype=weight.dtype, device=weight.device)
    weight.copy_(w.expand_as(weight).clamp(-bound, bound))
    if len(params) > 1:
        params[1].fill_(max(-bound, min(bound, beta[-1])))


def _clipped(engine, b: dict[str, torch.Tensor], C: float, clipped: torch.Tensor, nonfinite: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The clipped per-example gradient sum of a batch, and the running clip statistics."""
    res = engine.clipped_sum(**b, c=None, reg_scale=0.0, temperature=1.0, clip_norm=C)
    return res.grads, clipped + res.clipped, nonfinite + res.nonfinite


@torch.no_grad()
def _loss_sum(engine, b: dict[str, torch.Tensor], B: float, *, regression: bool) -> torch.Tensor:
    """``sum_i clip(l_i, 0, B)`` of a batch (non-finite losses count B)."""
    z = engine.logits(b["X"])
    loss = squared_error(z, b["y"]) if regression else nn.functional.cross_entropy(z, b["y"], reduction="none")
    return torch.nan_to_num(loss, nan=B, posinf=B).clamp(0.0, B).sum()
