"""privacy.secure_rng: CSPRNG noise with the right distributions, not reproducible, wired
through the training loop, warned about once when off."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from scipy import stats
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.sgda import raco_dp
from raco_cli.privacy.mechanisms import SecureNoise, gaussian_noise, laplace_noise, noise_source


def test_secure_uniforms_are_in_the_open_unit_interval_and_not_reproducible():
    src = SecureNoise()
    u = src.uniform((200_000,))
    assert u.dtype == torch.float64 and float(u.min()) > 0 and float(u.max()) < 1
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-4
    assert not torch.equal(src.uniform((8,)), src.uniform((8,)))


def test_secure_laplace_and_gaussian_distributions():
    src = SecureNoise()
    lap = laplace_noise((100_000,), 3.0, src).numpy()
    assert stats.kstest(lap, "laplace", args=(0, 3.0)).pvalue > 1e-4
    gau = gaussian_noise((100_000,), 2.0, src).numpy()
    assert gau.dtype == np.float32
    assert stats.kstest(gau, "norm", args=(0, 2.0)).pvalue > 1e-4


def test_noise_source_choice():
    assert isinstance(noise_source(1, "cpu", secure=True), SecureNoise)
    g = noise_source(1, "cpu", secure=False)
    assert isinstance(g, torch.Generator) and g.initial_seed() == 1


def _fit(synthetic, secure):
    cons = constraints.build("dp", n_classes=2, n_groups=2, gamma=0.05)
    model = models.build("logreg", input_shape=synthetic.input_shape, n_classes=2)
    spec = paper_spec(name="raco_dp", batch_size=200, eval_every=10, secure_rng=secure, selection="last")
    res = raco_dp.fit(synthetic, model, cons, spec, steps=10, seeds=Seeds.from_seed(0), device=torch.device("cpu"), reporter=NullReporter())
    return torch.cat([v.flatten() for v in res.state_dict.values()])


def test_training_with_secure_rng_is_not_reproducible_from_the_seed(synthetic):
    a, b = _fit(synthetic, True), _fit(synthetic, True)
    assert torch.isfinite(a).all() and not torch.equal(a, b)
    assert torch.equal(_fit(synthetic, False), _fit(synthetic, False))


def test_secure_noise_is_not_reproducible_even_with_fixed_batches(synthetic, monkeypatch):
    """Fix the batches (a seeded sampler in place of the CSPRNG one): the released histograms and
    gradients of two secure runs still differ, so their noise does not come from the seed."""
    from raco_cli.methods.sgda import batched, core
    from raco_cli.privacy import releases

    # both paths' samplers: a linear run alone trains on the batched engine (issue 57)
    for module in (core, batched):
        monkeypatch.setattr(module, "sampling_generator", lambda seed, secure=False: np.random.default_rng(seed))
    tapes = []
    for _ in range(2):
        with releases.recording() as tape:
            _fit(synthetic, True)
        tapes.append(tape.entries)
    (kind0, H0), (kind1, H1) = tapes[0][0], tapes[1][0]
    assert kind0 == kind1 == "histogram" and not torch.equal(H0, H1)
    gradients = [[v for k, v in entries if k == "gradient"][0] for entries in tapes]
    assert not all(torch.equal(a, b) for a, b in zip(*gradients))


def test_secure_rng_off_warns_once(caplog, monkeypatch):
    from raco_cli.run import train

    monkeypatch.setattr(train, "_SECURE_RNG_WARNED", False)
    with caplog.at_level(logging.WARNING, logger="raco_cli.run.train"):
        train.warn_secure_rng(True, False)
        train.warn_secure_rng(True, False)
        train.warn_secure_rng(True, True)
        train.warn_secure_rng(False, False)
    msgs = [r.getMessage() for r in caplog.records if "privacy.secure_rng=false" in r.getMessage()]
    assert len(msgs) == 1 and "privacy.secure_rng=auto" in msgs[0]


def test_secure_rng_config_key_reaches_the_method_spec():
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.spec import build_run_spec

    spec = build_run_spec(compose_config(["dataset=synthetic", "privacy.secure_rng=true"]))
    assert spec.secure_rng and spec.method.secure_rng
    assert build_run_spec(compose_config(["dataset=synthetic"])).secure_rng  # auto: secret under scope=model
    assert not build_run_spec(compose_config(["dataset=synthetic", "privacy.scope=paper"])).secure_rng
    assert not build_run_spec(compose_config(["dataset=synthetic", "privacy.secure_rng=false"])).secure_rng
    with pytest.raises(Exception, match="privacy.secure_rng must be true, false or auto"):
        build_run_spec(compose_config(["dataset=synthetic", "privacy.secure_rng=maybe"]))


def test_secure_rng_draws_the_poisson_batches_from_the_csprng_too(synthetic):
    """Secret batches: with secure_rng the sampler ignores the seed (two runs see different
    batches); without it the recorded seed replays them."""
    from raco_cli.privacy.mechanisms import SecureUniforms, poisson_sample, sampling_generator

    assert isinstance(sampling_generator(7, secure=True), SecureUniforms)
    batches = [poisson_sample(5000, 0.05, sampling_generator(7, secure=True))[0] for _ in range(2)]
    assert not torch.equal(batches[0], batches[1])
    seeded = [poisson_sample(5000, 0.05, sampling_generator(7))[0] for _ in range(2)]
    assert torch.equal(seeded[0], seeded[1])
    u = SecureUniforms().random(100_000)
    assert u.min() >= 0 and u.max() < 1 and stats.kstest(u, "uniform").pvalue > 1e-4
    sizes = [len(poisson_sample(2000, 0.1, SecureUniforms())[0]) for _ in range(200)]
    assert abs(np.mean(sizes) - 200) < 5 * np.sqrt(2000 * 0.1 * 0.9 / 200)  # Binomial(n, q) sizes


def test_secure_rng_records_no_sampling_seed(tmp_path):
    from raco_cli.cli.validate import compose_config
    from raco_cli.run import train as train_mod

    # constraint.confidence=null: 10 steps on the synthetic table cannot support the default margin
    overrides = ["dataset=synthetic", "tracking=none", "method.batch_size=200", "method.max_steps=10", "constraint.confidence=null"]
    secure = train_mod.train(compose_config([*overrides, "privacy.secure_rng=true"]), run_dir=tmp_path / "s")
    assert secure["seeds"]["sampling"] is None and secure["seeds"]["noise"] is None and secure["seeds"]["selection"] is None
    plain = train_mod.train(compose_config([*overrides, "privacy.secure_rng=false"]), run_dir=tmp_path / "p")
    assert isinstance(plain["seeds"]["sampling"], int)


def _chacha_source(device="cpu"):
    """A SecureNoise drawing from a ChaCha20 stream on ``device`` (what it does on an
    accelerator), here also on the CPU."""
    return SecureNoise(device, chacha=True)


@pytest.mark.parametrize("kind", ["urandom", "chacha"])
def test_secure_uniforms_have_53_random_bits_and_normals_are_standard(kind):
    """Both sources of SecureNoise (os.urandom on the CPU, ChaCha20 on accelerators): uniforms
    (k + 0.5) / 2**53 of 53-bit integers k whose lowest and highest bits are fair, normals from
    both Box-Muller outputs N(0, 1), exponentials Exp(1)."""
    from raco_cli.privacy.mechanisms import secure_exponentials, secure_normals

    src = SecureNoise() if kind == "urandom" else _chacha_source()
    assert (src._stream is None) == (kind == "urandom")
    u = src.uniform((3, 40_000)).flatten()
    assert u.dtype == torch.float64 and float(u.min()) > 0 and float(u.max()) < 1
    # below 1/2, (k + 0.5) / 2**53 is exact: k's 53 bits, the lowest fair; above it a double has
    # 52 bits after the point, so k + 0.5 rounds to an even integer (the mapping as it always was)
    low, high = u[u < 0.5] * 2.0**53 - 0.5, u[u >= 0.5] * 2.0**53
    assert torch.equal(low, low.floor()) and torch.equal(high % 2, torch.zeros_like(high))
    assert abs(float((low % 2).mean()) - 0.5) < 0.01 and abs(len(low) / len(u) - 0.5) < 0.01
    assert abs(float((low >= 2.0**51).double().mean()) - 0.5) < 0.01  # the top bit below 1/2
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-4
    z = secure_normals(src, (), 100_001)
    assert z.shape == (100_001,) and z.dtype == torch.float64
    h = 50_001
    for half in (z[:h], z[h:]):  # the cos outputs and the sin outputs, each N(0, 1)
        assert stats.kstest(half.numpy(), "norm").pvalue > 1e-4
    assert abs(np.corrcoef(z[: h - 1].numpy(), z[h:].numpy())[0, 1]) < 0.02
    e = secure_exponentials(src, (2, 50_000))
    assert stats.kstest(e.flatten().numpy(), "expon").pvalue > 1e-4


@pytest.mark.parametrize("kind", ["urandom", "chacha"])
def test_two_secure_sources_are_independent(kind):
    make = SecureNoise if kind == "urandom" else _chacha_source
    a, b = gaussian_noise((50_000,), 1.0, make(), dtype=torch.float64), gaussian_noise((50_000,), 1.0, make(), dtype=torch.float64)
    assert not torch.equal(a, b)
    assert abs(np.corrcoef(a.numpy(), b.numpy())[0, 1]) < 0.025
    assert stats.kstest(a.numpy(), b.numpy()).pvalue > 1e-4


def test_cpu_secure_draws_transform_the_same_uniforms_as_numpy(monkeypatch):
    """On the CPU the bytes of os.urandom reach the same uniforms as the host path (bit for bit)
    and the torch Box-Muller / -log U give numpy's values up to the last bits of log/cos/sin."""
    from raco_cli.privacy import mechanisms
    from raco_cli.privacy.mechanisms import secure_exponentials, secure_normals

    def replay():
        rng = np.random.default_rng(5)
        monkeypatch.setattr(mechanisms.os, "urandom", lambda k: rng.bytes(k))

    src = SecureNoise()
    replay()
    u = src.uniform((2, 1001)).numpy()
    replay()
    assert np.array_equal(u, src.host_uniform((2, 1001)))
    for n in (1, 2001, 2002):
        replay()
        z = secure_normals(src, (), n).numpy()
        replay()
        v = src.host_uniform((2, (n + 1) // 2))
        r, angle = np.sqrt(-2.0 * np.log(v[0])), 2.0 * np.pi * v[1]
        np.testing.assert_allclose(z, np.concatenate([r * np.cos(angle), r * np.sin(angle)])[:n], rtol=1e-13, atol=1e-15)
    replay()
    g = gaussian_noise((3, 7), 2.5, src)
    replay()
    assert g.dtype == torch.float32 and torch.equal(g, (2.5 * secure_normals(src, (), 21)).reshape(3, 7).float())
    replay()
    e = secure_exponentials(src, (2, 500)).numpy()
    replay()
    np.testing.assert_allclose(e, -np.log(src.host_uniform((2, 500))), rtol=1e-14)


@pytest.mark.gpu
def test_secure_noise_on_cuda_draws_from_a_chacha_stream_on_the_device():
    src = noise_source(0, "cuda", secure=True)
    assert isinstance(src, SecureNoise) and src._stream is not None and src._stream.device.type == "cuda"
    g = gaussian_noise((10_000,), 1.0, src)
    lap = laplace_noise((10_000,), 1.0, src)
    assert g.device.type == "cuda" and lap.device.type == "cuda" and src._stream._key.device.type == "cuda"
    assert stats.kstest(g.cpu().numpy(), "norm").pvalue > 1e-4


@pytest.mark.parametrize("lead", [(), (3,)])
def test_box_muller_of_the_cpu_and_the_accelerator_path_agree(lead):
    """The accelerator's all-torch Box-Muller, run here on CPU tensors, equals the CPU's
    numpy/torch one on the same uniforms up to the last bit (torch's vectorised CPU sqrt is
    not correctly rounded); a scalar draw works."""
    from raco_cli.privacy.mechanisms import _box_muller_

    u = SecureNoise().uniform((*lead, 2, 5001))
    outs = []
    for numpy_arithmetic in (True, False):
        z = torch.empty((*lead, 10_002), dtype=torch.float64)
        _box_muller_(u.clone(), z, numpy_arithmetic=numpy_arithmetic)
        outs.append(z)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-15, atol=0.0)
    assert torch.isfinite(outs[0]).all()
    g = gaussian_noise((), 1.0, SecureNoise())
    assert g.shape == () and g.dtype == torch.float32 and torch.isfinite(g)
