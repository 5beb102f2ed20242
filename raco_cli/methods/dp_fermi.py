"""DP-FERMI (Lowy, Gupta, Razaviyayn, ICLR 2023): private SGDA on the FERMI min-max objective.

Objective (their eq. 2, FERMI's ERMI estimator with the *full* class-probability vector)::

    min_theta max_{W in R^{k x l}, |W|_F <= D}  (1/n) sum_i [ CE_i(theta) + lam * psi_i(theta, W) ]

    psi_i = sum_j F_ij * (2 W[g_i, j] / sqrt(p_{g_i}) - |W[:, j]|^2) - 1

with ``F_i = softmax(h(x_i))`` (l classes; binary tasks use both columns [1-p, p]), ``g_i`` the
group of row i and ``p_r`` the group proportions.  ``max_W`` of the mean of psi is the ERMI
of the soft predictions, a chi^2 measure of dependence between prediction and group (zero iff
demographic parity holds for the soft predictions).  W is groups x classes: the released
code's l x l (1 x 1 for binary) W with a trace over a non-square matrix keeps only one
(class, group) cell and is *not* reproduced here (see ``/work/notes/dp_fermi.md`` section 4).

One step (their Algorithm 1, with record-level add/remove DP instead of their
sensitive-attribute DP):

1. Poisson sample B at rate q (never fixed-size shuffled batches).
2. theta: per-sample gradients of ``CE_i + lam * psi_i`` clipped to ``C_theta``
   (``method.clip_norm``), summed, + N(0, (sigma_theta C_theta)^2)
   (``method.noise_multiplier``), divided by q|D|, one optimizer step.
3. W: per-sample gradients of psi_i (closed form below) clipped to ``C_W``
   (``options.clip_norm_w``), summed, + N(0, (sigma_W C_W)^2) (``options.noise_multiplier_w``),
   divided by q|D|; ascent with step ``method.lr_dual`` and projection onto the Frobenius ball
   of radius D (``options.w_radius``).  The ascent is on psi (not lam * psi): for lam > 0 the
   maximiser is the same, and the step size does not have to be re-tuned with lam.

Both gradients are computed from the same batch, so one step is
``PoissonSampled(q, Composed[Gaussian(sigma_theta), Gaussian(sigma_W)])``; the accountant treats
this exactly as one subsampled Gaussian with ``sigma = (sigma_theta^-2 + sigma_W^-2)^-1/2``
(accounting the two as separately sampled would understate epsilon).

Group proportions p_r are a function of the private data.  By default
(``options.group_proportions: private``) they are released once, before training, as a
Gaussian noisy count histogram (l2 sensitivity 1 under add/remove: one record changes one
count by 1; noise multiplier ``options.count_noise_multiplier``; the noise is the exact integer
discrete Gaussian of :mod:`raco_cli.privacy.discrete`, which that Gaussian covers), clamped to
``options.count_floor`` and normalised; that release is in the event tree::

    Composed[Gaussian(sigma_count), SelfComposed(PoissonSampled(q, Composed[G(sigma_theta), G(sigma_W)]), T)]

A list of numbers declares the proportions public (e.g. census figures); nothing is released.
With ``lam = 0`` the method releases neither W nor counts: it is DP-SGD.

Closed forms for the W gradient (no per-sample tensor of W is materialised)::

    d psi_i / d W[r, j] = 2 F_ij (1{r = g_i} / sqrt(p_r) - W[r, j])
    |grad_W psi_i|      = 2 sqrt( sum_j F_ij^2 |W[:, j] - e_{g_i} / sqrt(p_{g_i})|^2 )

and the theta gradient of ``lam * psi_i`` through the logits is
``lam * F_i * (a_i - <F_i, a_i>)`` with ``a_i = A[g_i]``, ``A[r, j] = 2 W[r, j] / sqrt(p_r) -
|W[:, j]|^2``: the regularizer form of :mod:`raco_cli.methods.gradients` (cell weights c = A,
scale lam, temperature 1), so the closed-form linear engine serves it unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import dp_accounting as dpa
import numpy as np
import torch

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.data.types import TabularData
from raco_cli.errors import ConfigError, UnsupportedError
from raco_cli.methods import training
from raco_cli.methods.base import MethodSpec, Reporter, Seeds, TrainResult, read_options
from raco_cli.methods.gradients import LinearEngine, engine_for, row_softmax
from raco_cli.methods.timing import StepClock
from raco_cli.privacy import events, releases
from raco_cli.privacy.discrete import discrete_gaussian, discrete_gaussian_for
from raco_cli.privacy.mechanisms import (
    NoiseSource,
    gaussian_noise,
    noise_source,
    poisson_sample,
    poisson_sample_many,
    sampling_generator,
)

NAME = "dp_fermi"
MIXED_STEPS = True  # fit_many takes one T per run
PRIVATE = True

#: ``method.options`` of DP-FERMI and their defaults (conf/method/dp_fermi.yaml documents them).
DEFAULTS: dict[str, Any] = {
    "lam": 4.0,
    "clip_norm_w": 4.0,
    "noise_multiplier_w": 10.0,
    "w_radius": 5.0,
    "group_proportions": "private",
    "count_noise_multiplier": 100.0,
    "count_floor": 1.0,
}
SUPPORTED_FAMILIES = ("dp",)


def options(spec: MethodSpec) -> dict[str, Any]:
    """Validated options (defaults filled in).

    Raises:
        ConfigError: unknown key, non-number, negative lam, non-positive norms or noise.
    """
    o = read_options(spec, DEFAULTS)
    if o["lam"] < 0:
        raise ConfigError(f"method.options.lam must be >= 0 (got method.options.lam={o['lam']}); it is the weight of the ERMI penalty.")
    for key in ("clip_norm_w", "noise_multiplier_w", "w_radius", "count_noise_multiplier", "count_floor"):
        if o[key] <= 0:
            raise ConfigError(f"method.options.{key} must be > 0 (got method.options.{key}={o[key]}).")
    gp = o["group_proportions"]
    if isinstance(gp, str):
        if gp != "private":
            raise ConfigError(
                f"method.options.group_proportions must be 'private' or a list of public proportions (got {gp!r})."
            )
    else:
        values = list(gp) if isinstance(gp, (list, tuple)) else None
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in values):
            raise ConfigError(
                f"method.options.group_proportions must be 'private' or a list of positive numbers (got {gp!r})."
            )
        o["group_proportions"] = [float(v) for v in values]
    return o


def validate(spec: MethodSpec, constraints: ConstraintSet, data: TabularData | None = None) -> None:
    """DP-FERMI's penalty is the ERMI of (prediction, group): demographic parity only.

    Raises:
        UnsupportedError: a rate constraint of another family (its knob is options.lam).
        ConfigError: bad options (or public proportions of the wrong length).
    """
    o = options(spec)
    families = sorted({c.family for c in constraints.constraints} - set(SUPPORTED_FAMILIES))
    if families:
        raise UnsupportedError(
            f"method=dp_fermi does not model the rate constraint family '{families[0]}' (its ERMI penalty targets "
            "demographic parity; the fairness knob is method.options.lam). Use constraint=dp or constraint=none."
        )
    if data is not None and not isinstance(o["group_proportions"], str) and len(o["group_proportions"]) != data.n_groups:
        raise ConfigError(
            f"method.options.group_proportions has {len(o['group_proportions'])} entries; the data has "
            f"{data.n_groups} groups ({', '.join(data.group_names)})."
        )


def _releases_w(o: Mapping[str, Any]) -> bool:
    return o["lam"] > 0


def step_event(spec: MethodSpec, sample_rate: float, *, constrained: bool = True) -> dpa.DpEvent:
    """One step: both gradient sums on one Poisson sample (or only theta's when lam = 0)."""
    o = options(spec)
    if not _releases_w(o):
        return events.gaussian_step(sample_rate=sample_rate, noise_multiplier=spec.required("noise_multiplier"))
    return dpa.PoissonSampledDpEvent(
        sample_rate,
        dpa.ComposedDpEvent([dpa.GaussianDpEvent(spec.required("noise_multiplier")), dpa.GaussianDpEvent(o["noise_multiplier_w"])]),
    )


def run_event(spec: MethodSpec, sample_rate: float, steps: int, *, constrained: bool = True) -> dpa.DpEvent:
    """The whole run: the noisy group counts (private proportions, lam > 0) then T steps."""
    o = options(spec)
    train = events.repeated(step_event(spec, sample_rate), steps)
    if _releases_w(o) and o["group_proportions"] == "private":
        return dpa.ComposedDpEvent([dpa.GaussianDpEvent(o["count_noise_multiplier"]), train])
    return train


def group_proportions(
    groups: np.ndarray, n_groups: int, o: Mapping[str, Any], generator: NoiseSource
) -> tuple[np.ndarray, int]:
    """Group proportions p_r and the number of releases it took (0 or 1).

    ``private``: counts + N_Z(0, sigma_Z^2), exact integer noise of the discrete Gaussian with
    ``sigma_Z = discrete_gaussian_for(sigma_count)`` (l2 sensitivity 1; accounted as
    ``GaussianDpEvent(sigma_count)``, :mod:`raco_cli.privacy.discrete`), clamped to
    ``count_floor``, normalised.  A list: the user's public proportions, normalised.
    """
    if isinstance(o["group_proportions"], str):
        counts = torch.as_tensor(np.bincount(groups, minlength=n_groups), dtype=torch.int64)
        sigma_z = discrete_gaussian_for(o["count_noise_multiplier"])  # exact integers, covered by GaussianDpEvent(sigma)
        noisy = releases.release(
            "group_counts", lambda: (counts + discrete_gaussian((n_groups,), sigma_z, generator).cpu()).to(torch.float64)
        )
        clamped = noisy.clamp(min=o["count_floor"]).numpy()
        return clamped / clamped.sum(), 1
    p = np.asarray(o["group_proportions"], dtype=np.float64)
    return p / p.sum(), 0


@torch.no_grad()
def w_gradient_sum(
    F: torch.Tensor, g: torch.Tensor, W: torch.Tensor, s: torch.Tensor, clip_norm: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped sum of the per-sample W gradients of psi (closed form, module docstring).

    Args:
        F: (b, l) class probabilities of the batch rows.
        g: (b,) group index of each row.
        W: (k, l) current W.
        s: (k,) ``1 / sqrt(p_r)``.
        clip_norm: C_W.

    Returns:
        ``(sum_i clip(grad_W psi_i), number of clipped rows)``.

    A row whose probabilities are not finite (an overflowing logit makes softmax NaN) is
    dropped, as the theta path drops it: one NaN in the sum would make the release NaN,
    an unbounded sensitivity.
    """
    k = W.shape[0]
    finite = torch.isfinite(F).all(dim=1)
    F = torch.where(finite[:, None], F, torch.zeros_like(F))
    dist = w_distances(W, s)
    norms = 2.0 * torch.sqrt((F * F * dist.index_select(0, g)).sum(dim=1).clamp(min=0.0))
    f = torch.clamp(clip_norm / (norms + 1e-12), max=1.0)
    fF = F * f[:, None]
    by_group = torch.zeros(k, F.shape[1], dtype=F.dtype, device=F.device).index_add_(0, g, fF)
    return w_gradient(W, s, by_group, fF.sum(dim=0)), (norms > clip_norm).sum()


def w_distances(W: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``|W[:, j] - e_r s_r|^2`` for every group r and class j, shape (..., k, l) of W (..., k, l)
    and s (..., k): a row of group r has W-gradient norm ``2 sqrt(sum_j F_j^2 dist[r, j])``."""
    return group_sums(W * W) - 2.0 * W * s[..., None] + (s * s)[..., None]


def group_sums(X: torch.Tensor) -> torch.Tensor:
    """``X`` (..., k, l) summed over its groups (..., 1, l), group after group: a sum in one
    fixed order, so a run's W player is the same alone and in a group (a reduction's order
    may depend on the shape of the whole tensor)."""
    total = X[..., :1, :]
    for r in range(1, X.shape[-2]):
        total = total + X[..., r : r + 1, :]
    return total


def frobenius_norms(X: torch.Tensor) -> torch.Tensor:
    """The Frobenius norm of each run's (k, l) block of ``X`` (R, k, l), shape (R,), its squares
    added entry after entry (see :func:`group_sums`)."""
    flat = X.reshape(len(X), -1)
    total = flat[:, 0] * flat[:, 0]
    for j in range(1, flat.shape[1]):
        total = total + flat[:, j] * flat[:, j]
    return torch.sqrt(total)


def w_gradient(W: torch.Tensor, s: torch.Tensor, by_group: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The summed W gradient ``2 (s_r by_group[r] - W total)`` from the clipped rows' F summed
    per group (``by_group`` (..., k, l)) and over all rows (``total`` (..., l))."""
    return 2.0 * (s[..., None] * by_group - W * total[..., None, :])


def psi_cell_weights(W: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``A[r, j] = 2 W[r, j] / sqrt(p_r) - |W[:, j]|^2``: psi_i = <F_i, A[g_i]> - 1."""
    return 2.0 * W * s[:, None] - (W * W).sum(dim=0)[None, :]


def project_ball(W: torch.Tensor, radius: float) -> torch.Tensor:
    """Euclidean projection onto the Frobenius ball of the given radius.

    >>> project_ball(torch.tensor([[3.0, 4.0]]), 1.0).tolist()
    [[0.6000000238418579, 0.800000011920929]]
    """
    norm = float(W.norm())
    return W * (radius / norm) if norm > radius else W


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
    from raco_cli.methods import batched

    if batched.trains_alone_here(data, model, device):  # a group of one: the same numbers as in any group (docs/batched.md)
        return fit_many(data, [batched.Member(model=model, constraints=constraints, spec=spec, seeds=seeds, reporter=reporter)],
                        steps=steps, device=device)[0]
    validate(spec, constraints, data)
    o = options(spec)
    if spec.clip_norm is None or spec.noise_multiplier is None:
        raise ValueError("dp_fermi needs clip_norm and noise_multiplier")
    lam, with_w = o["lam"], _releases_w(o)
    train_idx = np.asarray(data.splits["train"])
    n, k, n_cls = len(train_idx), data.n_groups, data.n_classes
    size = spec.size_of(n)  # exact (scope=paper) or the released DP count (privacy/size.py)
    q = min(1.0, spec.batch_size / size)
    expected_batch = q * size
    groups = data.group[train_idx]
    rows = training.Rows(data, train_idx, groups, device)

    training.initialize(model, seeds.init)
    model.to(device)
    engine = engine_for(model, micro_batch=spec.micro_batch)
    labels = not isinstance(engine, LinearEngine)
    optimizer = training.make_optimizer(engine.params, spec)
    g_sample = sampling_generator(seeds.sampling, secure=spec.secure_rng)
    g_noise = noise_source(seeds.noise, device, secure=spec.secure_rng)
    counts = {"gaussian_gradient": 0, "gaussian_gradient_w": 0, "gaussian_count": 0}  # releases per kind

    p_hat, n_count = group_proportions(groups, k, o, g_noise) if with_w else (np.full(k, 1.0 / k), 0)
    counts["gaussian_count"] += n_count
    s = torch.as_tensor(1.0 / np.sqrt(p_hat), dtype=torch.float32, device=device)
    W = torch.zeros(k, n_cls, dtype=torch.float32, device=device)
    std_theta = spec.noise_multiplier * spec.clip_norm
    std_w = o["noise_multiplier_w"] * o["clip_norm_w"]

    checkpoints = training.Checkpoints(engine, model, data, constraints, spec, device=device, reporter=reporter,
                                       selection_seed=seeds.selection, steps=steps)
    zero = torch.zeros((), device=device)
    clipped, clipped_w, norm_sum, nonfinite, batch_sum = zero.long(), zero.long(), zero, zero.long(), 0
    clock = StepClock()

    def record(step: int) -> None:
        checkpoints.record(step, [float(v) for v in W.flatten().cpu()])

    record(0)
    for t in range(1, steps + 1):
        t0 = time.perf_counter()
        batch = poisson_sample(n, q, g_sample, device)[0]
        G_w = torch.zeros_like(W)
        if len(batch):
            b = rows.batch(batch, labels=labels)
            g_rows = rows.cells.index_select(0, batch)
            with torch.no_grad():
                z = engine.logits(b["X"])
            c = psi_cell_weights(W, s).index_select(0, g_rows) if with_w else None
            res = engine.clipped_sum(
                **b, c=c, reg_scale=lam, temperature=1.0, clip_norm=spec.clip_norm, logits=z if not labels else None
            )
            grads = res.grads
            clipped, norm_sum, nonfinite = clipped + res.clipped, norm_sum + res.norm_sum, nonfinite + res.nonfinite
            if with_w:
                F = row_softmax(z.float())
                G_w, nc = w_gradient_sum(F, g_rows, W, s, o["clip_norm_w"])
                clipped_w = clipped_w + nc
        else:  # an empty Poisson batch: both noisy sums are pure noise
            grads = [torch.zeros_like(p) for p in engine.params]
        counts["gaussian_gradient"] += 1
        grads = releases.release(
            "gradient", lambda sums=grads: [gr + gaussian_noise(tuple(gr.shape), std_theta, g_noise, dtype=gr.dtype) for gr in sums]  # type: ignore[misc]
        )
        if with_w:
            counts["gaussian_gradient_w"] += 1
            G_w = releases.release("gradient_w", lambda G=G_w: G + gaussian_noise(tuple(G.shape), std_w, g_noise, dtype=G.dtype))  # type: ignore[misc]
        # simultaneous update: theta descends and W ascends on gradients taken at (theta_t, W_t)
        optimizer.step(grads, scale=1.0 / expected_batch)
        if with_w:
            W = project_ball(W + (spec.lr_dual / expected_batch) * G_w, o["w_radius"])
        clock.add(time.perf_counter() - t0)
        batch_sum += len(batch)
        reporter.on_step(t, steps, {"batch": float(len(batch))})
        if t % spec.eval_every == 0 or t == steps:
            record(t)

    history, selected, state = checkpoints.finish()
    T = max(steps, 1)
    return TrainResult(
        history=history,
        selected=selected,
        steps=steps,
        lam=[float(v) for v in W.flatten().cpu()],
        state_dict=state,
        stats={
            "mean_batch_size": batch_sum / T,
            "clip_fraction": float(clipped) / max(batch_sum, 1),
            "clip_fraction_w": float(clipped_w) / max(batch_sum, 1),
            "mean_grad_norm": float(norm_sum) / max(batch_sum, 1),
            "nonfinite_rows": float(nonfinite),
            "time_per_step_ms": clock.steady_ms,  # first (warm-up) step excluded
            "first_step_ms": clock.first_ms,
            "sample_rate": q,
            "fermi_lambda": lam,
            # noisy (released) or public proportions: never the exact counts
            "group_proportions": {name: float(v) for name, v in zip(data.group_names, p_hat)},
        },
        releases=counts,
    )


def fit_many(data: TabularData, members, *, steps: int | Sequence[int], device: torch.device,
             reporter: Reporter | None = None) -> list[TrainResult]:
    """:func:`fit` of the R runs of a group as one vectorised problem
    (:mod:`raco_cli.methods.batched`): each run's lam, noise, clip norms, W radius and group
    proportions are its own, and so are its sampling and noise streams (drawn in the order
    :func:`fit` draws them: group counts first, then per step theta's noise then W's).

    ``steps``: every run's T, or one per run (:data:`MIXED_STEPS`): the group steps to the
    largest, and a run stops at its own T as alone (as the SGDA loop's groups,
    :func:`raco_cli.methods.sgda.batched.run_core`): it records nothing after it, and its W
    player and counters stay as at its T."""
    from raco_cli.methods import batched
    from raco_cli.methods.group_rows import GroupRows

    batched.check_group(members)
    R, specs = len(members), [m.spec for m in members]
    T = np.broadcast_to(np.asarray(steps, dtype=np.int64), (R,)).copy()  # each run's own T
    last = int(T.max()) if R else 0
    for m in members:
        validate(m.spec, m.constraints, data)
        if m.spec.clip_norm is None or m.spec.noise_multiplier is None:
            raise ValueError("dp_fermi needs clip_norm and noise_multiplier")
    opts = [options(s) for s in specs]
    lams = [o["lam"] for o in opts]
    with_w = [_releases_w(o) for o in opts]
    train_idx = np.asarray(data.splits["train"])
    n, k, n_cls = len(train_idx), data.n_groups, data.n_classes
    # each run's rate from its own public training size (exact, or its released DP count)
    q = np.array([min(1.0, sp.batch_size / sp.size_of(n)) for sp in specs])
    expected_batch = q * np.array([sp.size_of(n) for sp in specs])
    groups = data.group[train_idx]
    rows = GroupRows(data, train_idx, groups, [m.scaling for m in members], device, n_cells=k, neutralise_cells=False)
    W, b, layers = batched.initial_parameters(members, device)
    optimizer = batched.GroupOptimizer(specs, device)
    g_sample = [sampling_generator(m.seeds.sampling, secure=m.spec.secure_rng) for m in members]
    g_noise = batched.noise_sources(members, device)
    counts = [{"gaussian_gradient": 0, "gaussian_gradient_w": 0, "gaussian_count": 0} for _ in members]
    p_hats = []
    for r, (o, g) in enumerate(zip(opts, g_noise)):
        p_hat, n_count = group_proportions(groups, k, o, g) if with_w[r] else (np.full(k, 1.0 / k), 0)
        p_hats.append(p_hat)
        counts[r]["gaussian_count"] += n_count
    s = torch.as_tensor(1.0 / np.sqrt(np.stack(p_hats)), dtype=torch.float32, device=device)  # (R, k)
    Wd = torch.zeros(R, k, n_cls, dtype=torch.float32, device=device)
    std_theta = [sp.required("noise_multiplier") * sp.required("clip_norm") for sp in specs]
    w_runs = [r for r in range(R) if with_w[r]]
    std_w = [opts[r]["noise_multiplier_w"] * opts[r]["clip_norm_w"] for r in w_runs]
    clip = batched.per_run([sp.clip_norm for sp in specs], device, dims=2)  # type: ignore[misc]
    clip_w = batched.per_run([o["clip_norm_w"] for o in opts], device, dims=2)
    reg = batched.per_run(lams, device)
    step_w = np.array([sp.lr_dual / e for sp, e in zip(specs, expected_batch)])
    radius = np.array([o["w_radius"] for o in opts])
    has_w = torch.as_tensor(with_w, device=device).view(R, 1, 1)
    scan = None  # the compiled data pass (methods/batched_scan.py) on the CPU: theta's
    # regularizer weights are each row's A[g_i], RaCO-DP's cell weights at tau = 1
    if batched.compiled_scan_applies(device):
        from raco_cli.methods.batched_scan import Scan

        scan = Scan(rows, R)
        lams_np, ones = np.array(lams, dtype=np.float32), np.ones(R, dtype=np.float32)
        clip_np, clip_w_np = clip.reshape(R).numpy(), clip_w.reshape(R).numpy()

    checkpoints = batched.GroupCheckpoints(data, members, layers, device, steps=T.tolist())
    clipped, clipped_w = torch.zeros(R, dtype=torch.long), torch.zeros(R, dtype=torch.long)
    norm_sum, nonfinite = torch.zeros(R), torch.zeros(R, dtype=torch.long)
    batch_sum = np.zeros(R, dtype=np.int64)
    clock = StepClock()

    def record(step: int, due: np.ndarray) -> None:
        checkpoints.record(step, W, b, Wd.reshape(R, -1).cpu().numpy(), [None] * R, due=due)

    record(0, np.ones(R, dtype=bool))
    for t in range(1, last + 1):
        t0 = time.perf_counter()
        active = T >= t  # the runs still training (all but in a group's last few steps when T differ)
        on = torch.from_numpy(active)
        if scan is not None:  # the samples read as drawn (methods/batched_scan.py)
            lengths = scan.sample(scan.positions(q, g_sample, count=1), count=1)
        else:
            idx, lengths = poisson_sample_many(n, q, g_sample)
        with torch.no_grad():
            A = torch.where(has_w, 2.0 * Wd * s[:, :, None] - group_sums(Wd * Wd), torch.zeros_like(Wd))  # (R, k, l)
            if scan is not None:
                scan.logits(W, b)
                res = scan.clipped_sums(A.numpy(), lams_np, ones, clip_np)
                by_group, total, nc = scan.w_clipped_sums(w_distances(Wd, s), clip_w_np)
                G_w = w_gradient(Wd, s, by_group, total)
            else:
                rb = rows.gather(idx[:, 0])
                z = batched.group_logits(W, b, rb["X"])  # (R, K, L)
                ghot = rb["cellhot"]  # (R, L, k): each row's group
                c = torch.bmm(A.transpose(1, 2), ghot.transpose(1, 2))  # (R, l, L): row i's A[g_i]
                res = batched.clipped_sums(rb, z, c, reg_temp=reg, temperature=None, clip=clip)
                G_w, nc = _w_gradient_sums(batched.group_softmax(z.float()).transpose(1, 2), ghot, rb["valid"], Wd, s, clip_w)
        clipped = clipped + torch.where(on, res.clipped.cpu(), 0)
        norm_sum = norm_sum + torch.where(on, res.norm_sum.cpu(), 0.0)
        nonfinite = nonfinite + torch.where(on, res.nonfinite.cpu(), 0)
        clipped_w = clipped_w + torch.where(on, nc.cpu(), 0) * torch.as_tensor(with_w)
        for cnt, running in zip(counts, active):
            cnt["gaussian_gradient"] += int(running)
        grads = releases.release(
            "gradient",
            lambda gw=res.grad_w, gb=res.grad_b: [gw + batched.gaussian_many(tuple(gw.shape[1:]), std_theta, g_noise, dtype=gw.dtype),  # type: ignore[misc]
                                                  gb + batched.gaussian_many(tuple(gb.shape[1:]), std_theta, g_noise, dtype=gb.dtype)],
        )
        if w_runs:
            for r in w_runs:
                counts[r]["gaussian_gradient_w"] += int(active[r])
            sel = torch.as_tensor(w_runs, device=device)
            G_sel = G_w.index_select(0, sel)
            noisy_w = releases.release(
                "gradient_w",
                lambda G=G_sel: G + batched.gaussian_many(tuple(G.shape[1:]), std_w, [g_noise[r] for r in w_runs], dtype=G.dtype),  # type: ignore[misc]
            )
        # simultaneous update: theta descends and W ascends on gradients taken at (theta_t, W_t)
        optimizer.step([W, b], grads, scale=1.0 / expected_batch)
        if w_runs:
            stepped = Wd.index_select(0, sel) + torch.as_tensor(step_w[w_runs], dtype=torch.float32, device=device).view(-1, 1, 1) * noisy_w
            norms = frobenius_norms(stepped).double().cpu().numpy()
            factor = np.where(norms > radius[w_runs], radius[w_runs] / np.where(norms > 0, norms, 1.0), 1.0)
            scaled = torch.where(torch.as_tensor(norms > radius[w_runs], device=device).view(-1, 1, 1),
                                 stepped * torch.as_tensor(factor, dtype=torch.float32, device=device).view(-1, 1, 1), stepped)
            # a run past its T keeps its W player as at its T
            Wd[sel] = torch.where(on.to(device).index_select(0, sel).view(-1, 1, 1), scaled, Wd.index_select(0, sel))
        due = active & ((t % specs[0].eval_every == 0) | (T == t))  # each run's evaluations, its last step's included
        evaluate_now = bool(due.any())
        if evaluate_now and device.type == "cuda":
            torch.cuda.synchronize(device)
        clock.add(time.perf_counter() - t0)
        batch_sum += lengths[:, 0] * active
        batched.report_step(reporter, members, t, last, evaluate=evaluate_now, batch=lengths[:, 0])
        if evaluate_now:
            record(t, due)

    finished = checkpoints.finish()
    return [
        TrainResult(
            history=history, selected=selected, steps=int(T[r]), lam=[float(v) for v in Wd[r].flatten().cpu()], state_dict=state,
            stats={
                **batched.run_stats(r, steps=int(T[r]), rows=batch_sum, clipped=clipped, norm_sum=norm_sum, nonfinite=nonfinite, clock=clock,
                                    sample_rate=float(q[r])),
                "clip_fraction_w": float(clipped_w[r]) / max(int(batch_sum[r]), 1),
                "fermi_lambda": lams[r],
                "group_proportions": {name: float(v) for name, v in zip(data.group_names, p_hats[r])},
            },
            releases=counts[r],
        )
        for r, (history, selected, state) in enumerate(finished)
    ]


def _w_gradient_sums(
    F: torch.Tensor, ghot: torch.Tensor, valid: torch.Tensor, W: torch.Tensor, s: torch.Tensor, clip_norm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`w_gradient_sum` of R runs: F (R, L, l), ghot (R, L, k) one-hot groups, valid
    (R, L), W (R, k, l), s (R, k), clip_norm (R, 1); returns (R, k, l) sums and (R,) clip counts."""
    finite = torch.isfinite(F).all(dim=2) & valid
    F = torch.where(finite[..., None], F, torch.zeros_like(F))
    norms = 2.0 * torch.sqrt((F * F * torch.bmm(ghot, w_distances(W, s))).sum(dim=2).clamp(min=0.0))
    f = torch.clamp(clip_norm / (norms + 1e-12), max=1.0)
    fF = F * f[..., None]
    return w_gradient(W, s, torch.bmm(ghot.transpose(1, 2), fF), fF.sum(dim=1)), ((norms > clip_norm) & valid).sum(dim=1)
