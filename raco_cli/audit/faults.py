"""Deliberately broken histogram mechanisms: the audit's own test cases.

Reachable only through ``raco audit audit.mechanism=<name>`` and the tests; ``raco train``
has no key that selects them.  Each one replaces the Laplace sampler that
:mod:`raco_cli.methods.core` calls, for the duration of a ``with`` block, so everything else
the audit runs is the unmodified training code.

* ``broken_no_noise``: the histogram is released without noise.
* ``broken_shared_class_noise``: one Laplace draw per histogram row, shared by every
  predicted class of the row (the public reference code's defect for its EO/FNR histograms,
  SPEC section 1).  Each entry still has the right marginal Laplace(b), so per-entry
  checks pass; the differences between the entries of a row are noise-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

MECHANISMS: tuple[str, ...] = ("correct", "broken_no_noise", "broken_shared_class_noise")


@contextmanager
def histogram_mechanism(name: str) -> Iterator[None]:
    """Run the block with the named histogram noise (``correct``: unchanged)."""
    if name not in MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}")
    if name == "correct":
        yield
        return
    import torch

    from raco_cli.methods import core

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
