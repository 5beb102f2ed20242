"""Deliberately broken mechanisms: the audit's own test cases.

Reachable only through ``raco audit audit.mechanism=<name>`` and the tests; ``raco train``
has no key that selects them.  Each one replaces the function the training code calls, for
the duration of a ``with`` block, in both SGDA engines (the batched engine every linear run on
the CPU trains on, :mod:`raco_cli.methods.sgda.batched`, and the one-run loop of other models
and devices, :mod:`raco_cli.methods.sgda.core`), so everything else the audit runs is the
unmodified training code.

Histogram (``audit.target=histogram``; the Laplace sampler):

* ``broken_no_noise``: the histogram is released without noise.
* ``broken_shared_class_noise``: one Laplace draw per histogram row, shared by every
  predicted class of the row (the public reference code's defect for its EO/FNR histograms,
  SPEC section 1).  Each entry still has the right marginal Laplace(b), so per-entry
  checks pass; the differences between the entries of a row are noise-free.

Gradient (``audit.target=gradient``):

* ``broken_noise_sigma``: the noise on the clipped sum has std sigma instead of sigma * C (the
  Gaussian sampler called with std / C).  Identical to the
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
from contextlib import contextmanager, suppress
from typing import Any

HISTOGRAM_MECHANISMS: tuple[str, ...] = ("correct", "broken_no_noise", "broken_shared_class_noise")
GRADIENT_MECHANISMS: tuple[str, ...] = ("correct", "broken_noise_sigma", "broken_clip_after_sum")


@contextmanager
def replaced(*swaps: tuple[Any, str, Any]) -> Iterator[None]:
    """Run the block with each ``(owner, name, value)``'s attribute set to value, then restored."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
    try:
        for owner, name, value in swaps:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in originals:
            with suppress(Exception):
                setattr(owner, name, value)


@contextmanager
def histogram_mechanism(name: str) -> Iterator[None]:
    """Run the block with the named histogram noise (``correct``: unchanged)."""
    if name not in HISTOGRAM_MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}")
    if name == "correct":
        yield
        return
    import torch

    from raco_cli.methods.sgda import batched, core

    one, many = core.laplace_noise, batched.laplace_many

    def no_noise(shape, scale, generator, *, dtype=torch.float64):  # noqa: ANN001, ANN202
        return torch.zeros(shape, dtype=dtype, device=generator.device)

    def shared_class_noise(shape, scale, generator, *, dtype=torch.float64):  # noqa: ANN001, ANN202
        row = one((*shape[:-1], 1), scale, generator, dtype=dtype)
        return row.expand(shape).clone()

    def no_noise_many(shape, scales, sources):  # noqa: ANN001, ANN202
        return torch.zeros((len(scales), *shape), dtype=torch.float64)

    def shared_class_noise_many(shape, scales, sources):  # noqa: ANN001, ANN202
        return many((*shape[:-1], 1), scales, sources).expand(len(scales), *shape).clone()

    broken = name == "broken_no_noise"
    with replaced((core, "laplace_noise", no_noise if broken else shared_class_noise),
                  (batched, "laplace_many", no_noise_many if broken else shared_class_noise_many)):
        yield


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

    from raco_cli.methods import batched_scan, gradients
    from raco_cli.methods.sgda import batched, core

    if name == "broken_noise_sigma":
        one, many = core.gaussian_noise, batched.gaussian_many

        def sigma_only(shape, std, generator, *, dtype=torch.float32):  # noqa: ANN001, ANN202
            return one(shape, std / clip_norm, generator, dtype=dtype)

        def sigma_only_many(shape, stds, sources, *, dtype):  # noqa: ANN001, ANN202
            return many(shape, [s / clip_norm for s in stds], sources, dtype=dtype)

        with replaced((core, "gaussian_noise", sigma_only), (batched, "gaussian_many", sigma_only_many)):
            yield
        return

    bound = float(clip_norm) * expected_batch
    original_sum, original_sums = gradients.LinearEngine.clipped_sum, batched_scan.Scan.clipped_sums

    def clip_after_sum(self, *args, clip_norm=None, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        res = original_sum(self, *args, clip_norm=None, **kwargs)  # unclipped per-sample gradients, summed
        total = float(torch.sqrt(sum((g * g).sum() for g in res.grads)))
        factor = min(1.0, bound / total) if total > 0 else 1.0
        return gradients.ClippedSum([g * factor for g in res.grads], res.clipped, res.norm_sum, res.nonfinite)

    def clip_after_sums(self, weights, reg_temp, temperature, clip):  # noqa: ANN001, ANN202
        res = original_sums(self, weights, reg_temp, temperature, None)  # each run's unclipped sums
        total = torch.sqrt((res.grad_w.double() ** 2).sum(dim=(1, 2)) + (res.grad_b.double() ** 2).sum(dim=1))
        factor = torch.where(total > bound, bound / total, torch.ones_like(total)).float()
        return batched_scan.GroupSum(grad_w=res.grad_w * factor[:, None, None], grad_b=res.grad_b * factor[:, None], clipped=res.clipped,
                                     norm_sum=res.norm_sum, nonfinite=res.nonfinite)

    with replaced((gradients.LinearEngine, "clipped_sum", clip_after_sum), (batched_scan.Scan, "clipped_sums", clip_after_sums)):
        yield
