"""Prepare one run: config -> spec -> data -> constraints -> model -> privacy plan (STYLE 1.4).

Everything that can reject a run happens here, before the MLflow store is touched, so bad
input never leaves a half-written record.  Shared by ``raco train`` (one run and sweep
groups), ``raco audit`` and ``raco tune``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from raco_cli.run.spec import RunSpec, build_run_spec, plain_config

if TYPE_CHECKING:  # (planning imports torch and dp_accounting: at run time only where a run plans)
    from raco_cli.methods.planning import PlanRequest

log = logging.getLogger(__name__)

_DATA_CACHE: dict[str, Any] = {}
_DATA_CACHE_SIZE = 2
REGRESSION_METHODS = "dpse, dp_sgd or sgd"


def load_data(spec: RunSpec):
    """Load (and subset) the run's dataset.

    Parallel sweep workers run many jobs in one process, so the last two datasets loaded are
    kept in memory (TabularData is immutable): a sweep parses each file once per worker.
    """
    ds = spec.dataset
    key = json.dumps([ds.name, str(ds.data_dir), ds.mirror, ds.split_seed, ds.split, ds.subset, dict(ds.options), ds.preprocessing,
                      dict(ds.bounds), dict(ds.imbalance)], sort_keys=True, default=str)
    if key in _DATA_CACHE:
        return _DATA_CACHE[key]
    loaded = load_data_uncached(spec)
    while len(_DATA_CACHE) >= _DATA_CACHE_SIZE:
        _DATA_CACHE.pop(next(iter(_DATA_CACHE)))
    _DATA_CACHE[key] = loaded
    return loaded


def load_data_uncached(spec: RunSpec):
    """:func:`load_data` without the cache (the loader, the imbalanced variant, the subset)."""
    from raco_cli import data

    ds = spec.dataset
    loaded = data.load(
        ds.name,
        data_dir=ds.data_dir,
        mirror=ds.mirror,
        allow_download=ds.download,
        split_seed=ds.split_seed,
        split=ds.split,
        options=ds.options,
        # dp: the loader encodes by the public bounds; prepare_run standardises privately
        preprocessing="public" if ds.preprocessing == "dp" else ds.preprocessing,
        bounds=ds.bounds,
    )
    if ds.imbalance:  # dataset.imbalance: the label- or group-imbalanced variant
        from raco_cli.data.imbalance import imbalanced

        loaded = imbalanced(loaded, ds.imbalance, seed=ds.split_seed)
    if ds.subset is not None:
        loaded = loaded.subset(ds.subset, seed=ds.split_seed)
    return loaded


@dataclass
class PreparedRun:
    """Everything a run needs, built and validated before any MLflow write."""

    spec: RunSpec
    resolved: dict[str, Any]
    method: Any
    data: Any
    constraints: Any
    constrained: bool
    model: Any
    plan: Any
    device: Any
    seeds: Any
    preprocessing: str = "empirical"  # how the run's features are scaled (summary.json)
    scaling: Any = None  # shared_features with dp preprocessing: the run's (mean, std), X left public
    requested: Any = None  # the constraints as asked for (``constraints`` then holds the training targets)
    margins: Any = None  # constraint.confidence: raco_cli.constraints.margin.Margins (None: no margin)
    confidence_note: str | None = None  # constraint.confidence=auto the data could not support: why (result table)

    @property
    def full_records(self) -> bool:
        """Whether the run writes exact training statistics (scope=paper or a non-private method)."""
        return self.spec.scope == "paper" or not bool(self.method.PRIVATE)


@dataclass(frozen=True)
class Released:
    """What a private run releases before it is planned: the training size n~ (or the counts of
    its partition's cells), the DP standardisation and a table's private estimates, with the
    data as they leave it and the method spec that carries their noise multipliers (the plan
    accounts them).  A private search (:mod:`raco_cli.run.private_search`) makes them once and
    hands them to every trial (:meth:`for_trial`)."""

    data: Any
    method_spec: Any
    constraints: Any
    cell_rows: np.ndarray | None
    scaling: Any

    def for_trial(self, method_spec: Any) -> Released:
        """These releases under another candidate's method spec: it reads n~ and the reserved
        delta, and carries no noise of them (the search accounts them once, outside the trials)."""
        return replace(self, method_spec=replace(method_spec, train_size=self.method_spec.train_size,
                                                 reserved_delta=self.method_spec.reserved_delta,
                                                 size_noise=0.0, preprocessing_noise=0.0, estimate_noise=0.0))


def release_inputs(spec: RunSpec, method: Any, seeds: Any, *, shared_features: bool = False) -> Released:
    """Data -> a table's private estimates -> constraints -> n~ (cell counts) -> DP
    standardisation: every release a run makes before its plan (:class:`Released`).

    Raises:
        RacoError: bad config, missing or corrupted data.
    """
    from raco_cli import constraints as constraints_mod
    from raco_cli.privacy.mechanisms import noise_source
    from raco_cli.privacy.preprocessing import dp_scaling, dp_standardize, numeric_features
    from raco_cli.privacy.size import dp_cell_counts, dp_size

    log.info("Loading dataset <%s> (dataset.name)", spec.dataset.name)
    data = load_data(spec)
    method_spec = spec.method
    if data.meta.get("pending"):  # dataset=table's private values: one accounted release, from the training split
        data, method_spec = estimate_private_values(spec, data, method_spec, seeds)
    check_task(spec, method, data)
    cons = constraints_mod.build_parts(
        spec.constraint.parts, n_classes=data.n_classes, n_groups=data.n_groups,
        class_names=data.class_names, group_names=data.group_names, keys=spec.constraint.keys,
    )
    constrained = not cons.is_empty
    train_idx = np.asarray(data.splits["train"])
    n_rows = len(train_idx)
    size: float | None = None  # the training size the run may use (None: the exact n, scope=paper)
    cell_rows: np.ndarray | None = None  # training rows per partition cell (released under scope=model)
    if spec.scope == "model" and method.PRIVATE:
        # n itself is data under add/remove adjacency: one accounted Gaussian release, first
        # (raco_cli/privacy/size.py); everything below reads n~, never n.  A constrained run
        # releases the counts of its partition's cells (the margins of constraint.confidence).
        source = noise_source(seeds.size, "cpu", secure=spec.secure_rng)
        if constrained:
            exact = np.bincount(cons.cells(data.y[train_idx], data.group[train_idx]), minlength=cons.Q)
            size, cell_rows = dp_cell_counts(exact, noise_multiplier=spec.size_noise_multiplier, source=source)
        else:
            size = dp_size(n_rows, noise_multiplier=spec.size_noise_multiplier, source=source)
        method_spec = replace(method_spec, size_noise=spec.size_noise_multiplier, train_size=size)
    elif constrained:
        cell_rows = np.bincount(cons.cells(data.y[train_idx], data.group[train_idx]), minlength=cons.Q).astype(float)
    scaling = None
    if spec.dataset.preprocessing == "dp" and numeric_features(data):
        # one accounted Gaussian release (raco_cli/privacy/preprocessing.py), in the plan below
        sigma = spec.dataset.dp_noise_multiplier
        source = noise_source(seeds.preprocessing, "cpu", secure=spec.secure_rng)
        if shared_features:
            scaling = dp_scaling(data, noise_multiplier=sigma, source=source, size=size)
        else:
            data = dp_standardize(data, noise_multiplier=sigma, source=source, size=size)
        method_spec = replace(method_spec, preprocessing_noise=sigma)
    if spec.scope == "paper" or not method.PRIVATE:  # exact training statistics: paper scope only
        log.info("Group sizes (train): %s", data.group_sizes("train"))
    if "schema" in data.meta:  # dataset=table: what its missing / clipping / unknown-level rules did
        from raco_cli.data.table import report_lines

        for line in report_lines(data, exact=spec.scope == "paper" or not method.PRIVATE):
            log.info(line)
    return Released(data=data, method_spec=method_spec, constraints=cons, cell_rows=cell_rows, scaling=scaling)


def prepare_run(cfg: Mapping[str, Any], *, shared_features: bool = False, released: Released | None = None) -> PreparedRun:
    """Config -> spec -> data -> constraints -> model -> privacy plan (STYLE 1.4):
    :func:`prepare_until_plan`, then :meth:`Unplanned.planned`.

    Everything here can reject a run, and nothing here touches the MLflow store.

    ``shared_features`` (runs of a sweep group): with ``dataset.preprocessing=dp`` the run's
    DP standardisation is released and kept as ``scaling`` = (mean, std), and ``data`` stays
    the public encoding every run of the group shares (the batched engine applies each run's
    scaling to the rows it reads, docs/batched.md).

    ``released``: the releases of :func:`release_inputs` already made once for a private
    search; the run (a trial) plans from them and does not release them again.

    Raises:
        RacoError: bad config, missing or corrupted data, an unreachable budget.
    """
    return prepare_until_plan(cfg, shared_features=shared_features, released=released).planned()


@dataclass
class Unplanned:
    """A run prepared up to its privacy plan (:func:`prepare_until_plan`): what its plan reads
    (:meth:`request`), and the rest of its preparation (:meth:`planned`).  A sweep group
    prepares its runs to here, plans them ahead in parallel (``planning.plan_ahead``), then
    finishes each."""

    spec: RunSpec
    resolved: dict[str, Any]
    method: Any
    seeds: Any
    data: Any
    method_spec: Any
    constraints: Any
    cell_rows: np.ndarray | None
    scaling: Any
    model: Any
    n_train: float

    @property
    def constrained(self) -> bool:
        return not self.constraints.is_empty

    def request(self) -> PlanRequest:
        """The inputs of the run's plan."""
        from raco_cli.methods.planning import PlanRequest

        return PlanRequest(self.method.NAME, self.method_spec, self.n_train, self.spec.eps, self.spec.delta, self.constrained,
                           self.spec.discretization)

    def planned(self) -> PreparedRun:
        """Plan the run (from the plan cache when planned ahead) and finish its preparation:
        the step count check, ``method.lr_dual=auto``, the confidence margins,
        ``method.dual=auto``.

        Raises:
            RacoError: an unreachable budget, a bad margin setting.
        """
        from raco_cli.methods.planning import plan
        from raco_cli.methods.training import resolve_device

        spec, method, method_spec, cons, cell_rows = self.spec, self.method, self.method_spec, self.constraints, self.cell_rows
        constrained = self.constrained
        pplan = plan(method, method_spec, n_train=self.n_train, eps=spec.eps, delta=spec.delta, constrained=constrained,
                     discretization=spec.discretization)
        log.info("Privacy plan: steps=%d sample_rate=%.4g eps_planned=%.4g", pplan.steps, pplan.sample_rate, pplan.eps_planned)
        if method.PRIVATE and method_spec.steps is None and pplan.steps < FEW_STEPS:
            log.warning("only %d noisy steps fit in eps=%g at method.batch_size=%d of ~%d training rows: too few to learn; %s",
                        pplan.steps, spec.eps, method_spec.batch_size, int(self.n_train),
                        few_steps_advice(method_spec.batch_size, self.n_train))
        if spec.auto_lr_dual:  # method.lr_dual=auto: from the plan and the cell sizes the run may use
            lr_dual = suggested_lr_dual(spec, method, pplan, cons, cell_rows)
            pplan = replace(pplan, spec=replace(pplan.spec, lr_dual=lr_dual))
            log.info("method.lr_dual=auto: %.4g", lr_dual)
        requested, found, note = cons, None, None
        if spec.constraint.confidence is not None and constrained and cell_rows is not None:
            cons, found, note = with_margins(spec, method, pplan, cons, cell_rows, released=method_spec.train_size is not None)
        if spec.auto_dual:  # method.dual=auto: the rates the margin's certificate is about (docs/methods.md)
            dual: Literal["soft", "hard"] = "hard" if found is not None else "soft"
            pplan = replace(pplan, spec=replace(pplan.spec, dual=dual))
            log.info("method.dual=auto: %s%s", dual, " (a confidence margin applies: the dual reads the hard rates the test reports)"
                     if found is not None else "")
        return PreparedRun(
            spec=spec, resolved=self.resolved, method=method, data=self.data, constraints=cons, constrained=constrained,
            model=self.model, plan=pplan, device=resolve_device(spec.device), seeds=self.seeds,
            preprocessing="dp" if self.scaling is not None else getattr(self.data, "preprocessing", "empirical"), scaling=self.scaling,
            requested=requested, margins=found, confidence_note=note,
        )


def prepare_until_plan(cfg: Mapping[str, Any], *, shared_features: bool = False, released: Released | None = None) -> Unplanned:
    """:func:`prepare_run` up to the privacy plan: config -> spec -> releases -> constraints ->
    model -> the plan's inputs (an automatic batch size, delta from ``privacy.delta_exponent``,
    a method's settings derived from public sizes).

    Raises:
        RacoError: bad config, missing or corrupted data.
    """
    from raco_cli import methods, models
    from raco_cli.methods.base import Seeds

    spec = build_run_spec(cfg)
    resolved = plain_config(cfg)
    method = methods.get(spec.method.name)
    seeds = Seeds.from_seed(spec.seed)
    pre = release_inputs(spec, method, seeds, shared_features=shared_features) if released is None \
        else released.for_trial(spec.method)
    data, method_spec, cons, cell_rows, scaling = pre.data, pre.method_spec, pre.constraints, pre.cell_rows, pre.scaling
    log.info("Constraints <%s> (constraint.name): J=%d over a global partition of Q=%d cells", spec.constraint.name, cons.J, cons.Q)
    validate = getattr(method, "validate", None)
    if validate is not None:  # e.g. a constraint the method does not model: before any MLflow write
        validate(spec.method, cons, data)
    n_rows = len(np.asarray(data.splits["train"]))
    model = models.build(spec.model["name"], input_shape=data.input_shape, n_classes=data.n_classes, options=dict(spec.model))
    n_train = method_spec.size_of(n_rows)
    if spec.auto_batch:  # method.batch_size=auto: from the training size the run may use (n~ under scope=model)
        method_spec = replace(method_spec, batch_size=suggested_batch_size(n_train))
        log.info("method.batch_size=auto: %d (the power of two nearest n/16 in [16, 1024], n = %d)", method_spec.batch_size, int(n_train))
    if spec.delta_exponent is not None:  # privacy.delta_exponent: delta = n^-e (n: the run's public training size)
        spec = replace(spec, delta=float(n_train) ** -spec.delta_exponent)
        log.info("delta = n_train^-%g = %.3g (privacy.delta_exponent)", spec.delta_exponent, spec.delta)
        if not 0 < spec.delta < 1:  # a released n~ of 1 (a tiny table under size noise) gives delta = 1: no guarantee
            from raco_cli.errors import ConfigError

            raise ConfigError(f"privacy.delta_exponent={spec.delta_exponent:g} gives delta = n^-{spec.delta_exponent:g} = "
                              f"{spec.delta:.3g} from a training size of {float(n_train):g} (the released n~ under scope=model); "
                              "delta must be in (0, 1). Use more training rows or set privacy.delta (without privacy.delta_exponent).")
    resolve = getattr(method, "resolve", None)
    if resolve is not None:  # settings derived from public sizes, e.g. the DRO SPIDER methods' phase=auto (Theorem 7)
        dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
        method_spec = resolve(method_spec, n_train=n_train, eps=spec.eps, delta=spec.delta, dim=dim)
    if certifies(spec, method, cons, data) and spec.scope == "model" and method.PRIVATE:
        # the released model's certificate: one accounted release after training, in the plan
        # (raco_cli/privacy/certificate.py)
        method_spec = replace(method_spec, certificate_noise=spec.certificate_noise_multiplier)
    return Unplanned(spec=spec, resolved=resolved, method=method, seeds=seeds, data=data, method_spec=method_spec, constraints=cons,
                     cell_rows=cell_rows, scaling=scaling, model=model, n_train=n_train)


def certifies(spec: RunSpec, method: Any, cons: Any, data: Any) -> bool:
    """Whether the run certifies its released model (:mod:`raco_cli.constraints.certificate`):
    ``constraint.confidence`` set, a classification task with constraints, and a method whose
    checkpoint choice reads a feasibility signal (the methods the margins train; DP-FERMI and DPSE
    report the test constraint only)."""
    flags = getattr(method, "FLAGS", None)
    return (spec.constraint.confidence is not None and not cons.is_empty and data.target is None
            and flags is not None and bool(flags.constrained))


FEW_STEPS = 50  # fewer planned steps than this: the run warns and suggests a batch size


def suggested_batch_size(n_train: float) -> int:
    """A batch size for ``n_train`` training rows: the power of two nearest n/16, in [16, 1024].
    Measured rule of thumb: Adult (28 828 rows) trains best at 1024 (406 steps at eps = 1),
    Parkinsons (3 745) at 256 (98 steps), where 1024 leaves 5 steps (docs/your-own-data.md).

    >>> suggested_batch_size(28828), suggested_batch_size(3745), suggested_batch_size(640)
    (1024, 256, 32)
    """
    import math

    return int(min(1024, max(16, 2 ** round(math.log2(max(n_train, 1) / 16)))))


def few_steps_advice(batch_size: int, n_train: float) -> str:
    """What helps a run planned for too few steps: the batch of about n/16 when the run's is
    larger, else (it already is, or smaller) a larger eps, more rows, or a smaller batch (more,
    noisier steps), never the value in use.

    >>> few_steps_advice(1024, 3745)
    'use method.batch_size=256 (about n/16) or a larger eps'
    >>> few_steps_advice(32, 680)
    'method.batch_size=32 is already about n/16 or below: use a larger eps or more training rows (or method.batch_size=16: more, noisier steps)'
    """
    suggested = suggested_batch_size(n_train)
    if batch_size > suggested:
        return f"use method.batch_size={suggested} (about n/16) or a larger eps"
    smaller = f" (or method.batch_size={batch_size // 2}: more, noisier steps)" if batch_size >= 2 else ""
    return f"method.batch_size={batch_size} is already about n/16 or below: use a larger eps or more training rows{smaller}"


DUAL_WALK = 1.0 / 3.0  # method.lr_dual=auto: the sd of the dual's noise-driven walk over a run


def histogram_laplace_scale(method: Any, pplan: Any) -> float:
    """The Laplace scale b of the noisy histograms a method's feasibility signal reads (0 when
    it releases none: DP-SGD, DP-FERMI, DPSE, the non-private methods)."""
    flags = getattr(method, "FLAGS", None)
    if flags is None or not flags.hist_noise:
        return 0.0
    return float(pplan.spec.hist_noise_multiplier or 0.0)


def suggested_lr_dual(spec: RunSpec, method: Any, pplan: Any, cons: Any, cell_rows: np.ndarray | None) -> float:
    """``method.lr_dual=auto``: the dual step at which the Laplace noise of the histograms moves
    each lambda_j by at most about :data:`DUAL_WALK` (one sd) over the run,

        lr_dual = min(1, DUAL_WALK / (s_j sqrt(T))),

    with s_j the sd the noise adds to Gamma_j read from one step's histogram (delta method,
    :func:`raco_cli.constraints.margin.noise_sd`, from the cell sizes the run may use: DP counts
    under scope=model).  The dual ascent adds ``lr_dual x`` that noise at each of T steps, a
    random walk of sd ``lr_dual s_j sqrt(T)`` (an upper bound: s_j bounds each class count's
    noise separately, and clipping a small group's noisy rate to [0, 1] shrinks it; by Monte
    Carlo the walk's sd is 0.18 at Adult's sizes, 0.10 at Hdma's:
    tests/unit/run/test_lr_dual_auto.py).  With small groups (a few rows of a group per
    batch) a fixed step of 1 sent lambda to its bound on noise alone and the model to a
    near-constant one (docs/your-own-data.md, measured on public tables).  It gives 0.2 on Adult
    (0.8253 vs 0.8250 at 1.0, 5 seeds) and 0.1 on Parkinsons (its tuned value).  1.0 (the value
    the paper's figures were measured with) under scope=paper, without histogram noise, or
    without a constraint.
    """
    from raco_cli.constraints.margin import noise_sd

    b = histogram_laplace_scale(method, pplan)
    if spec.scope == "paper" or cell_rows is None or b <= 0 or cons.is_empty:
        return 1.0
    rows = np.maximum(np.asarray(cell_rows, dtype=float), 1.0)
    s = float(noise_sd(cons, rows, sample_rate=pplan.sample_rate, laplace_scale=b).max())
    return float(min(1.0, DUAL_WALK / max(s * np.sqrt(max(pplan.steps, 1)), 1e-12)))


def with_margins(spec: RunSpec, method: Any, pplan: Any, cons: Any, cell_rows: np.ndarray, *,
                 released: bool) -> tuple[Any, Any, str | None]:
    """``constraint.confidence``: the constraints with targets ``gamma - margin``
    (:mod:`raco_cli.constraints.margin`), the margins, and why no margin was used when
    ``auto`` met a margin the data cannot support (None otherwise); unchanged for a method
    whose checkpoint choice reads no feasibility (DP-FERMI, DPSE: their runs report the test
    constraint only).

    Raises:
        UnsupportedError: a target would be below zero: the data cannot support the
            constraint at this confidence (one line with what would help).
    """
    from raco_cli.constraints.margin import Signal, margins
    from raco_cli.errors import UnsupportedError
    from raco_cli.privacy.discrete import discrete_gaussian_for

    confidence = spec.constraint.confidence
    assert confidence is not None
    flags = getattr(method, "FLAGS", None)
    if flags is None or not flags.constrained:
        log.info("constraint.confidence=%g: method=%s picks its checkpoint without a feasibility signal; the test "
                 "constraint is reported, not certified", confidence, spec.method.name)
        return cons, None, None
    rows = cell_rows
    signal = None
    if released:  # DP counts: two noise sds lower (a smaller n gives a larger margin), and the noisy signal
        # (the counts' noise is the discrete Gaussian of sd discrete_gaussian_for(sigma): privacy/size.py)
        rows = np.maximum(cell_rows - 2.0 * discrete_gaussian_for(spec.size_noise_multiplier), 1.0)
        # the feasibility signal's window: the steps around a checkpoint (best_feasible), or the
        # averaged second half of training (selection=average)
        window = pplan.steps // 2 if pplan.spec.selection == "average" else 2 * pplan.spec.eval_every
        signal = Signal(sample_rate=pplan.sample_rate, window=window,
                        laplace_scale=histogram_laplace_scale(method, pplan))
    found = margins(cons, rows, confidence=confidence, signal=signal)
    targets = cons.gamma - found.margin
    if (targets < 0).any():
        j = int(np.argmax(found.margin - cons.gamma))
        smallest = max(int(round(float((cons.membership @ cell_rows).min()))), 0)  # a noisy count can fall below 0
        if released:  # the released counts, and what the margin assumed of them
            sigma = spec.size_noise_multiplier
            rows_said = (f"about {smallest} training rows in the smallest subset (a DP estimate; the margin takes each cell "
                         f"{2 * discrete_gaussian_for(sigma):g} rows lower, 2 noise sds of privacy.size_noise_multiplier={sigma:g}, "
                         "and at least 1)")
        else:
            rows_said = f"{smallest} training rows in the smallest subset"
        looser = math.ceil(float(found.margin.max()) * 100 + 1e-9) / 100  # rounded up: a gamma that passes
        # a rate gap is at most 1: past that, no gamma of a rate constraint helps
        gamma_hint = f"a looser constraint.gamma (>= {looser:.2f}), " if looser <= 1.0 else ""
        why = (f"cannot be met for {cons.names[j]}: its rates need a margin of {found.margin[j]:.3f} > gamma={cons.gamma[j]:g} "
               f"with {rows_said}")
        helps = f"{gamma_hint}a lower constraint.confidence (e.g. 0.5){', more data, or a larger eps' if released else ' or more data'}"
        if spec.constraint.confidence_auto:  # the default: say so in one short line and train against gamma (docs/methods.md)
            short = (f"{'constraint.gamma>=' + format(looser, '.2f') + ', ' if looser <= 1.0 else ''}constraint.confidence=0.5, more "
                     f"rows{', a larger eps' if released else ''}")
            log.warning("constraint.confidence=auto (%g) cannot be met: %s needs a margin of %.3f > gamma=%g (%s%d training rows in "
                        "its smallest subset); trained against gamma itself, no confidence claimed. Helps: %s", confidence,
                        cons.names[j], found.margin[j], cons.gamma[j], "~" if released else "", smallest, short)
            return cons, None, (f"auto ({confidence:g}) not met: {cons.names[j]} needs a margin of {found.margin[j]:.3f} > "
                                f"gamma {cons.gamma[j]:g}; trained against gamma itself (helps: {short})")
        raise UnsupportedError(f"constraint.confidence={confidence:g} {why}. Use {helps}; constraint.confidence=null trains "
                               "against gamma itself.")
    log.info("constraint.confidence=%g: training and selection target gamma - margin, margins %s",
             confidence, ", ".join(f"{m:.4f}" for m in found.margin))
    return replace(cons, gamma=targets), found, None


def estimate_private_values(spec: RunSpec, data: Any, method_spec: Any, seeds: Any) -> tuple[Any, Any]:
    """A table's ``private`` bounds, level lists and missing-value indicators, estimated in one
    Gaussian release from its training split (:mod:`raco_cli.privacy.estimates`), drawn per
    run (never cached with the data), then the table encoded with them; the method spec
    gains the release's noise multiplier (its DpEvent in the plan) and the delta its threshold
    reserves.

    Raises:
        ConfigError: ``privacy.delta_exponent`` (delta must be known before n), or an
            estimate that leaves the label fewer than two classes.
    """
    from raco_cli.data.table import finish
    from raco_cli.errors import ConfigError
    from raco_cli.privacy.estimates import estimate_table
    from raco_cli.privacy.mechanisms import noise_source

    if spec.delta_exponent is not None:
        raise ConfigError(f"privacy.delta_exponent={spec.delta_exponent:g} cannot be combined with private values of the table "
                          "(their threshold needs delta before the training size is known); set privacy.delta_exponent=null "
                          "or declare the values public.")
    sigma = spec.dataset.estimate_noise_multiplier
    est = estimate_table(data, noise_multiplier=sigma, eps=spec.eps, delta=spec.delta,
                         source=noise_source(seeds.estimates, "cpu", secure=spec.secure_rng))
    log.info("Private estimates (one Gaussian release, L2 sensitivity sqrt(M), M = %d (a private type counts 2), noise "
             "multiplier %g, noise std %.4g, threshold %.4g): %s",
             est.columns, sigma, est.std, est.threshold, json.dumps({k: v for k, v in est.to_dict().items()
                                                                    if k in ("types", "bounds", "levels", "missing_indicator")}))
    return finish(data, est), replace(method_spec, estimate_noise=sigma, reserved_delta=est.reserved_delta)


def check_task(spec: RunSpec, method: Any, data: Any) -> None:
    """``task`` against the dataset, the method and the constraint (one line each).

    Raises:
        ConfigError: ``task`` contradicts the dataset, or a private regression run asks for the
            accuracy-based private checkpoint choice.
        UnsupportedError: the method or the constraint needs class labels.
    """
    from raco_cli.errors import ConfigError, UnsupportedError

    if spec.task not in ("auto", data.task):
        label = "a real-valued label" if data.task == "regression" else "class labels"
        need = "a real-valued label (dataset=group_mixture)" if spec.task == "regression" else "class labels"
        raise ConfigError(f"task={spec.task} needs a dataset with {need}; dataset={spec.dataset.name} has {label} "
                          f"(task={data.task}). Use task=auto.")
    if data.task not in getattr(method, "TASKS", ("classification",)):
        raise UnsupportedError(f"method={spec.method.name} does not support task={data.task} (it needs class labels: a "
                               f"cross-entropy loss and class rates); use method={REGRESSION_METHODS}.")
    if data.task != "regression":
        return
    if spec.constraint.name != "none":
        raise UnsupportedError(f"constraint={spec.constraint.name} needs class rates (P(prediction = k | group)); task=regression "
                               "has a real-valued label and no classes. Use constraint=none (DPSE's bounded group loss is "
                               "method.options.bgl_penalty).")
    if method.PRIVATE and spec.scope == "model" and spec.method.selection == "best_feasible":
        raise ConfigError("method.selection=best_feasible needs a bounded validation score for the private checkpoint choice of "
                          "privacy.scope=model, and task=regression has none (the squared error is unbounded). Use "
                          "method.selection=last (the paper's last iterate) or privacy.scope=paper.")
