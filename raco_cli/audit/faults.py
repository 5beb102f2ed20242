"""Deliberately broken mechanisms: the audit's own test cases.

Reachable only through ``raco audit audit.mechanism=<name>`` and the tests; ``raco train``
has no key that selects them.  Each one replaces one function the training code calls, for
the duration of a ``with`` block, so everything else the audit runs is the unmodified
training code.

Histogram (``audit.target=histogram``; the Laplace sampler of :mod:`raco_cli.methods.sgda.core`):

* ``broken_no_noise``: the histogram is released without noise.
* ``broken_shared_class_noise``: one Laplace draw per histogram row, shared by every
  predicted class of the row (the public reference code's defect for its EO/FNR histograms,
  SPEC section 1).  Each entry still has the right marginal Laplace(b), so per-entry
  checks pass; the differences between the entries of a row are noise-free.

Gradient (``audit.target=gradient``):

* ``broken_noise_sigma``: the noise on the clipped sum has std sigma instead of sigma * C (the
  Gaussian sampler of :mod:`raco_cli.methods.sgda.core` called with std / C).  Identical to the
  correct mechanism at C = 1, so it is audited at C != 1.
* ``broken_clip_after_sum``: no per-sample clipping; the per-sample gradients are summed and
  the batch mean (sum / q|D|) is clipped to C, i.e. the sum to C q|D| (the clipping of the
  DP-DRO paper's Algorithm 2; one record then moves the sum by up to 2 C q|D|, not C).
  Clipping the *sum* to C instead (sensitivity 2C) cannot be seen by one-coordinate canaries:
  each canary's own coordinate still moves by at most C (the leak is in the shared direction
  of the batch); the unit tests and the mutation suite catch that variant.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

HISTOGRAM_MECHANISMS: tuple[str, ...] = ("correct", "broken_no_noise", "broken_shared_class_noise")
GRADIENT_MECHANISMS: tuple[str, ...] = ("correct", "broken_noise_sigma", "broken_clip_after_sum")


@contextmanager
def histogram_mechanism(name: str) -> Iterator[None]:
    """Run the block with the named histogram noise (``correct``: unchanged)."""
    if name not in HISTOGRAM_MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}")
    if name == "correct":
        yield
        return
    import torch

    from raco_cli.methods.sgda import core

    original = core.laplace_noise

    def no_noise(shape, scale, generator, *, dtype=torch.float64):  # noqa: ANN001, ANN202
        return torch.zeros(shape, dtype=dtype, device=generator.device)

    def shared_class_noise(shape, scale, generator, *, dtype=torch.float64):  # noqa: ANN001, ANN202
        row = original((*shape[:-1], 1), scale, generator, dtype=dtype)
        return row.expand(shape).clone()

    core.laplace_noise = no_noise if name == "broken_no_noise" else shared_class_noise
    try:
        yield
    finally:
        core.laplace_noise = original


@contextmanager
def gradient_mechanism(name: str, *, clip_norm: float, expected_batch: float) -> Iterator[None]:
    """Run the block with the named gradient release (``correct``: unchanged).

    ``clip_norm``: C of the audited run; ``expected_batch``: its q|D| (the normaliser of the
    noisy sum, whose mean ``broken_clip_after_sum`` clips).
    """
    if name not in GRADIENT_MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}")
    if name == "correct":
        yield
        return
    import torch

    from raco_cli.methods import gradients
    from raco_cli.methods.sgda import core

    if name == "broken_noise_sigma":
        original_noise = core.gaussian_noise

        def sigma_only(shape, std, generator, *, dtype=torch.float32):  # noqa: ANN001, ANN202
            return original_noise(shape, std / clip_norm, generator, dtype=dtype)

        core.gaussian_noise = sigma_only
        try:
            yield
        finally:
            core.gaussian_noise = original_noise
        return

    original_sum = gradients.LinearEngine.clipped_sum

    def clip_after_sum(self, *args, clip_norm=None, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        res = original_sum(self, *args, clip_norm=None, **kwargs)  # unclipped per-sample gradients, summed
        bound = float(clip_norm if clip_norm is not None else 0.0) * expected_batch
        total = float(torch.sqrt(sum((g * g).sum() for g in res.grads)))
        factor = min(1.0, bound / total) if total > 0 else 1.0
        return gradients.ClippedSum([g * factor for g in res.grads], res.clipped, res.norm_sum, res.nonfinite)

    gradients.LinearEngine.clipped_sum = clip_after_sum  # type: ignore[method-assign]
    try:
        yield
    finally:
        gradients.LinearEngine.clipped_sum = original_sum  # type: ignore[method-assign]
