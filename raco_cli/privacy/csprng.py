"""Draws from the operating system's CSPRNG (``os.urandom``, the source behind ``secrets``),
the one host-side path of every secret random choice: the private batches and the CPU's noise
(:mod:`raco_cli.privacy.mechanisms`) and the private search's number of trials K, candidates and
trial seeds (:mod:`raco_cli.run.private_search`).  The noise of an accelerator is drawn on the
device instead, from a ChaCha20 stream keyed with ``os.urandom`` bytes
(:mod:`raco_cli.privacy.chacha20`).

A PRNG merely *seeded* from ``os.urandom`` (numpy's PCG64) would not do: its state can be
reconstructed from its outputs, after which every other draw (K, say, from the released trial's
seed) is known.  :class:`SecureDraws` has the face of the few ``numpy.random.Generator`` methods
the search uses, each draw by inversion of its distribution on CSPRNG uniforms (no torch import:
the command line's side loads it lazily).
"""

from __future__ import annotations

import math
import os
import secrets

import numpy as np


def urandom_words(count: int) -> np.ndarray:
    """``count`` uniform 64-bit words from ``os.urandom`` (one 8-byte read each, in order), as a
    writable uint64 array: the bits every secure host-side draw is cut from."""
    return np.frombuffer(bytearray(os.urandom(8 * count)), dtype=np.uint64)


def urandom_53_bits(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform 53-bit integers from ``os.urandom`` (the top 53 bits of :func:`urandom_words`, in
    row-major order), as float64 of shape ``shape``: the draws the secure sources scale into
    (0, 1) / [0, 1)."""
    bits = urandom_words(math.prod(shape)) >> np.uint64(11)
    return bits.astype(np.float64).reshape(shape)


def uniform01() -> float:
    """One uniform on (0, 1) from ``os.urandom`` (``(k + 0.5) / 2**53``: never 0 or 1)."""
    return float((urandom_53_bits((1,))[0] + 0.5) * 2.0**-53)


def below(n: int) -> int:
    """A uniform integer in ``[0, n)`` from ``os.urandom`` (:func:`secrets.randbelow`)."""
    return secrets.randbelow(int(n))


def _invert(u: float, log_pmf, start: int, cap: int) -> int:
    """The smallest k >= start whose CDF reaches u (k = cap when the tail is below float precision)."""
    total, k = 0.0, start
    while k < cap:
        total += math.exp(log_pmf(k))
        if total >= u:
            return k
        k += 1
    return cap


class SecureDraws:
    """``numpy.random.Generator``'s ``uniform``, ``integers``, ``poisson``, ``negative_binomial``
    and ``logseries`` (scalars), every draw from ``os.urandom``."""

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        return low + (high - low) * uniform01()

    def integers(self, high: int) -> int:
        return below(high)

    def poisson(self, lam: float) -> int:
        lam = float(lam)
        cap = int(lam + 40.0 * math.sqrt(lam) + 100)
        return _invert(uniform01(), lambda k: -lam + k * math.log(lam) - math.lgamma(k + 1), 0, cap)

    def negative_binomial(self, n: float, p: float) -> int:
        """Failures before the ``n``-th success of Bernoulli(p) trials (numpy's parametrisation)."""
        n, p = float(n), float(p)
        mean = n * (1 - p) / p
        cap = int(mean + 60.0 * math.sqrt(mean / p) + 100)
        return _invert(uniform01(), lambda k: math.lgamma(k + n) - math.lgamma(n) - math.lgamma(k + 1)
                       + n * math.log(p) + k * math.log1p(-p), 0, cap)

    def logseries(self, p: float) -> int:
        """The logarithmic distribution: ``P(k) = -p^k / (k log(1 - p))``, k >= 1."""
        p = float(p)
        norm = -math.log1p(-p)
        cap = int(100 + 60.0 / max(-math.log(p), 1e-12))
        return _invert(uniform01(), lambda k: k * math.log(p) - math.log(k) - math.log(norm), 1, cap)
