"""ChaCha20 (RFC 8439) as a keyed CSPRNG on any torch device: the secure uniforms of
:class:`raco_cli.privacy.mechanisms.SecureNoise` drawn where the noise is added.

The block function (RFC 8439 section 2.3) is vectorised over many block counters at once: the
state is four (4, N) tensors, the rows a, b, c, d of N blocks' 4 x 4 matrices, so one torch op
does one step of the four column quarter-rounds (section 2.1) of N blocks; the diagonal rounds
are column rounds after rotating the rows of b, c and d by 1, 2 and 3 places (the usual SIMD
layout).  torch 2.13 has no ``+`` or shifts for ``torch.uint32`` (only xor/or), so the words are
int64 tensors holding uint32 values, masked with ``0xFFFFFFFF`` after every addition and left
shift; the blocks are computed in chunks of :data:`CHUNK_BLOCKS` so the working set stays in
cache on a CPU.

:class:`ChaChaStream` is the generator: its key is 32 fresh bytes of ``os.urandom`` and its nonce
12 more, held only in memory (never logged or written); every draw takes the next unused block
counters, so no (key, nonce, counter) is ever used twice: when the 32-bit counter would wrap the
stream rekeys (new key and nonce from ``os.urandom``), and a process forked from the one that
keyed it rekeys before its first draw (``os.getpid`` differs), so a child never replays its
parent's stream.  The uniforms are the keystream read as little-endian 64-bit integers (as the
host path reads ``os.urandom``'s bytes), their top 53 bits.
"""

from __future__ import annotations

import os
import struct

import torch

MASK = 0xFFFFFFFF
#: "expand 32-byte k" as four little-endian words (RFC 8439 section 2.3).
CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)
ROUNDS = 20  # ten double rounds (column + diagonal)
#: blocks per chunk of the vectorised block function: (4, CHUNK_BLOCKS) int64 rows (512 KiB
#: each) stay in a CPU's cache; on CUDA the chunk only bounds the temporary memory.
CHUNK_BLOCKS = 1 << 14
COUNTER_LIMIT = 1 << 32  # the 32-bit block counter's range


def _words(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def _add(x: torch.Tensor, y: torch.Tensor) -> None:
    x.add_(y).bitwise_and_(MASK)


def _rotl(x: torch.Tensor, n: int, tmp: torch.Tensor) -> None:
    """In place: rotate each 32-bit word of ``x`` left by ``n`` bits."""
    torch.bitwise_right_shift(x, 32 - n, out=tmp)
    x.bitwise_left_shift_(n).bitwise_and_(MASK).bitwise_or_(tmp)


def _quarter_rounds(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, tmp: torch.Tensor) -> None:
    """RFC 8439 section 2.1's quarter round on each column (a[i], b[i], c[i], d[i]), in place:
    four steps ``x += y; z ^= x; z <<<= n``."""
    for x, y, z, n in ((a, b, d, 16), (c, d, b, 12), (a, b, d, 8), (c, d, b, 7)):
        _add(x, y)
        z.bitwise_xor_(x)
        _rotl(z, n, tmp)


def chacha20_blocks(key: torch.Tensor, nonce: torch.Tensor, counters: torch.Tensor, *, rounds: int = ROUNDS) -> torch.Tensor:
    """The ChaCha20 blocks of ``counters`` (RFC 8439 section 2.3), as words.

    Args:
        key: (8,) int64, the key's eight little-endian words.
        nonce: (3,) int64, the nonce's three little-endian words.
        counters: (N,) int64 block counters in [0, 2**32), on the device to compute on.

    Returns:
        (N, 16) int64 holding uint32 words: row i is block ``counters[i]``'s 16 output words,
        serialised little-endian in order (section 2.3's "serialized block").
    """
    dev, n = counters.device, counters.shape[0]
    init = torch.empty((16, n), dtype=torch.int64, device=dev)
    init[0:4] = torch.tensor(CONSTANTS, dtype=torch.int64, device=dev)[:, None]
    init[4:12] = key.to(dev)[:, None]
    init[12] = counters
    init[13:16] = nonce.to(dev)[:, None]
    a, b, c, d = (init[i : i + 4].clone() for i in range(0, 16, 4))
    tmp = torch.empty_like(a)
    for _ in range(rounds // 2):
        _quarter_rounds(a, b, c, d, tmp)  # column round
        b, c, d = b.roll(-1, 0), c.roll(-2, 0), d.roll(-3, 0)  # diagonals as columns
        _quarter_rounds(a, b, c, d, tmp)  # diagonal round
        b, c, d = b.roll(1, 0), c.roll(2, 0), d.roll(3, 0)
    out = torch.cat([a, b, c, d])
    out.add_(init).bitwise_and_(MASK)
    return out.T


def block(key: bytes, counter: int, nonce: bytes) -> bytes:
    """One serialised 64-byte block (RFC 8439 section 2.3): ``key`` 32 bytes, ``nonce`` 12."""
    words = chacha20_blocks(torch.tensor(_words(key)), torch.tensor(_words(nonce)), torch.tensor([counter]))[0]
    return struct.pack("<16I", *words.tolist())


def encrypt(key: bytes, counter: int, nonce: bytes, plaintext: bytes) -> bytes:
    """RFC 8439 section 2.4's encryption: ``plaintext`` xor the keystream from block ``counter``."""
    n = -(-len(plaintext) // 64)
    words = chacha20_blocks(torch.tensor(_words(key)), torch.tensor(_words(nonce)), torch.arange(counter, counter + n))
    stream = struct.pack(f"<{16 * n}I", *words.flatten().tolist())
    return bytes(p ^ s for p, s in zip(plaintext, stream))


class ChaChaStream:
    """A ChaCha20 keystream on ``device``, keyed from ``os.urandom``: a CSPRNG whose draws are
    computed where they are used.

    Every call reads fresh blocks (whole blocks; the unused words of the last one are
    discarded), from block counter 0 of a fresh key and nonce; before the 32-bit counter would
    wrap, and in a process other than the one that keyed it (a fork), it rekeys.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._rekey()

    def _rekey(self) -> None:
        self._key = torch.tensor(_words(os.urandom(32)), dtype=torch.int64, device=self.device)
        self._nonce = torch.tensor(_words(os.urandom(12)), dtype=torch.int64, device=self.device)
        self._counter = 0
        self._pid = os.getpid()

    def __repr__(self) -> str:  # never the key
        return f"ChaChaStream(device={self.device})"

    def __getstate__(self) -> dict:
        """No copies and no pickles: a copy would replay the keystream, and a pickle would
        write the key."""
        raise TypeError("a ChaChaStream is not copied or pickled: the copy would replay its keystream (make a new one)")

    def words(self, n: int) -> torch.Tensor:
        """The next ``n`` keystream words, (n,) int64 holding uint32 values, on the device."""
        if self._pid != os.getpid():  # a forked child: never the parent's blocks
            self._rekey()
        blocks = -(-int(n) // 16)
        parts = []
        while blocks > 0:
            if self._counter >= COUNTER_LIMIT:
                self._rekey()
            take = min(blocks, COUNTER_LIMIT - self._counter, CHUNK_BLOCKS)
            counters = torch.arange(self._counter, self._counter + take, dtype=torch.int64, device=self.device)
            self._counter += take
            parts.append(chacha20_blocks(self._key, self._nonce, counters).reshape(-1))
            blocks -= take
        out = parts[0] if len(parts) == 1 else torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=self.device)
        return out[:n]

    def bits53(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Uniform 53-bit integers as float64 of ``shape`` on the device: each the top 53 bits of
        two consecutive words read as one little-endian 64-bit integer (``(w1 << 21) | (w0 >> 11)``)."""
        count = 1
        for s in shape:
            count *= int(s)
        w = self.words(2 * count).view(count, 2)
        k = (w[:, 1] << 21).bitwise_or_(w[:, 0] >> 11)
        return k.to(torch.float64).reshape(shape)
