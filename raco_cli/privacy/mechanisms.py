"""Randomness of the private releases: Poisson sampling, Laplace and Gaussian noise.

Sampling and noise draw from separate generators (as Opacus separates the data loader's
``generator`` from the optimizer's ``noise_generator``), so both can be seeded, logged and
replayed independently.
"""

from __future__ import annotations

import torch


def poisson_sample(
    n: int, sample_rate: float, generator: torch.Generator, device: torch.device | str = "cpu", *, count: int = 1
) -> list[torch.Tensor]:
    """``count`` independent Poisson samples of ``range(n)``: each row in each sample w.p. q.

    Implemented with geometric gaps between included rows (the gaps between successes of
    i.i.d. Bernoulli(q) trials are i.i.d. Geometric(q)), which costs O(q n) draws instead of
    n uniforms.  The ``count`` samples are one Bernoulli process over ``count * n`` virtual
    rows, cut into ``count`` blocks, so they are independent.  Batch sizes are
    Binomial(n, q) and may be 0 (an empty batch is a normal outcome).

    Returns:
        ``count`` sorted int64 index tensors.
    """
    total = count * n
    if sample_rate >= 1.0:
        positions = torch.arange(total, dtype=torch.float64)
    else:
        expected = total * sample_rate
        chunk = int(expected + 6.0 * expected**0.5 + 16)
        parts, last = [], -1.0
        while last < total:
            gaps = torch.empty(chunk, dtype=torch.float64).geometric_(sample_rate, generator=generator)
            pos = gaps.cumsum(0) + last
            parts.append(pos)
            last = float(pos[-1])
        positions = parts[0] if len(parts) == 1 else torch.cat(parts)
        positions = positions[positions < total]
    idx = positions.long()
    if count == 1:
        return [idx.to(device)]
    cuts = torch.searchsorted(idx, torch.arange(1, count, dtype=torch.long) * n)
    blocks = torch.tensor_split(idx, cuts)
    return [(b - i * n).to(device) for i, b in enumerate(blocks)]


def laplace_noise(shape: tuple[int, ...], scale: float, generator: torch.Generator, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """i.i.d. Laplace(0, scale) noise, one independent draw per entry.

    Drawn as the difference of two Exp(1) variables times the scale (no log of 0 at the
    edge of the uniform's support, unlike the inverse-CDF method).
    """
    e = torch.empty((2, *shape), dtype=dtype, device=generator.device).exponential_(generator=generator)
    return scale * (e[0] - e[1])


def gaussian_noise(shape: tuple[int, ...], std: float, generator: torch.Generator, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """i.i.d. N(0, std^2) noise."""
    return std * torch.randn(shape, generator=generator, dtype=dtype, device=generator.device)
