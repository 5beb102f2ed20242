"""Batched training: a run trained inside a group equals the same run trained alone.

Selected step, every evaluation's metrics, the multipliers and the model agree to 1e-6
(relative to the parameters' scale: float summation order differs between one run's matrix
products and a group's batched ones), and so do the release counts.  One case per method and
mode; the group always mixes seeds, gammas, noise multipliers, learning rates and tau.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from raco_cli import constraints, methods, models
from raco_cli.methods import batched
from raco_cli.methods.base import MethodSpec, NullReporter, Seeds
from raco_cli.privacy.mechanisms import noise_source, poisson_sample, poisson_sample_many
from raco_cli.privacy.preprocessing import apply_scaling, dp_scaling

TOL = 1e-6
STEPS = 30
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def small():
    from raco_cli.data import synthetic

    return synthetic.load(n=1200, n_features=6, seed=0)


def _model(data):
    return models.build("logreg", input_shape=data.input_shape, n_classes=data.n_classes)


def _specs(name: str, **kw) -> list[MethodSpec]:
    private = methods.get(name).PRIVATE
    base = MethodSpec(
        name=name, batch_size=100, eval_every=10, lr=1.0, temperature=2.0, clip_norm=1.0 if private else None,
        noise_multiplier=1.0 if private else None, hist_noise_multiplier=2.0 if private else None,
        selection_eps=0.5 if kw.get("scope") == "model" else 0.0,
    )
    base = replace(base, **kw)
    out = []
    for i in range(3):
        s = replace(base, lr=base.lr * (0.5 + 0.5 * i), temperature=1.0 + (i % 2), lr_dual=0.1 * (1 + i))
        if private:
            s = replace(s, noise_multiplier=1.0 + 0.3 * i, hist_noise_multiplier=2.0 + i)
        out.append(s)
    return out


def _compare(alone, group):
    scale = max(1.0, max(float(v.abs().max()) for a in alone for v in a.state_dict.values()))
    for a, g in zip(alone, group):
        assert a.selected == g.selected and a.steps == g.steps
        assert a.releases == g.releases
        assert [r.step for r in a.history] == [r.step for r in g.history]
        for k, v in a.state_dict.items():
            assert float((v - g.state_dict[k]).abs().max()) <= TOL * scale, k
        for ra, rg in zip(a.history, g.history):
            assert ra.metrics.keys() == rg.metrics.keys()
            np.testing.assert_allclose(ra.lam, rg.lam, atol=TOL * scale)
            for split, m in ra.metrics.items():
                for key, value in m.items():
                    other = rg.metrics[split][key]
                    if isinstance(value, float):
                        assert other == pytest.approx(value, abs=TOL, nan_ok=True), (split, key)
                    elif not isinstance(value, (dict, list)):
                        assert value == other, (split, key)
        for key in ("mean_batch_size", "clip_fraction", "mean_grad_norm", "nonfinite_rows"):
            assert g.stats[key] == pytest.approx(a.stats[key], abs=TOL)


def _run_both(data, name, specs, *, scalings=None, constraint="dp", steps=None):
    """``steps``: one T per run (default STEPS for all)."""
    module = methods.get(name)
    seeds = [Seeds.from_seed(i) for i in range(len(specs))]
    cons = [constraints.build(constraint, n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.02 + 0.03 * i) for i in range(len(specs))]
    T = steps or [STEPS] * len(specs)
    alone = []
    for i, spec in enumerate(specs):
        d = data if scalings is None else apply_scaling(data, *scalings[i])
        alone.append(module.fit(d, _model(data), cons[i], spec, steps=T[i], seeds=seeds[i], device=CPU, reporter=NullReporter()))
    members = [batched.Member(model=_model(data), constraints=c, spec=s, seeds=sd, scaling=None if scalings is None else scalings[i])
               for i, (c, s, sd) in enumerate(zip(cons, specs, seeds))]
    group = module.fit_many(data, members, steps=STEPS if steps is None else steps, device=CPU)
    _compare(alone, group)
    for m, g in zip(members, group):  # the member's model holds its selected checkpoint, as after fit
        for k, v in m.model.state_dict().items():
            assert torch.equal(v, g.state_dict[k])
    return alone, group


@pytest.mark.parametrize(
    "name, kw",
    [
        ("raco_dp", {}),
        ("raco_dp", {"sampling": "shared"}),
        ("raco_dp", {"dual": "hard"}),
        ("raco_dp", {"scope": "model"}),
        ("raco_dp", {"optimizer": "momentum"}),
        ("raco_dp", {"optimizer": "adam", "lr": 0.05}),
        ("dp_sgd", {}),
        ("sgda", {}),
        ("sgd", {}),
        ("sgd", {"clip_norm": 0.5}),
    ],
)
def test_a_run_in_a_group_equals_the_run_alone(small, name, kw):
    _run_both(small, name, _specs(name, **kw))


@pytest.mark.parametrize(
    "name, kw",
    [("raco_dp", {"scope": "model"}), ("raco_dp", {"selection": "average"}), ("raco_dp", {"optimizer": "adam", "lr": 0.05}),
     ("dp_sgd", {}), ("sgda", {}), ("dp_fermi", {}), ("dp_fermi", {"scope": "model"})],
)
def test_runs_of_different_T_in_one_group_equal_each_run_alone(small, name, kw):
    """A group whose runs planned different T (a scope=model sweep's seeds: each its own n~)
    steps to the largest; each run stops at its own T as alone: the same evaluations (its last
    step's included, off the eval_every grid), selection, multipliers, parameters, statistics
    and release counts, nothing recorded after its T."""
    steps = [STEPS - 7, STEPS + 4, STEPS]  # 23 and 34: off the eval grid of 10
    alone, group = _run_both(small, name, _fermi_specs(**kw) if name == "dp_fermi" else _specs(name, **kw), steps=steps)
    for T, a, g in zip(steps, alone, group):
        assert g.steps == T and g.history[-1].step == a.history[-1].step <= T
        np.testing.assert_allclose(g.lam, a.lam, atol=TOL)  # (DP-FERMI: its W player)
        assert g.releases == a.releases and all(v in (0, 1, T) for v in g.releases.values())  # (1: DP-FERMI's group counts)


@pytest.mark.parametrize("scope", ["paper", "model"])
def test_dp_fermi_in_a_group_equals_alone(small, scope):
    specs = [replace(s, options={"lam": lam, "noise_multiplier_w": 2.0 + i, **({"group_proportions": [0.4, 0.6]} if i == 2 else {})},
                     hist_noise_multiplier=None, temperature=1.0)
             for i, (s, lam) in enumerate(zip(_specs("dp_fermi", scope=scope), (0.0, 1.0, 4.0)))]
    alone, group = _run_both(small, "dp_fermi", specs)
    assert [g.stats["group_proportions"] for g in group] == [a.stats["group_proportions"] for a in alone]
    assert group[0].releases["gaussian_gradient_w"] == 0 and group[1].releases["gaussian_gradient_w"] == STEPS


@pytest.mark.parametrize("name", ["raco_dp", "dp_sgd", "dp_fermi"])
def test_runs_with_their_own_released_training_sizes_group(small, name):
    """scope=model: each seed releases its own n~ (privacy/size.py), so each run samples at its
    own q = B / n~; a group of such runs equals each run alone (a sweep's seeds group)."""
    specs = [replace(s, train_size=1200.0 + d) for s, d in zip(_specs(name, scope="model"), (-37.4, 0.0, 52.9))]
    if name == "dp_fermi":
        specs = [replace(s, options={"lam": 2.0}, hist_noise_multiplier=None, temperature=1.0) for s in specs]
    alone, group = _run_both(small, name, specs)
    assert len({g.stats["sample_rate"] for g in group}) == 3


def _public(data):
    """``data`` as a public-bounds encoding: the first 3 columns numeric in [-1, 1], one row with a NaN feature."""
    X = np.array(data.X, dtype=np.float32)
    X[:, :3] = np.tanh(X[:, :3])
    X[5, 4] = np.nan  # a non-finite non-numeric feature: the row is dropped in both paths
    return replace(data, X=X, meta={**data.meta, "preprocessing": "public", "numeric_features": 3})


@pytest.mark.parametrize("name", ["raco_dp", "dp_fermi"])
def test_per_run_dp_standardisation_is_applied_on_the_fly(small, name):
    """scope=model: each run's own DP (mean, std) on one shared public X equals the run on its
    own standardised copy of X (the one-run path)."""
    _standardised_group(small, name)


@pytest.mark.parametrize("name", ["raco_dp", "dp_fermi"])
def test_per_run_dp_standardisation_on_the_compiled_pass(small, name, compiled_pass):
    """The compiled pass standardises each sampled row's numeric columns for each run that took
    it, once a step (batched_scan._standardized_entries), the neutralised row (a NaN feature) included: each run
    equals the run alone on its own standardised copy of X (1e-6)."""
    _standardised_group(small, name)
    assert len(compiled_pass) == STEPS


def test_the_compiled_pass_standardises_bit_for_bit():
    """batched_scan._standardized_entries writes what standardize_columns does, bit for bit
    (the public map's edges and values rounded past them included), for every entry of every
    run, and the row norm of the gathered rows; zeros and an infinite norm for a neutralised
    row."""
    from raco_cli.methods.batched_scan import _standardized_entries
    from raco_cli.privacy.preprocessing import standardize_columns, unit_columns

    rng = np.random.default_rng(0)
    m, d, K, R, n = 5, 9, 2, 3, 50
    P = rng.uniform(-1.0, 1.0, size=(n, d + K + 1)).astype(np.float32)
    P[0, :m] = [-1.0, 1.0, np.nextafter(np.float32(1.0), np.float32(2.0)), 0.0, np.float32(-1.0000001)]
    P[:, d + K] = (P[:, m:d] ** 2).sum(axis=1)  # |rest|^2, as GroupRows packs it when m > 0
    P[7, d + K] = np.inf  # neutralised
    mean, std = rng.uniform(0.2, 0.8, size=(R, m)), rng.uniform(0.05, 0.5, size=(R, m))
    # every row sampled by every run (histogram entries of runs 0..R-1, slot bits width 1)
    order, starts = np.arange(n), np.arange(0, R * n + 1, R)
    entries, width = np.tile((2 * np.arange(R)) << 1, n), 1
    XS, norms = np.full((R * n, m), np.nan, dtype=np.float32), np.full(R * n, np.nan, dtype=np.float32)
    _standardized_entries(P, unit_columns(P[:, :m]), order, starts, entries, width, d, K, m, mean, std, XS, norms)
    for r in range(R):
        want = standardize_columns(P[:, :m], mean[r], std[r])
        for i in range(n):
            t = i * R + r
            if i == 7:
                assert (XS[t] == 0).all() and np.isinf(norms[t])
                continue
            assert np.array_equal(XS[t], want[i])
            assert norms[t] == pytest.approx(np.sqrt(P[i, d + K] + (want[i].astype(np.float64) ** 2).sum() + 1.0), rel=1e-6)


def test_the_binary_margins_give_the_logits_rates_and_arg_max():
    """_logits under batched_scan.margin_weights, into row 1 of zeroed logits as Scan.logits
    writes them, stores (0, z_1 - z_0): its softmax (tempered or not) equals
    torch's softmax of the two logits (1e-6) and its arg-max torch's, a run whose class-1
    logits are NaN included (NaN rates, arg-max class 1)."""
    from raco_cli.methods.batched_scan import _logits, margin_weights

    rng = np.random.default_rng(1)
    R, n, d, K = 3, 40, 7, 2
    P = rng.normal(size=(n, d + K + 1)).astype(np.float32)
    W, b = rng.normal(size=(R, K, d)).astype(np.float32), rng.normal(size=(R, K)).astype(np.float32)
    W[2, 1, 3] = np.nan  # run 2's class-1 logits are NaN
    order, starts = np.arange(n), np.arange(0, R * n + 1, R)
    entries, width = np.tile((2 * np.arange(R)) << 1, n), 1
    Z = np.zeros((K, R * n), dtype=np.float32)
    Wm, bm = margin_weights(W, b)
    _logits(P, order, starts, entries, width, Wm, bm, d, 1, 0, np.empty((R * n, 0), dtype=np.float32), Z[1:])
    logits = torch.from_numpy(np.einsum("rkd,nd->rnk", W, P[:, :d]) + b[:, None, :])  # (R, n, K)
    got = torch.from_numpy(Z).reshape(K, n, R).permute(2, 1, 0)  # entry i * R + r -> (r, i, k)
    for tau in (1.0, 2.0):
        torch.testing.assert_close(torch.softmax(tau * got, dim=2), torch.softmax(tau * logits, dim=2), rtol=0, atol=1e-6, equal_nan=True)
    assert torch.equal(got.argmax(dim=2), logits.argmax(dim=2))
    assert torch.isnan(got[2, :, 1]).all() and not torch.isnan(got[:2]).any()


def _standardised_group(small, name):
    data = _public(small)
    scalings = [dp_scaling(data, noise_multiplier=2.0, source=noise_source(Seeds.from_seed(i).preprocessing, "cpu", secure=False))
                for i in range(3)]
    assert not np.allclose(scalings[0][0], scalings[1][0])
    specs = _specs(name, scope="model")
    if name == "dp_fermi":
        specs = [replace(s, options={"lam": 2.0}, hist_noise_multiplier=None, temperature=1.0) for s in specs]
    _run_both(data, name, specs, scalings=scalings)


# one rate for every run, or each run its own (a scope=model sweep's seeds: q = B / n~ of each)
PER_RUN_RATES = np.array([0.05, 0.0498, 0.0503, 0.05, 0.0617, 0.0499, 0.05, 0.0362])


@pytest.mark.parametrize("per_run", [False, True])
def test_poisson_samples_of_many_runs_are_each_runs_own(per_run):
    for n, q, count in ((2000, 0.05, 2), (50, 0.9, 2), (10, 0.05, 1), (2000, 1.0, 1)):
        rates = np.minimum(q * PER_RUN_RATES / 0.05, 1.0) if per_run else q
        a = [np.random.default_rng(s) for s in range(8)]
        b = [np.random.default_rng(s) for s in range(8)]
        for _ in range(10):
            idx, lengths = poisson_sample_many(n, rates, a, count=count)
            for r in range(8):
                for k, ref in enumerate(poisson_sample(n, float(np.broadcast_to(rates, (8,))[r]), b[r], count=count)):
                    assert np.array_equal(idx[r, k, : lengths[r, k]], ref.numpy())
                    assert (idx[r, k, lengths[r, k] :] == n).all()


def test_the_compiled_gap_sums_are_numpys_bit_for_bit():
    """batched_scan.gap_sums (in place: floor, + 1, running sum along each row, rows side by
    side) equals numpy's floor, += 1 and cumsum, bit for bit: small gaps, gaps so large their
    sums round (the order of the additions shows), one column, no column."""
    from raco_cli.methods.batched_scan import gap_sums

    rng = np.random.default_rng(3)
    for shape, scale in (((160, 1232), 60.0), ((7, 3), 1e17), ((5, 1), 9.5), ((4, 0), 1.0), ((1, 50), 3e15)):
        U = rng.random(shape) * scale
        ref = np.floor(U)
        ref += 1.0
        np.cumsum(ref, axis=-1, out=ref)
        assert np.array_equal(gap_sums(U.copy()), ref)


@pytest.mark.parametrize("per_run", [False, True])
def test_the_compiled_pass_draws_the_positions_numpy_draws(per_run):
    """poisson_positions_many with the compiled gap_sums (what Scan.positions draws) gives the
    positions it gives with numpy's sums, bit for bit, step after step (each run's own sample,
    as the test above checks for numpy's)."""
    from raco_cli.methods.batched_scan import gap_sums
    from raco_cli.privacy.mechanisms import poisson_positions_many

    for n, q, count in ((2000, 0.05, 2), (50, 0.9, 2), (10, 0.05, 1), (2000, 1.0, 1)):
        rates = np.minimum(q * PER_RUN_RATES / 0.05, 1.0) if per_run else q
        a = [np.random.default_rng(s) for s in range(8)]
        b = [np.random.default_rng(s) for s in range(8)]
        for _ in range(5):
            compiled = poisson_positions_many(n, rates, a, count=count, gap_sums=gap_sums)
            assert np.array_equal(compiled, poisson_positions_many(n, rates, b, count=count))


class _SmallUniforms:
    """A sampler whose uniforms are below 0.01 for its first ``small`` draws (gaps of 1: the
    first chunk ends before the last row, the rare case where a run draws another chunk)."""

    def __init__(self, seed, small):
        self.rng, self.small = np.random.default_rng(seed), small

    def random(self, size):
        u = self.rng.random(size)
        if self.small > 0:
            u[: self.small] *= 0.01
            self.small -= size
        return u


@pytest.mark.parametrize("per_run", [False, True])
def test_a_run_whose_first_chunk_ends_early_draws_as_alone(per_run):
    n, rates = 500, PER_RUN_RATES if per_run else 0.05
    a = [_SmallUniforms(s, 100 if s % 3 == 0 else 0) for s in range(8)]
    b = [_SmallUniforms(s, 100 if s % 3 == 0 else 0) for s in range(8)]
    idx, lengths = poisson_sample_many(n, rates, a, count=2)
    for r in range(8):
        for k, ref in enumerate(poisson_sample(n, float(np.broadcast_to(rates, (8,))[r]), b[r], count=2)):
            assert np.array_equal(idx[r, k, : lengths[r, k]], ref.numpy())
    assert lengths[0, 0] > 90  # (its first rows all sampled)


@pytest.mark.parametrize("shape", [(2, 7), (2,), (3, 40), (4, 2)])
def test_group_noise_is_each_runs_own_draw_bit_for_bit(shape):
    """gaussian_many / laplace_many (one tensor filled run by run, scaled once) equal the
    stack of each run's own gaussian_noise / laplace_noise, bit for bit, draw after draw."""
    from raco_cli.privacy.mechanisms import gaussian_noise, laplace_noise

    stds = [0.3, 1.0, 2.7, 1e-3]
    a = [noise_source(s, CPU, secure=False) for s in range(4)]
    b = [noise_source(s, CPU, secure=False) for s in range(4)]
    for _ in range(3):
        for dtype in (torch.float32, torch.float64):
            ref = torch.stack([gaussian_noise(shape, s, g, dtype=dtype) for s, g in zip(stds, b)])
            assert torch.equal(batched.gaussian_many(shape, stds, a, dtype=dtype), ref)
        ref = torch.stack([laplace_noise(shape, s, g) for s, g in zip(stds, b)])
        assert torch.equal(batched.laplace_many(shape, stds, a), ref)


def _replayable_urandom(monkeypatch):
    """os.urandom replaced by a seeded byte stream, replayed from its start by the returned
    function: the same bytes reach a group's one read and the runs' own calls."""
    from raco_cli.privacy import mechanisms

    state = {}

    def restart():
        state["rng"] = np.random.default_rng(123)

    monkeypatch.setattr(mechanisms.os, "urandom", lambda k: state["rng"].bytes(k))
    restart()
    return restart


@pytest.mark.parametrize("shape", [(2, 7), (2,), (3, 40)])
def test_secure_group_noise_is_one_csprng_read_laid_out_as_each_runs_own(monkeypatch, shape):
    """Secure runs (privacy.secure_rng): a group's Gaussian and Laplace noise is one read of the
    OS CSPRNG whose block r is what run r's own call reads, transformed as gaussian_noise and
    laplace_noise do (equal up to the last bits of torch's vectorised log/cos/sin)."""
    from raco_cli.privacy.mechanisms import SecureNoise, gaussian_noise, laplace_noise

    restart = _replayable_urandom(monkeypatch)
    stds, R = [0.3, 1.0, 2.7, 1e-3], 4
    sources = [SecureNoise(CPU) for _ in range(R)]
    for dtype in (torch.float32, torch.float64):
        restart()
        got = batched.gaussian_many(shape, stds, sources, dtype=dtype)
        restart()
        ref = torch.stack([gaussian_noise(shape, s, g, dtype=dtype) for s, g in zip(stds, sources)])
        assert got.dtype == ref.dtype == dtype and got.shape == (R, *shape)
        torch.testing.assert_close(got, ref, rtol=1e-12 if dtype == torch.float64 else 1e-6, atol=0.0)
    restart()
    got = batched.laplace_many(shape, stds, sources)
    restart()
    ref = torch.stack([laplace_noise(shape, s, g) for s, g in zip(stds, sources)])
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=0.0)


def test_secure_group_noise_has_each_runs_distribution():
    """From the real CSPRNG: every run's block is N(0, std_r^2) / Laplace(0, b_r), and the runs'
    blocks differ (no run reads another's bytes)."""
    from scipy import stats

    from raco_cli.privacy.mechanisms import SecureNoise

    stds = [0.5, 3.0]
    sources = [SecureNoise(CPU), SecureNoise(CPU)]
    gau = batched.gaussian_many((40_000,), stds, sources, dtype=torch.float64).numpy()
    lap = batched.laplace_many((40_000,), stds, sources).numpy()
    for r, s in enumerate(stds):
        assert stats.kstest(gau[r], "norm", args=(0, s)).pvalue > 1e-4
        assert stats.kstest(lap[r], "laplace", args=(0, s)).pvalue > 1e-4
    for noise in (gau, lap):  # the same law scaled, and not the same draws
        a, b = noise[0] / stds[0], noise[1] / stds[1]
        assert stats.kstest(a, b).pvalue > 1e-4 and abs(np.corrcoef(a, b)[0, 1]) < 0.03


def test_secure_poisson_samples_of_many_runs_are_one_csprng_read(monkeypatch):
    """Secure samplers: a group's uniforms are one CSPRNG read, run r's block what its own
    poisson_sample would read (at one rate, or each run at its own): the same samples, bit
    for bit."""
    from raco_cli.privacy.mechanisms import SecureUniforms

    restart = _replayable_urandom(monkeypatch)
    for n, q, count in ((2000, 0.05, 2), (10, 0.05, 1), (2000, PER_RUN_RATES[:5], 2), (3000, PER_RUN_RATES[3:], 1)):
        rates = np.broadcast_to(q, (5,))
        restart()
        idx, lengths = poisson_sample_many(n, q, [SecureUniforms() for _ in range(5)], count=count)
        restart()
        for r in range(5):
            for k, ref in enumerate(poisson_sample(n, float(rates[r]), SecureUniforms(), count=count)):
                assert np.array_equal(idx[r, k, : lengths[r, k]], ref.numpy())


@pytest.mark.parametrize("K", [2, 3, 5])
def test_group_onehots_are_the_argmax_one_hots(K):
    """group_onehots (comparisons) equals one_hot(argmax over the class axis) of class-major
    logits bit for bit: ties keep the first class, a NaN counts as the maximum, +-inf."""
    z = torch.randn(4, K, 300)
    z[:, :, :40] = 0.5  # ties across every class
    flat = z.view(-1)
    flat[::7], flat[::11], flat[::13] = float("nan"), float("inf"), -float("inf")
    z[1, :, 50:60] = float("nan")  # every class NaN
    want = torch.nn.functional.one_hot(z.argmax(dim=1), K).to(z.dtype).transpose(1, 2)
    assert torch.equal(batched.group_onehots(z), want)
    assert torch.equal(batched.group_onehots(z.double()), want.double())


def test_a_gather_reuses_its_buffer_and_returns_the_rows_asked_for(small):
    """GroupRows.gather writes into one reused buffer (no fresh ~80 MB array a step): each
    call returns exactly the rows of its indices, whatever size the earlier calls had."""
    train = np.asarray(small.splits["train"])
    cons = constraints.build("dp", n_classes=2, n_groups=small.n_groups, gamma=0.05)
    rows = batched.GroupRows(small, train, cons.cells(small.y[train], small.group[train]), [None], CPU, n_cells=cons.Q)
    rng = np.random.default_rng(0)
    n = len(train)
    for L in (5, 40, 3, 41, 60):
        idx = rng.integers(0, n + 1, size=(3, L))  # n: the pad row
        got = rows.gather(idx)
        want = rows.packed[torch.as_tensor(idx)]
        assert torch.equal(got["X"], want[..., : rows.d])
        assert torch.equal(got["onehot"], want[..., rows.d : rows.d + 2])
        assert torch.equal(got["valid"], torch.as_tensor(idx < n))
        assert (got["X"][~got["valid"]] == 0).all()


def test_a_group_rejects_runs_that_differ_in_structure(small):
    specs = _specs("raco_dp")
    cons = constraints.build("dp", n_classes=2, n_groups=small.n_groups, gamma=0.05)
    members = [batched.Member(model=_model(small), constraints=cons, spec=s, seeds=Seeds.from_seed(0)) for s in specs]
    members[1] = replace(members[1], spec=replace(specs[1], sampling="shared"))
    with pytest.raises(ValueError, match="method.sampling"):
        batched.check_group(members)


def test_a_group_rejects_the_dro_objective(small):
    """sgda has fit_many, but the batched engine trains the mean loss: objective=dro never groups."""
    from raco_cli.objectives import ObjectiveSpec

    specs = [replace(s, objective=ObjectiveSpec("dro", divergence="kl")) for s in _specs("sgda")]
    cons = constraints.build("dp", n_classes=2, n_groups=small.n_groups, gamma=0.05)
    members = [batched.Member(model=_model(small), constraints=cons, spec=s, seeds=Seeds.from_seed(0)) for s in specs]
    with pytest.raises(ValueError, match="objective=erm only"):
        batched.check_group(members)


@pytest.fixture
def compiled_pass(monkeypatch):
    """The compiled data pass (methods/batched_scan.py) wherever it applies: these groups are
    small and narrow, where the default keeps torch's path.  Returns the list of steps it ran."""
    from raco_cli.methods import batched_scan

    monkeypatch.setattr(batched, "COMPILED_SCAN", True)
    steps: list[int] = []
    sample = batched_scan.Scan.sample

    def counted(self, *args, **kwargs):
        steps.append(1)
        return sample(self, *args, **kwargs)

    monkeypatch.setattr(batched_scan.Scan, "sample", counted)
    return steps


@pytest.mark.parametrize(
    "name, kw",
    [("raco_dp", {}), ("raco_dp", {"sampling": "shared"}), ("raco_dp", {"dual": "hard"}), ("raco_dp", {"scope": "model"}), ("dp_sgd", {}),
     ("sgda", {}), ("sgd", {}), ("sgd", {"clip_norm": 0.5})],
)
def test_a_run_in_a_group_on_the_compiled_pass_equals_the_run_alone(small, name, kw, compiled_pass):
    """The row-ordered compiled pass computes what torch's gather and products do: each run of
    the group equals the run alone (1e-6), per-run tau, gamma, clip and noise included."""
    _run_both(small, name, _specs(name, **kw))
    assert len(compiled_pass) == STEPS


@pytest.mark.parametrize("name, kw", [("raco_dp", {}), ("raco_dp", {"dual": "hard"}), ("dp_sgd", {})])
def test_three_classes_on_the_compiled_pass_equal_each_run_alone(name, kw, compiled_pass):
    """K = 3: the pass's general kernels (every class's logits, every class's sums; binary
    tasks take the margin and class 1's sums instead): each run equals the run alone (1e-6)."""
    from raco_cli.data import synthetic

    data = synthetic.load(n=1200, n_features=6, n_classes=3, seed=0)
    _run_both(data, name, _specs(name, **kw))
    assert len(compiled_pass) == STEPS


@pytest.mark.parametrize("name, kw", [("raco_dp", {"scope": "model"}), ("raco_dp", {"sampling": "shared"}), ("sgd", {}),
                                      ("dp_fermi", {"scope": "model"})])
def test_runs_of_different_T_on_the_compiled_pass_equal_each_run_alone(small, name, kw, compiled_pass):
    """Different T per run on the compiled pass: each run as alone (1e-6), stopped at its T."""
    steps = [STEPS + 4, STEPS - 7, STEPS]
    _, group = _run_both(small, name, _fermi_specs(**kw) if name == "dp_fermi" else _specs(name, **kw), steps=steps)
    assert len(compiled_pass) == max(steps) and [g.steps for g in group] == steps


def _fermi_specs(scope="paper"):
    """DP-FERMI runs: lam 0 (no W player), 1 (its W gradients clipped) and 4, their own W noise,
    one with public group proportions."""
    return [replace(s, options={"lam": lam, "noise_multiplier_w": 2.0 + i, **({"group_proportions": [0.4, 0.6]} if i == 2 else {}),
                                **({"clip_norm_w": 0.05} if i == 1 else {})},
                    hist_noise_multiplier=None, temperature=1.0)
            for i, (s, lam) in enumerate(zip(_specs("dp_fermi", scope=scope), (0.0, 1.0, 4.0)))]


@pytest.mark.parametrize("scope", ["paper", "model"])
def test_dp_fermi_in_a_group_on_the_compiled_pass_equals_alone(small, scope, compiled_pass):
    """DP-FERMI's theta step (its regularizer weights A[g_i] per row) and its W player's clipped
    sums on the compiled pass: each run equals the run alone (1e-6)."""
    alone, group = _run_both(small, "dp_fermi", _fermi_specs(scope))
    assert len(compiled_pass) == STEPS
    assert [g.stats["clip_fraction_w"] for g in group] == pytest.approx([a.stats["clip_fraction_w"] for a in alone], abs=TOL)
    assert group[1].stats["clip_fraction_w"] > 0  # the W player's clipping is exercised


def _group(data, name, specs):
    cons = [constraints.build("dp", n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.05) for _ in specs]
    members = [batched.Member(model=_model(data), constraints=c, spec=s, seeds=Seeds.from_seed(i)) for i, (c, s) in enumerate(zip(cons, specs))]
    return methods.get(name).fit_many(data, members, steps=STEPS, device=CPU)


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("name", ["raco_dp", "dp_sgd", "dp_fermi"])
def test_the_compiled_pass_drops_and_counts_nonfinite_rows_as_torch_does(small, name, classes, monkeypatch):
    """Rows with a non-finite feature (neutralised: no cell, infinite norm) and a run at an
    absurd learning rate: the same rows are dropped and counted, the same rows clipped, the
    same parameters; two classes (the binary kernels) and three (the general ones)."""
    from raco_cli.data import synthetic

    table = small if classes == 2 else synthetic.load(n=1200, n_features=6, n_classes=3, seed=0)
    X = np.array(table.X, dtype=np.float32)
    train = np.asarray(table.splits["train"])
    X[train[:10], 2], X[train[10:20], 0] = np.nan, np.inf
    data = replace(table, X=X)
    specs = [replace(s, lr=1e30) if i == 2 else s for i, s in enumerate(_fermi_specs() if name == "dp_fermi" else _specs(name))]
    out = {}
    for flag in (False, True):
        monkeypatch.setattr(batched, "COMPILED_SCAN", flag)
        out[flag] = _group(data, name, specs)
    for a, g in zip(out[False], out[True]):
        assert g.stats["nonfinite_rows"] == a.stats["nonfinite_rows"] and g.stats["clip_fraction"] == pytest.approx(a.stats["clip_fraction"])
        # (the run at lr 1e30 ends with parameters ~1e27: with three classes the reassociated
        # sums of the pass differ from torch's by up to ~2e-5 of them)
        for k, v in a.state_dict.items():
            torch.testing.assert_close(g.state_dict[k], v, rtol=1e-5 if classes == 2 else 1e-4, atol=1e-6, equal_nan=True)
    assert all(g.stats["nonfinite_rows"] > 0 for g in out[True])


def test_the_compiled_pass_is_the_default_for_wide_rows_read_by_several_runs(monkeypatch):
    """Default choice: the compiled pass where a step's samples hold >= n rows of >= 16 features
    (Adult, Credit, Heart, Parkinsons), torch's path for narrower rows (6 features) or sparse samples."""
    from raco_cli.data import synthetic
    from raco_cli.methods import batched_scan

    used: list[int] = []
    sample = batched_scan.Scan.sample
    monkeypatch.setattr(batched_scan.Scan, "sample", lambda self, *a, **k: (used.append(1), sample(self, *a, **k))[1])
    wide, narrow = synthetic.load(n=600, n_features=40, seed=0), synthetic.load(n=600, n_features=6, seed=0)
    _group(wide, "raco_dp", _specs("raco_dp", batch_size=150))  # 3 runs x 2 x 150 rows >= ~360 training rows
    assert len(used) == STEPS
    _group(narrow, "raco_dp", _specs("raco_dp", batch_size=150))
    _group(wide, "raco_dp", _specs("raco_dp", batch_size=20))  # 120 sampled rows a step: sparse
    assert len(used) == STEPS
