"""The five DRO methods, one :class:`DroMethod` each, registered in :data:`raco_cli.methods.METHODS`
as ``raco_cli.methods.dro.methods:<name>``.

A DRO method runs one :class:`Algorithm` (a loop of :mod:`.spider` or :mod:`.sgda`) on a
:class:`~raco_cli.methods.dro.common.DroRun` under ``objective=dro``.  The private ones clip every
release per record and add Gaussian noise (the printed algorithms clip batch means); the
non-private ``spider`` runs either SPIDER loop (``options.variant``) without clipping or noise.
The last iterate is the output by default; ``method.selection=random`` gives the printed random
iterate.  The loops' modules spell out each update and DpEvent tree; in short, with
q = ``batch_size / n``, q1 = ``refresh_batch_factor`` x q, a refresh every p = ``options.phase``
steps, PS = PoissonSampled and G = Gaussian:

* ``dp_double_spider``: DP Double-SPIDER (DP-DRO paper, Algorithm 2) on the psi-divergence DRO
  objective (eq. 3, any divergence): SPIDER estimators for the dual block (eta; and lambda for
  the KL-constrained form) and for x::

      Composed[SelfComposed(Composed[PS(q1, G(sigma_1)), PS(q1, G(sigma_3))], ceil(T/p)),
               SelfComposed(Composed[PS(q, G(sigma_2)), PS(q, G(sigma_4))], T - ceil(T/p))]

* ``dp_recursive_spider``: DP Recursive-SPIDER (Algorithm 3) on the KL-constrained objective
  (eq. 5): SPIDER estimators of ``mean grad_x g`` (v) and ``mean dg/dlambda`` (u) with
  ``g_i = exp(l_i / lambda)``, a STORM estimate s of the inner mean on its own Poisson batch
  (line 16, rate q5), and the step of line 18::

      Composed[SelfComposed(Composed[PS(q1, G(sigma_1)), PS(q1, G(sigma_3)), PS(q5, G(sigma_s))], ceil(T/p)),
               SelfComposed(Composed[PS(q, G(sigma_2)), PS(q, G(sigma_4)), PS(q5, G(sigma_s))], T - ceil(T/p))]

* ``dp_sgda``: DP-SGDA on the minimax form (eq. 2), the paper's baseline: descent on
  (x, eta[, lambda]) with noisy per-record-clipped sums, ascent on the per-record density
  ratios (hidden state, never released)::

      SelfComposed(PoissonSampled(q, Composed[Gaussian(sigma), Gaussian(sigma_dual)]), T)

* ``dp_private_diff``: PrivateDiff Minimax (Zhang, Lei, Ding, Xiang, Xu, Wang, AAAI 2025,
  Algorithm 3), the paper's second baseline: gradient-difference estimators of the min
  variables, ``options.inner_steps`` ascent steps on the sampled ratios per round::

      Composed[SelfComposed(PS(q, Composed[G(sigma_1), G(sigma_dual)]), ceil(T/p)),
               SelfComposed(PS(q, Composed[G(sigma_2), G(sigma_dual_diff)]), T - ceil(T/p))]

* ``spider``: the non-private reference of the two DP SPIDER methods, ``options.variant``
  ``double`` (Algorithm 2, any divergence) or ``recursive`` (Algorithm 3, divergence kl); the
  other options are the private methods' (their noise and clip keys are accepted and unused).

The non-private ``sgda`` (:mod:`raco_cli.methods.sgda.sgda`) runs :data:`SGDA`'s loop the same
way under ``objective=dro``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import dp_accounting as dpa

from raco_cli.errors import ConfigError
from raco_cli.methods.base import MethodSpec
from raco_cli.methods.dro import sgda as sgda_loops
from raco_cli.methods.dro import spider as spider_loops
from raco_cli.methods.dro.common import DroRun, require_dro, theorem_phase
from raco_cli.privacy import accountant, events


@dataclass(frozen=True)
class Algorithm:
    """One DRO loop and what a method needs around it.

    Attributes:
        variant: its ``method.options.variant`` value where a method offers several.
        title: how error messages name it.
        defaults: its ``method.options`` defaults.
        options: ``(spec, defaults) -> options``: ``method.options`` over ``defaults``, checked.
        loop: ``(run, options) -> final dual block``: the loop on a :class:`DroRun`.
        event: ``(spec, sample_rate, steps, options) -> DpEvent``: the tree of a private run.
        kl_only: it needs the KL-constrained compositional form (eq. 5).
    """

    variant: str
    title: str
    defaults: dict[str, Any]
    options: Callable[[MethodSpec, dict[str, Any]], dict[str, Any]]
    loop: Callable[[DroRun, dict[str, Any]], list[float]]
    event: Callable[[MethodSpec, float, int, dict[str, Any]], dpa.DpEvent]
    kl_only: bool = False


DOUBLE_SPIDER = Algorithm("double", "Algorithm 2", spider_loops.DOUBLE_DEFAULTS, spider_loops.double_options,
                          spider_loops.run_double, spider_loops.double_event)
RECURSIVE_SPIDER = Algorithm("recursive", "Algorithm 3", spider_loops.RECURSIVE_DEFAULTS, spider_loops.recursive_options,
                             spider_loops.run_recursive, spider_loops.recursive_event, kl_only=True)
SGDA = Algorithm("sgda", "DP-SGDA", sgda_loops.SGDA_DEFAULTS, sgda_loops.sgda_options, sgda_loops.run_sgda,
                 sgda_loops.sgda_event)
PRIVATE_DIFF = Algorithm("private_diff", "PrivateDiff Minimax", sgda_loops.DIFF_DEFAULTS, sgda_loops.diff_options,
                         sgda_loops.run_private_diff, sgda_loops.diff_event)


@dataclass(frozen=True, eq=False)
class DroMethod:
    """A DRO method behind the method interface (:mod:`raco_cli.methods.base`).

    ``algorithms``: what it runs; with more than one, ``method.options.variant`` picks one (the
    first by default).  ``PRIVATE``: every release clipped and noised; otherwise the same loops
    without either, accounted as non-private steps.
    """

    NAME: str
    algorithms: tuple[Algorithm, ...]
    PRIVATE: bool = True
    DEFAULTS: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        # one algorithm: its defaults; several: all their keys, and the variant
        defaults = self.algorithms[0].defaults
        if len(self.algorithms) > 1:
            defaults = {key: value for a in self.algorithms for key, value in a.defaults.items()}
            defaults["variant"] = self.algorithms[0].variant
        object.__setattr__(self, "DEFAULTS", defaults)

    def algorithm(self, spec: MethodSpec) -> Algorithm:
        """The algorithm ``spec`` runs (``method.options.variant``).

        Raises:
            ConfigError: an unknown variant.
        """
        if len(self.algorithms) == 1:
            return self.algorithms[0]
        names = tuple(a.variant for a in self.algorithms)
        variant = dict(spec.options).get("variant", names[0])
        if variant not in names:
            meaning = " or ".join(f"{a.title} ({a.variant}{', divergence kl' if a.kl_only else ''})" for a in self.algorithms)
            raise ConfigError(f"method.options.variant must be one of {', '.join(names)} "
                              f"(got method.options.variant={variant!r}); {meaning}.")
        return self.algorithms[names.index(variant)]

    def options(self, spec: MethodSpec) -> dict[str, Any]:
        """``method.options`` over :attr:`DEFAULTS`, checked by each algorithm the method may
        run (the first's checks last)."""
        out: dict[str, Any] = {}
        for a in reversed(self.algorithms):
            out.update(a.options(spec, self.DEFAULTS))
        return out

    def validate(self, spec: MethodSpec, constraints, data=None) -> None:
        """Needs ``objective=dro`` (Algorithm 3: with ``divergence=kl``); options checked."""
        require_dro(spec, name=self.NAME, kl_only=self.algorithm(spec).kl_only)
        self.options(spec)

    def step_event(self, spec: MethodSpec, sample_rate: float, *, constrained: bool = True) -> dpa.DpEvent:
        if not self.PRIVATE:
            return events.non_private()
        return self.run_event(spec, sample_rate, 1)

    def run_event(self, spec: MethodSpec, sample_rate: float, steps: int, *, constrained: bool = True) -> dpa.DpEvent:
        """The DpEvent tree of a run of ``steps`` steps, from the algorithm (a refresh /
        correction schedule is not one step repeated); non-private: the non-private step repeated."""
        if not self.PRIVATE:
            return accountant.repeated_event(self.step_event(spec, sample_rate, constrained=constrained), steps)
        return self.algorithm(spec).event(spec, sample_rate, steps, self.options(spec))

    def fit(self, data, model, constraints, spec, *, steps, seeds, device, reporter):
        self.validate(spec, constraints, data)
        o = self.options(spec)
        run = DroRun(data, model, constraints, spec, steps=steps, seeds=seeds, device=device, reporter=reporter, private=self.PRIVATE,
                     clipped=not self.PRIVATE and bool(o.get("clipped", False)))
        return run.finish(self.algorithm(spec).loop(run, o))

    def resolve(self, spec: MethodSpec, *, n_train: int, eps: float | None, delta: float, dim: int) -> MethodSpec:
        """``spec`` with ``options.phase=auto`` replaced by its value (called by the run before
        planning, from public quantities: the training size, the budget and the model size;
        :func:`~raco_cli.methods.dro.common.theorem_phase`), so the plan, the loop and the
        records all see one integer."""
        o = self.options(spec)
        if o.get("phase") != "auto":
            return spec
        phase = theorem_phase(n=n_train, eps=eps, delta=delta, dim=dim, private=self.PRIVATE)
        return replace(spec, options={**dict(spec.options), "phase": phase})


dp_double_spider = DroMethod("dp_double_spider", (DOUBLE_SPIDER,))
dp_recursive_spider = DroMethod("dp_recursive_spider", (RECURSIVE_SPIDER,))
dp_sgda = DroMethod("dp_sgda", (SGDA,))
dp_private_diff = DroMethod("dp_private_diff", (PRIVATE_DIFF,))
spider = DroMethod("spider", (DOUBLE_SPIDER, RECURSIVE_SPIDER), PRIVATE=False)
