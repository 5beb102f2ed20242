"""ChaCha20 (raco_cli/privacy/chacha20.py) against RFC 8439's test vectors, and the keyed stream's
no-reuse rules: fresh keys, no counter wrap, a forked child rekeys."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from scipy import stats

from raco_cli.privacy import chacha20
from raco_cli.privacy.chacha20 import ChaChaStream

KEY = bytes(range(32))  # 00:01:02:...:1f, the key of RFC 8439 sections 2.3.2 and 2.4.2

# RFC 8439 section 2.3.2: nonce 00:00:00:09:00:00:00:4a:00:00:00:00, block count 1, serialized block
BLOCK_2_3_2 = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4"
    "c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2"
    "b5129cd1de164eb9cbd083e8a2503c4e"
)

# RFC 8439 section 2.4.2: nonce 00:00:00:00:00:00:00:4a:00:00:00:00, initial counter 1
PLAINTEXT_2_4_2 = (
    b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it."
)
CIPHERTEXT_2_4_2 = bytes.fromhex(
    "6e2e359a2568f98041ba0728dd0d6981"
    "e97e7aec1d4360c20a27afccfd9fae0b"
    "f91b65c5524733ab8f593dabcd62b357"
    "1639d624e65152ab8f530c359f0861d8"
    "07ca0dbf500d6a6156a38e088a22b65e"
    "52bc514d16ccf806818ce91ab7793736"
    "5af90bbf74a35be6b40b8eedf2785e42"
    "874d"
)


def test_block_function_rfc8439_2_3_2():
    assert chacha20.block(KEY, 1, bytes.fromhex("000000090000004a00000000")) == BLOCK_2_3_2


def test_encryption_rfc8439_2_4_2():
    nonce = bytes.fromhex("000000000000004a00000000")
    assert len(PLAINTEXT_2_4_2) == 114
    assert chacha20.encrypt(KEY, 1, nonce, PLAINTEXT_2_4_2) == CIPHERTEXT_2_4_2
    assert chacha20.encrypt(KEY, 1, nonce, CIPHERTEXT_2_4_2) == PLAINTEXT_2_4_2


def test_many_blocks_at_once_agree_with_cryptography():
    """Cross-check (not the test: the RFC vectors are): 3 chunks' worth of counters, against the
    ``cryptography`` package's ChaCha20 (16-byte nonce = 4-byte LE counter + 12-byte nonce)."""
    algorithms = pytest.importorskip("cryptography.hazmat.primitives.ciphers.algorithms")
    from cryptography.hazmat.primitives.ciphers import Cipher

    key, nonce, start = os.urandom(32), os.urandom(12), 2**32 - 5  # near the counter's top
    n = 5
    ours = chacha20.chacha20_blocks(torch.tensor(chacha20._words(key)), torch.tensor(chacha20._words(nonce)),
                                    torch.arange(start, start + n))
    enc = Cipher(algorithms.ChaCha20(key, start.to_bytes(4, "little") + nonce), mode=None).encryptor()
    ref = np.frombuffer(enc.update(bytes(64 * n)), dtype="<u4").astype(np.int64).reshape(n, 16)
    assert np.array_equal(ours.numpy(), ref)


def test_stream_reads_consecutive_blocks_of_its_own_key(monkeypatch):
    """The stream is the keystream of (its key, its nonce) from counter 0, each call the next
    whole blocks, chunked calls as one; two streams have different keys."""
    s = ChaChaStream()
    key, nonce = s._key.clone(), s._nonce.clone()
    monkeypatch.setattr(chacha20, "CHUNK_BLOCKS", 3)  # several chunks per call
    got = torch.cat([s.words(16 * 7), s.words(5), s.words(16)])
    ref = chacha20.chacha20_blocks(key, nonce, torch.arange(0, 9)).reshape(-1)
    assert torch.equal(got[: 16 * 7], ref[: 16 * 7])
    assert torch.equal(got[16 * 7 : 16 * 7 + 5], ref[16 * 7 : 16 * 7 + 5])  # block 7, its rest discarded
    assert torch.equal(got[16 * 7 + 5 :], ref[16 * 8 :])  # block 8
    assert s._counter == 9
    assert not torch.equal(ChaChaStream()._key, key)
    assert "key" not in repr(s) and str(key[0].item()) not in repr(s)


def test_stream_rekeys_instead_of_wrapping_the_counter():
    s = ChaChaStream()
    key = s._key.clone()
    s._counter = chacha20.COUNTER_LIMIT - 2
    last_two = chacha20.chacha20_blocks(key, s._nonce, torch.arange(chacha20.COUNTER_LIMIT - 2, chacha20.COUNTER_LIMIT))
    w = s.words(16 * 3)
    assert torch.equal(w[:32], last_two.reshape(-1))
    assert not torch.equal(s._key, key) and s._counter == 1  # the third block: counter 0 of a new key
    assert torch.equal(w[32:], chacha20.chacha20_blocks(s._key, s._nonce, torch.tensor([0])).reshape(-1))


def test_stream_cannot_be_copied_or_pickled():
    import copy
    import pickle

    s = ChaChaStream()
    for dup in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="replay its keystream"):
            dup(s)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_does_not_replay_the_parents_stream():
    """A child forked after the stream was keyed draws other words than the parent's next ones."""
    s = ChaChaStream()
    s.words(16)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next words, to the parent
        try:
            os.close(r)
            os.write(w, s.words(64).numpy().astype("<u4").tobytes())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    child = np.frombuffer(data, dtype="<u4")
    parent = s.words(64).numpy()
    assert len(child) == 64 and not np.array_equal(child, parent)


def test_bits53_are_uniform_53_bit_integers():
    k = ChaChaStream().bits53((4, 50_000)).flatten().numpy()
    assert k.min() >= 0 and k.max() < 2.0**53 and np.array_equal(k, np.floor(k))
    u = (k + 0.5) * 2.0**-53
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    assert (k % 2 == 1).mean() == pytest.approx(0.5, abs=0.01)  # the lowest of the 53 bits is random
    assert (k >= 2.0**52).mean() == pytest.approx(0.5, abs=0.01)  # and the highest


@pytest.mark.gpu
def test_stream_stays_on_the_cuda_device():
    s = ChaChaStream("cuda")
    w = s.words(1000)
    assert w.device.type == "cuda" and s._key.device.type == "cuda"
    assert s.bits53((10, 3)).device.type == "cuda"
    ref = chacha20.chacha20_blocks(s._key.cpu(), s._nonce.cpu(), torch.arange(0, 63))
    assert torch.equal(w.cpu(), ref.reshape(-1)[:1000])
