"""Randomness of the private releases: Poisson sampling, Laplace and Gaussian noise.

Sampling and noise draw from separate generators (as Opacus separates the data loader's
``generator`` from the optimizer's ``noise_generator``), so both can be seeded, logged and
replayed independently.

Noise source (``privacy.secure_rng``):

* ``false`` (default): a seeded ``torch.Generator`` (Mersenne Twister on the CPU, Philox on
  CUDA).  Reproducible, fast, and *predictable*: anyone who knows the seed (it is logged) or
  enough outputs can recompute the noise and subtract it, so the guarantee then only holds
  against adversaries who know neither.  Fine for research, not for releasing a model.
* ``true``: :class:`SecureNoise`, every uniform from a cryptographically secure source, then
  transformed in float64 in torch on the noise's device: on the CPU ``os.urandom`` (the
  kernel's CSPRNG, the source behind Python's ``secrets``), on an accelerator a ChaCha20
  stream cipher (RFC 8439, :mod:`raco_cli.privacy.chacha20`) computed on the device, keyed
  with 32 fresh bytes of ``os.urandom`` that are never written anywhere (rekeyed before its
  block counter wraps and in a forked child).  Not reproducible by design; the noise seed is
  ignored.  The Poisson batches then come from ``os.urandom`` too (:class:`SecureUniforms`, on
  the host) and no sampling seed is recorded.  A PRNG merely *seeded* from ``os.urandom``
  (numpy's PCG64, torch's MT19937, Philox) would not do: their state can be reconstructed
  from their outputs (624 outputs for MT19937), after which every later draw is known; a
  stream cipher's key cannot (that is its security claim).  torchcsprng (Opacus'
  ``secure_mode``) has no distribution pip can install for this platform and torch 2.13.

What neither source fixes (Mironov, "On significance of the least significant bits for
differential privacy", CCS 2012): Laplace and Gaussian samples computed in floating point
do not have the continuous distributions the proofs assume.  Their support is porous
(``mu + b * (E1 - E2)`` cannot reach every double near ``mu``, and which doubles it reaches
depends on ``mu``), so a single output can reveal the unnoised value.  The fixes are the
snapping mechanism (Mironov 2012) for Laplace and exact discrete samplers (discrete
Gaussian/Laplace, Canonne, Kamath and Steinke 2020) on a fixed grid; raco has the exact
discrete Gaussian for its integer counts only (:mod:`raco_cli.privacy.discrete`), the float
releases of this module have neither, and ``secure_rng`` only removes the predictability of
their random bits.  See the
docs/privacy.md, section "Noise source and floating point".
"""

from __future__ import annotations

import math
import os  # noqa: F401 - os.urandom, read by raco_cli.privacy.csprng (tests patch mechanisms.os.urandom: the os module)
from collections.abc import Callable

import numpy as np
import torch

from raco_cli.privacy.chacha20 import ChaChaStream


class SecureNoise:
    """Noise from a cryptographically secure source, with a generator-like face.

    Uniforms on the open interval (0, 1) with 53 random bits, ``(k + 0.5) / 2**53`` for a
    uniform 53-bit integer k, so ``log`` never sees 0, in float64 on ``device`` (where
    results go).  The 53-bit integers come from

    * on an accelerator (``device.type != "cpu"``): a :class:`~raco_cli.privacy.chacha20.ChaChaStream`
      on that device, ChaCha20 (RFC 8439) keyed with 32 fresh bytes of ``os.urandom`` (rekeyed
      before its counter wraps and in a forked child), so the bits are made where the noise is
      added instead of read on the host and copied over;
    * on the CPU: ``os.urandom`` directly.  Measured on this project's 2-core CPU (torch 2.13,
      2 threads), 2 M uniforms: ``os.urandom`` 0.034 s, the torch ChaCha20 1.1 s (33 times
      slower: eager torch has no uint32 add or shift, so every word op is an int64 pass).
    """

    def __init__(self, device: torch.device | str = "cpu", *, chacha: bool | None = None) -> None:
        """``chacha``: draw from a ChaCha20 stream on the device (True) or from ``os.urandom``
        (False); by default (None) the stream on accelerators, ``os.urandom`` on the CPU."""
        self.device = torch.device(device)
        if chacha is None:
            chacha = self.device.type != "cpu"
        self._stream: ChaChaStream | None = ChaChaStream(self.device) if chacha else None

    def uniform(self, shape: tuple[int, ...]) -> torch.Tensor:
        """float64 uniforms on (0, 1), shape ``shape``, on the device."""
        if self._stream is not None:
            return self._stream.bits53(shape).add_(0.5).mul_(2.0**-53)
        return _urandom_uniform_tensor(shape)

    def host_uniform(self, shape: tuple[int, ...]) -> np.ndarray:
        """:meth:`uniform`'s distribution as a numpy array on the host, from ``os.urandom``
        (on any device: for callers that need numpy)."""
        return (_urandom_53_bits(shape) + 0.5) * 2.0**-53


NoiseSource = torch.Generator | SecureNoise


def noise_source(seed: int, device: torch.device | str, *, secure: bool) -> NoiseSource:
    """The generator of a run's noise: seeded torch PRNG, or :class:`SecureNoise`."""
    if secure:
        return SecureNoise(device)
    return torch.Generator(device=device).manual_seed(seed)


class SecureUniforms:
    """Uniforms on [0, 1) from ``os.urandom`` with numpy's ``Generator.random`` face, for the
    Poisson sampler under ``privacy.secure_rng``: amplification by sampling assumes the
    batches are secret, which a recorded (or reconstructible) sampling seed would undo."""

    def random(self, size: int | tuple[int, ...]) -> np.ndarray:
        shape = (int(size),) if isinstance(size, (int, np.integer)) else tuple(size)
        return _urandom_53_bits(shape) * 2.0**-53


def _urandom_53_bits(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform 53-bit integers from ``os.urandom`` (:func:`raco_cli.privacy.csprng.urandom_53_bits`,
    the one CSPRNG path), as float64 of shape ``shape``: the draws both secure sources scale into
    (0, 1) / [0, 1)."""
    from raco_cli.privacy.csprng import urandom_53_bits

    return urandom_53_bits(shape)


def _urandom_uniform_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """``(k + 0.5) / 2**53`` of :func:`_urandom_53_bits` (the same bytes, the same float64
    operations) as a CPU tensor of shape ``shape``, in one array: the shifted integers are
    converted and scaled in their own memory (numpy defines an overlapping ufunc's result as
    without overlap), which torch then shares.  Each fresh array of millions of entries costs
    its page faults (~2.5 ms a million doubles here), so one instead of three (shift, float,
    scale) matters at ResNet16's 6.5 M."""
    from raco_cli.privacy.csprng import urandom_words

    bits = urandom_words(math.prod(shape))
    bits >>= np.uint64(11)
    u = bits.view(np.float64)
    np.add(bits, 0.5, out=u)
    u *= 2.0**-53
    return torch.from_numpy(u.reshape(shape))


#: In place on (R, W) float64: ``floor``, then ``+ 1``, then the running sum along each row.
GapSums = Callable[[np.ndarray], np.ndarray]


def sampling_generator(seed: int, *, secure: bool = False) -> np.random.Generator | SecureUniforms:
    """The generator of a run's Poisson samples (on the host): seeded numpy, or
    :class:`SecureUniforms` with ``secure`` (the seed is then unused and not recorded).

    Batches are drawn on the host with numpy: a numpy op costs about a microsecond against
    several for a torch op on these short vectors, and the indices are needed on the host
    anyway to read lazy feature stores; a seed gives the same batches on every device.
    """
    if secure:
        return SecureUniforms()
    return np.random.default_rng(seed)


def poisson_sample(
    n: int, sample_rate: float, generator: np.random.Generator | SecureUniforms, device: torch.device | str = "cpu", *, count: int = 1
) -> list[torch.Tensor]:
    """``count`` independent Poisson samples of ``range(n)``: each row in each sample w.p. q.

    Implemented with geometric gaps between included rows (the gaps between successes of
    i.i.d. Bernoulli(q) trials are i.i.d. Geometric(q)), which costs O(q n) draws instead of
    n uniforms.  A gap is ``G = floor(log(V) / log(1 - q)) + 1`` with ``V = 1 - U`` uniform on
    (0, 1], so ``P(G = k) = (1-q)^(k-1) q`` for k >= 1 (never 0: no duplicate rows).  The
    ``count`` samples are one Bernoulli process over ``count * n`` virtual rows, cut into
    ``count`` blocks, so they are independent.  Batch sizes are Binomial(n, q) and may be 0
    (an empty batch is a normal outcome).

    Returns:
        ``count`` sorted int64 index tensors on ``device``.
    """
    total = count * n
    if sample_rate >= 1.0:
        idx = np.arange(total, dtype=np.int64)
    else:
        expected = total * sample_rate
        chunk = int(expected + 6.0 * expected**0.5 + 16)
        log_keep = math.log1p(-sample_rate)
        parts, last = [], -1.0
        while last < total:
            pos = _cumulative_gaps(generator.random(chunk), log_keep)
            pos += last
            parts.append(pos)
            last = float(pos[-1])
        positions = parts[0] if len(parts) == 1 else np.concatenate(parts)
        idx = positions[positions < total].astype(np.int64)
    if count == 1:
        return [torch.from_numpy(idx).to(device)]
    bounds = [0, *np.searchsorted(idx, np.arange(1, count) * n).tolist(), len(idx)]
    return [torch.from_numpy(idx[bounds[i] : bounds[i + 1]] - i * n).to(device) for i in range(count)]


def laplace_noise(shape: tuple[int, ...], scale: float, generator: NoiseSource, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """i.i.d. Laplace(0, scale) noise, one independent draw per entry.

    Drawn as the difference of two Exp(1) variables times the scale (no log of 0 at the
    edge of the uniform's support, unlike the inverse-CDF method).  With a
    :class:`SecureNoise` source, ``Exp(1) = -log(U)`` of CSPRNG uniforms.
    """
    if isinstance(generator, SecureNoise):
        e = secure_exponentials(generator, (2, *shape))
        return (scale * (e[0] - e[1])).to(dtype)
    e = torch.empty((2, *shape), dtype=dtype, device=generator.device).exponential_(generator=generator)
    if e.device.type == "cpu":  # the same IEEE arithmetic in numpy: ~5 us against torch's ~17 on a (Q, K) histogram
        en = e.numpy()
        return torch.from_numpy(scale * (en[0] - en[1]))
    return scale * (e[0] - e[1])


def gaussian_noise(shape: tuple[int, ...], std: float, generator: NoiseSource, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """i.i.d. N(0, std^2) noise.

    With a :class:`SecureNoise` source: Box-Muller on its secure uniforms, in float64, both of
    its outputs used (r cos and r sin of one pair of uniforms are independent N(0, 1)), so a
    normal costs one 53-bit uniform.
    """
    if isinstance(generator, SecureNoise):
        z = secure_normals(generator, (), math.prod(shape)).reshape(shape)
        # std * z computed in float64 and rounded once to dtype on the way out: one pass
        out = z if dtype == torch.float64 else torch.empty(shape, dtype=dtype, device=z.device)
        if z.device.type == "cpu":  # numpy: one thread (secure_normals)
            np.multiply(z.numpy(), std, out=out.numpy(), casting="same_kind")
            return out
        return torch.mul(z, std, out=out)
    return std * torch.randn(shape, generator=generator, dtype=dtype, device=generator.device)


def secure_normals(source: SecureNoise, lead: tuple[int, ...], n: int) -> torch.Tensor:
    """float64 standard normals (*lead, n) on the source's device: Box-Muller on its secure
    uniforms, both outputs of a pair used.  Each leading index reads its own consecutive block
    of the uniforms, laid out as one call per index would read them, so R runs' noise
    (``lead=(R,)``) is one read of the source instead of R (each run's normals are still
    independent of every other's).

    Computed in place on the uniforms and into one output array (each fresh array of millions
    of doubles costs its page faults).  On an accelerator in torch: the uniforms never leave
    the device.  On the CPU log, cos and sin in torch (vectorised: 3-10 times numpy's on
    millions of entries, one thread) and the products, scalings and the square root in numpy
    on the same memory (one thread, so they never wait for a busy core in a threaded region):
    ResNet16's 6.5 M normals 0.41 -> 0.22 s on one thread, ``python -m raco_cli.bench_noise``."""
    h = (n + 1) // 2
    u = source.uniform((*lead, 2, h))
    z = torch.empty((*lead, 2 * h), dtype=torch.float64, device=u.device)
    _box_muller_(u, z, numpy_arithmetic=u.device.type == "cpu")
    return z if n == 2 * h else z[..., :n]


def _box_muller_(u: torch.Tensor, z: torch.Tensor, *, numpy_arithmetic: bool) -> None:
    """Box-Muller from uniforms ``u`` (*lead, 2, h) (overwritten) into ``z`` (*lead, 2h):
    ``z[..., :h] = r cos(2 pi U2)``, ``z[..., h:] = r sin(2 pi U2)``, ``r = sqrt(-2 log U1)``.
    log, cos and sin in torch; the rest in numpy on the same memory (``numpy_arithmetic``, CPU
    tensors only) or in torch: the same operations, equal up to the last bit of torch's
    vectorised CPU sqrt (not correctly rounded: ~1 % of doubles one ulp off numpy's)."""
    h = u.shape[-1]
    r, angle = u[..., 0, :].log_(), u[..., 1, :]
    if numpy_arithmetic:
        rn, an, zn = r.numpy(), angle.numpy(), z.numpy()
        np.multiply(rn, -2.0, out=rn)
        np.sqrt(rn, out=rn)
        np.multiply(an, 2.0 * math.pi, out=an)
        torch.cos(angle, out=z[..., :h])
        torch.sin(angle, out=z[..., h:])
        np.multiply(zn[..., :h], rn, out=zn[..., :h])
        np.multiply(zn[..., h:], rn, out=zn[..., h:])
    else:
        r.mul_(-2.0).sqrt_()
        angle.mul_(2.0 * math.pi)
        torch.cos(angle, out=z[..., :h]).mul_(r)
        torch.sin(angle, out=z[..., h:]).mul_(r)


def secure_exponentials(source: SecureNoise, shape: tuple[int, ...]) -> torch.Tensor:
    """float64 Exp(1) variables of shape ``shape`` on the source's device, ``-log(U)`` of its
    secure uniforms (the pairs whose difference is a Laplace draw); one read for any shape,
    e.g. R runs' pairs at once."""
    return source.uniform(shape).log_().neg_()


def poisson_sample_many(
    n: int, sample_rate: float | np.ndarray, generators: list[np.random.Generator | SecureUniforms], *, count: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`poisson_sample` of R runs at once, each from its own generator (batched training).

    Run r's samples are exactly ``poisson_sample(n, q_r, generators[r], count=count)``: the
    same uniforms are drawn from its generator in the same order (one chunk, more only in the
    rare case one chunk does not reach the end), and the gap arithmetic is elementwise.
    ``sample_rate``: one q for every run, or one per run (runs whose released training sizes
    differ, privacy/size.py).

    Returns:
        ``(idx, lengths)``: ``idx`` (R, count, B) int64, row ``idx[r, k, :lengths[r, k]]``
        the k-th sample of run r (sorted), padded with ``n`` (an index past the rows, for a
        zero pad row); ``lengths`` (R, count) int64.  B is the longest sample of the call.
    """
    return _blocks(poisson_positions_many(n, sample_rate, generators, count=count), n, count)


def poisson_positions_many(
    n: int, sample_rate: float | np.ndarray, generators: list[np.random.Generator | SecureUniforms], *, count: int = 1,
    gap_sums: GapSums | None = None,
) -> np.ndarray:
    """The samples of :func:`poisson_sample_many` before they are cut into blocks: (R, W) float64,
    row r run r's sampled positions over ``count * n`` virtual rows (``k * n + i``: row i in
    its k-th sample), increasing, then values ``>= count * n`` (past the end: ignored).  The
    compiled data pass reads them as they are (:meth:`raco_cli.methods.batched_scan.Scan.sample`).
    ``gap_sums``: the runs' first chunks summed by it (:func:`_cumulative_gaps`)."""
    R, total = len(generators), count * n
    rates = np.broadcast_to(np.asarray(sample_rate, dtype=np.float64), (R,))
    if R and (rates >= 1.0).any():  # (a rate of 1: every row; rare) each run as poisson_sample draws it
        rows = [np.concatenate([s.numpy() + k * n for k, s in enumerate(poisson_sample(n, float(q), g, count=count))])
                for q, g in zip(rates, generators)]
    elif R == 0:
        rows = []
    else:
        # each run's first chunk of uniforms, as long as poisson_sample's at its own rate (the
        # same float expression), in one (R, longest) array: the runs of a scope=model sweep
        # each sample at their own q = B / n~
        expected = [total * float(q) for q in rates]
        chunks = [int(e + 6.0 * e**0.5 + 16) for e in expected]
        log_keep = np.array([[math.log1p(-float(q))] for q in rates])  # (R, 1): the same division as by each run's scalar
        width = max(chunks)
        positions = _cumulative_gaps(_first_chunks(generators, chunks, width), log_keep, gap_sums=gap_sums)
        positions -= 1.0
        ends = np.array(chunks) - 1  # each run's last drawn position
        for r in np.flatnonzero(ends < width - 1).tolist():
            positions[r, chunks[r]:] = float(total)  # past the end: ignored
        short = np.flatnonzero(positions[np.arange(R), ends] < total)
        if len(short) == 0:  # the usual case: one chunk per run, vectorised
            return positions
        rows = []
        for r in range(R):  # as poisson_sample: more chunks until the end is passed
            parts, last = [positions[r, : chunks[r]]], float(positions[r, ends[r]])
            while last < total:
                pos = _cumulative_gaps(generators[r].random(chunks[r]), float(log_keep[r, 0]))
                pos += last
                parts.append(pos)
                last = float(pos[-1])
            p = np.concatenate(parts)
            rows.append(p[p < total])
    width = max(len(r) for r in rows) if rows else 0
    positions = np.full((R, width + 1), float(total))
    for r, p in enumerate(rows):
        positions[r, : len(p)] = p
    return positions


def _first_chunks(generators: list[np.random.Generator | SecureUniforms], chunks: list[int], width: int) -> np.ndarray:
    """Run r's first ``chunks[r]`` uniforms from its own generator in row r of one (R, width)
    array, zeros after them (a zero's gap is 1: its positions follow the row's, and are
    overwritten).  numpy's ``Generator.random(out=)`` writes into the row, so no array per run
    is made and copied (Adult, R = 160 runs x 1 232 uniforms: the step's sampling 2.5 -> 2.2 ms,
    cProfile).  When every run is secure the runs' uniforms are one CSPRNG read, run r's the
    r-th block, as its own call would have read them."""
    U = np.empty((len(generators), width))
    secure = SecureUniforms().random(sum(chunks)) if all(isinstance(g, SecureUniforms) for g in generators) else None
    start = 0
    for r, (g, c) in enumerate(zip(generators, chunks)):
        if secure is not None:
            U[r, :c] = secure[start : start + c]
        elif isinstance(g, np.random.Generator):
            g.random(out=U[r, :c])
        else:  # any other source with a random(size) face (a CSPRNG one among seeded runs)
            U[r, :c] = g.random(c)
        U[r, c:] = 0.0
        start += c
    return U


def _cumulative_gaps(U: np.ndarray, log_keep: float | np.ndarray, *, gap_sums: GapSums | None = None) -> np.ndarray:
    """``cumsum(floor(log1p(-U) / log_keep) + 1)`` along the last axis, computed in ``U``'s own
    memory (a fresh array of uniforms, overwritten): the geometric gaps of
    :func:`poisson_sample` summed into positions.  The same float operations in the same order
    as the expression, so the same bits; without an array per operation it is half the time
    (100 runs x 8 750 uniforms: 10.9 -> 5.6 ms).

    ``gap_sums``: a function doing the last three operations in place (``floor``, ``+ 1``, the
    running sum along each row, in that order), e.g. the batched engine's compiled
    :func:`raco_cli.methods.batched_scan.gap_sums`; numpy's cumsum is one dependent add after
    another (~3.3 ns an entry)."""
    np.negative(U, out=U)
    np.log1p(U, out=U)
    np.divide(U, log_keep, out=U)
    if gap_sums is not None:
        return gap_sums(U)
    np.floor(U, out=U)
    U += 1.0
    return np.cumsum(U, axis=-1, out=U)


def _blocks(positions: np.ndarray, n: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut sorted virtual positions (R, L) over ``count * n`` rows into ``count`` padded samples."""
    R = positions.shape[0]
    ends = np.stack([(positions < (k + 1) * n).sum(axis=1) for k in range(count)], axis=1)  # (R, count)
    starts = np.concatenate([np.zeros((R, 1), dtype=ends.dtype), ends[:, :-1]], axis=1)
    lengths = (ends - starts).astype(np.int64)
    width = int(lengths.max()) if lengths.size else 0
    offs = np.arange(width)
    idx = np.full((R, count, width), n, dtype=np.int64)
    for k in range(count):
        take = np.minimum(starts[:, k : k + 1] + offs, positions.shape[1] - 1)
        vals = np.take_along_axis(positions, take, axis=1).astype(np.int64) - k * n
        idx[:, k] = np.where(offs < lengths[:, k : k + 1], vals, n)
    return idx, lengths
