"""Batched training: a run trained inside a group equals the same run trained alone, bit for bit.

A run alone on the CPU trains on the batched engine as a group of one (one path:
docs/batched.md), so the selected step, every evaluation's metrics, the multipliers, the model,
the statistics and the release counts of a run are the same numbers, to the last bit, whatever
group it trains in and wherever it sits in it.  One case per method and mode; the groups mix
seeds, gammas, noise multipliers, learning rates and tau.  Torch's path (the accelerators') is
checked against the compiled pass one step at a time, within the float32 error bound of a sum
(:func:`test_torch_path_and_compiled_pass_agree_within_float32_rounding_of_one_step`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, methods, models
from raco_cli.methods import batched
from raco_cli.methods.base import MethodSpec, NullReporter, Seeds
from raco_cli.methods.group_rows import GroupRows
from raco_cli.privacy.mechanisms import noise_source, poisson_sample, poisson_sample_many
from raco_cli.privacy.preprocessing import apply_scaling, dp_scaling

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
    base = paper_spec(
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


def same(a, b, path="") -> None:
    """``a`` and ``b`` equal to the last bit: tensors, arrays, floats (NaN equal to NaN),
    nested lists and dicts."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(torch.nan_to_num(a, nan=7.5), torch.nan_to_num(b, nan=7.5)) \
            and torch.equal(a.isnan(), b.isnan()), path
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b, equal_nan=True), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, (path, a, b)


TIMES = ("time_per_step_ms", "first_step_ms", "throughput_images_per_s", "batched")


def _compare(alone, group):
    """Each run of the group equals the run alone, bit for bit (step times aside)."""
    for a, g in zip(alone, group):
        assert a.selected == g.selected and a.steps == g.steps
        same(a.releases, g.releases, "releases")
        same(a.state_dict, g.state_dict, "state_dict")
        same(a.lam, g.lam, "lam")
        same([(r.step, r.lam, r.metrics) for r in a.history], [(r.step, r.lam, r.metrics) for r in g.history], "history")
        same({k: v for k, v in a.stats.items() if k not in TIMES}, {k: v for k, v in g.stats.items() if k not in TIMES}, "stats")


def _run_both(data, name, specs, *, scalings=None, constraint="dp", steps=None):
    """Each run alone (``fit``: a group of one on the CPU), then all as one group, then as one
    group in reverse order: every run equals itself alone, bit for bit.  ``steps``: one T per
    run (default STEPS for all)."""
    module = methods.get(name)
    seeds = [Seeds.from_seed(i) for i in range(len(specs))]
    cons = [constraints.build(constraint, n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.02 + 0.03 * i) for i in range(len(specs))]
    T = steps or [STEPS] * len(specs)
    alone = []
    for i, spec in enumerate(specs):
        d = data if scalings is None else apply_scaling(data, *scalings[i])
        alone.append(module.fit(d, _model(data), cons[i], spec, steps=T[i], seeds=seeds[i], device=CPU, reporter=NullReporter()))
    order = list(range(len(specs)))
    for positions in (order, order[::-1]):
        members = [batched.Member(model=_model(data), constraints=cons[i], spec=specs[i], seeds=seeds[i],
                                  scaling=None if scalings is None else scalings[i]) for i in positions]
        group = module.fit_many(data, members, steps=STEPS if steps is None else [T[i] for i in positions], device=CPU)
        _compare([alone[i] for i in positions], group)
        for m, g in zip(members, group):  # the member's model holds its selected checkpoint, as after fit
            same(m.model.state_dict(), g.state_dict)
    group = [group[positions.index(i)] for i in order]
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


def test_the_first_pass_reads_a_row_standardised_before_training_as_the_same_row_standardised_for_its_run():
    """batched_scan._entries: the per-run standardisation of a public row (m > 0) writes what
    standardize_columns does, bit for bit (the public map's edges and values rounded past them
    included), and the entry's norm and logits equal those of the same row standardised before
    training (m = 0: a run alone on its standardised copy of X), bit for bit; zeros, the biases
    and an infinite norm for a neutralised row."""
    from raco_cli.methods.batched_scan import _entries, margin_weights
    from raco_cli.privacy.preprocessing import standardize_columns, unit_columns

    rng = np.random.default_rng(0)
    m, d, K, R, n = 5, 19, 2, 3, 50
    P = rng.uniform(-1.0, 1.0, size=(n, d + K + 1)).astype(np.float32)
    P[0, :m] = [-1.0, 1.0, np.nextafter(np.float32(1.0), np.float32(2.0)), 0.0, np.float32(-1.0000001)]
    P[7, :d] = 0.0  # neutralised (GroupRows: zero features, infinite norm column)
    P[:, d + K] = 1.0
    P[7, d + K] = np.inf
    finite = np.isfinite(P[:, d + K])
    mean, std = rng.uniform(0.2, 0.8, size=(R, m)), rng.uniform(0.05, 0.5, size=(R, m))
    W, b = rng.normal(size=(R, K, d)).astype(np.float32), rng.normal(size=(R, K)).astype(np.float32)
    Wm, bm = margin_weights(W, b)
    # every row sampled by every run (histogram entries of runs 0..R-1, slot bits width 1)
    order, starts = np.arange(n), np.arange(0, R * n + 1, R)
    entries, width = np.tile((2 * np.arange(R)) << 1, n), 1
    XS, norms, Z = np.full((R * n, m), np.nan, dtype=np.float32), np.full(R * n, np.nan, dtype=np.float32), np.zeros((1, R * n), np.float32)
    _entries(P, unit_columns(P[:, :m]), finite, order, starts, entries, width, Wm, bm, d, m, mean, std, XS, norms, Z)
    for r in range(R):
        want = standardize_columns(P[:, :m], mean[r], std[r])
        Pr = P.copy()
        Pr[:, :m] = np.where(finite[:, None], want, 0.0)  # the run's own standardised copy, as a run alone trains on it
        one = (np.zeros((1, 0)), np.ones((1, 0)))
        XS1, norms1, Z1 = np.empty((n, 0), np.float32), np.empty(n, np.float32), np.zeros((1, n), np.float32)
        _entries(Pr, unit_columns(Pr[:, :0]), finite, order, np.arange(n + 1), np.zeros(n, dtype=np.int64) + (1 << 1), 1,
                 Wm[r : r + 1], bm[r : r + 1], d, 0, *one, XS1, norms1, Z1)
        for i in range(n):
            t = i * R + r
            assert norms[t] == norms1[i] and Z[0, t] == Z1[0, i], (r, i)
            if i == 7:
                assert (XS[t] == 0).all() and np.isinf(norms[t]) and Z[0, t] == bm[r, 0]
                continue
            assert np.array_equal(XS[t], want[i])
            assert norms[t] == pytest.approx(np.sqrt((Pr[i, :d].astype(np.float64) ** 2).sum() + 1.0), rel=1e-6)


def test_the_binary_margins_give_the_logits_rates_and_arg_max():
    """_entries under batched_scan.margin_weights, into row 1 of zeroed logits as Scan.logits
    writes them, stores (0, z_1 - z_0): its softmax (tempered or not) equals
    torch's softmax of the two logits (1e-6) and its arg-max torch's, a run whose class-1
    logits are NaN included (NaN rates, arg-max class 1)."""
    from raco_cli.methods.batched_scan import _entries, margin_weights

    rng = np.random.default_rng(1)
    R, n, d, K = 3, 40, 7, 2
    P = rng.normal(size=(n, d + K + 1)).astype(np.float32)
    W, b = rng.normal(size=(R, K, d)).astype(np.float32), rng.normal(size=(R, K)).astype(np.float32)
    W[2, 1, 3] = np.nan  # run 2's class-1 logits are NaN
    order, starts = np.arange(n), np.arange(0, R * n + 1, R)
    entries, width = np.tile((2 * np.arange(R)) << 1, n), 1
    Z = np.zeros((K, R * n), dtype=np.float32)
    Wm, bm = margin_weights(W, b)
    _entries(P, np.zeros((n, 0)), np.ones(n, dtype=bool), order, starts, entries, width, Wm, bm, d, 0, np.zeros((R, 0)), np.ones((R, 0)),
             np.empty((R * n, 0), dtype=np.float32), np.empty(R * n, dtype=np.float32), Z[1:])
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
    rows = GroupRows(small, train, cons.cells(small.y[train], small.group[train]), [None], CPU, n_cells=cons.Q)
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


@pytest.mark.parametrize("name, kw", [("raco_dp", {}), ("raco_dp", {"dual": "hard"}), ("dp_sgd", {})])
def test_three_classes_in_a_group_equal_each_run_alone(name, kw):
    """K = 3: the pass's general kernels (every class's logits, every class's sums; binary
    tasks take the margin and class 1's sums instead): each run equals the run alone, bit for bit."""
    from raco_cli.data import synthetic

    _run_both(synthetic.load(n=1200, n_features=6, n_classes=3, seed=0), name, _specs(name, **kw))


def _fermi_specs(scope="paper"):
    """DP-FERMI runs: lam 0 (no W player), 1 (its W gradients clipped) and 4, their own W noise,
    one with public group proportions."""
    return [replace(s, options={"lam": lam, "noise_multiplier_w": 2.0 + i, **({"group_proportions": [0.4, 0.6]} if i == 2 else {}),
                                **({"clip_norm_w": 0.05} if i == 1 else {})},
                    hist_noise_multiplier=None, temperature=1.0)
            for i, (s, lam) in enumerate(zip(_specs("dp_fermi", scope=scope), (0.0, 1.0, 4.0)))]


def test_dp_fermi_clips_its_w_player_alike_alone_and_grouped(small):
    alone, group = _run_both(small, "dp_fermi", _fermi_specs("model"))
    assert group[1].stats["clip_fraction_w"] > 0  # the W player's clipping is exercised


def _one_step_both_ways(data, *, R=3, count=2, q=0.08, scalings=None, hard=False, seed=0):
    """One step's histograms and clipped sums of R runs, by torch's gather and products (the
    accelerators' path) and by the compiled pass, from the same samples and parameters; and
    each sum's absolute terms summed (float64), the scale of its float32 rounding."""
    from raco_cli.methods import batched_scan
    from raco_cli.methods.sgda.batched import _histograms

    rng = np.random.default_rng(seed)
    train = np.asarray(data.splits["train"])
    cons = constraints.build("dp", n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.05)
    rows = GroupRows(data, train, cons.cells(data.y[train], data.group[train]), scalings or [None] * R, CPU, n_cells=cons.Q)
    K, d, Q = rows.K, rows.d, rows.Q
    W = torch.from_numpy(rng.normal(size=(R, K, d)).astype(np.float32))
    b = torch.from_numpy(rng.normal(size=(R, K)).astype(np.float32))
    weights = rng.normal(size=(R, Q, K))
    temps = np.array([1.0, 2.0, 0.5][:R], dtype=np.float32)
    reg_temp = np.array([30.0, 5.0, 80.0][:R], dtype=np.float32)
    clip = np.array([0.5, 1.0, 2.0][:R], dtype=np.float32)
    # torch's path
    idx, _ = poisson_sample_many(rows.n, q, [np.random.default_rng(seed + r) for r in range(R)], count=count)
    L = idx.shape[2]
    batch = rows.gather(idx.reshape(R, -1))
    grad_rows = {k: v[:, -L:] for k, v in batch.items()}
    z_all = batched.group_logits(W, b, batch["X"])
    H_t = _histograms(z_all[:, :, :L], batch["cellhot"][:, :L], hard=hard, temperature=torch.from_numpy(temps).view(R, 1, 1))
    c = torch.bmm(torch.from_numpy(weights).float().transpose(1, 2), grad_rows["cellhot"].transpose(1, 2))
    res_t = batched.clipped_sums(grad_rows, z_all[:, :, -L:], c, reg_temp=torch.from_numpy(reg_temp).view(R, 1, 1),
                                 temperature=torch.from_numpy(temps).view(R, 1, 1), clip=torch.from_numpy(clip).view(R, 1))
    # the scale of each sum: its terms' absolute values summed
    p = batched.group_softmax(z_all[:, :, -L:])
    g = (p - grad_rows["onehot"].transpose(1, 2)).abs() + torch.from_numpy(reg_temp).view(R, 1, 1) * 2.0 * c.abs()
    g = torch.nan_to_num(g, nan=0.0, posinf=0.0) * grad_rows["valid"][:, None, :]
    scale_w = torch.bmm(g.double(), grad_rows["X"].abs().double())
    scale_h = float(L)
    # the compiled pass
    scan = batched_scan.Scan(rows, R)
    scan.sample(scan.positions(q, [np.random.default_rng(seed + r) for r in range(R)], count=count), count=count)
    H_c = scan.histograms(W, b, temps, hard=hard)
    res_c = scan.clipped_sums(weights, reg_temp, temps, clip)
    return (H_t, res_t), (H_c, res_c), (scale_h, scale_w, L)


U32 = 2.0**-24  # float32's unit roundoff


@pytest.mark.parametrize("classes, hard, standardised", [(2, False, False), (2, True, False), (3, False, False), (2, False, True),
                                                          (3, True, True)])
def test_torch_path_and_compiled_pass_agree_within_float32_rounding_of_one_step(small, classes, hard, standardised):
    """The accelerators' path (torch's gather and batched products) and the CPU's compiled
    pass compute one step's histograms and clipped gradient sums of the same samples and
    parameters alike: the same rows dropped and counted as non-finite (rows with a NaN or inf
    feature) and clipped, and every sum within (L + 8) float32 roundoffs of its absolute terms'
    sum (a sum of L float32 terms rounds by at most L roundoffs of it; each term by a few).  A
    different model (a missing regularizer, another clip factor, another standardisation)
    moves a sum by whole terms, far outside that."""
    from raco_cli.data import synthetic

    table = small if classes == 2 else synthetic.load(n=1200, n_features=6, n_classes=3, seed=0)
    X = np.array(table.X, dtype=np.float32)
    train = np.asarray(table.splits["train"])
    X[train[:10], 2], X[train[10:20], 4] = np.nan, np.inf
    data = replace(table, X=X)
    scalings = None
    if standardised:  # (each run's DP scaling of the clean public columns)
        scalings = [dp_scaling(_public(table), noise_multiplier=2.0, source=noise_source(i, "cpu", secure=False)) for i in range(3)]
        data = replace(data, X=np.concatenate([np.tanh(X[:, :3]), X[:, 3:]], axis=1).astype(np.float32), meta=_public(table).meta)
    (H_t, res_t), (H_c, res_c), (scale_h, scale_w, L) = _one_step_both_ways(data, scalings=scalings, hard=hard)
    bound = (L + 8) * U32
    assert torch.equal(res_t.nonfinite, res_c.nonfinite) and int(res_c.nonfinite.sum()) > 0
    assert torch.equal(res_t.clipped, res_c.clipped)
    if hard:  # arg-max one-hots: the same counts, exactly (no margin sits within a rounding of a tie here)
        assert torch.equal(H_t, H_c)
    assert float((H_t - H_c).abs().max()) <= bound * scale_h
    assert ((res_t.grad_w.double() - res_c.grad_w.double()).abs() <= bound * scale_w + 1e-30).all()
    assert float((res_t.grad_b.double() - res_c.grad_b.double()).abs().max()) <= bound * float(scale_w.abs().max())
    assert float((res_t.norm_sum - res_c.norm_sum).abs().max()) <= bound * float(res_t.norm_sum.abs().max())


def test_dp_fermi_w_player_on_torch_path_and_compiled_pass_agree_within_float32_rounding(small):
    """DP-FERMI's W player, one step of three runs (one with its rows' W gradients clipped at a
    small C_w), by torch's path (``_w_gradient_sums``) and by the compiled pass
    (``Scan.w_clipped_sums``): the same clip counts, and the summed W gradient within (L + 8)
    float32 roundoffs of its absolute terms' sum."""
    from raco_cli.methods import batched_scan
    from raco_cli.methods.dp_fermi import _w_gradient_sums, w_distances, w_gradient

    rng = np.random.default_rng(5)
    R, k, K = 3, small.n_groups, 2
    train = np.asarray(small.splits["train"])
    rows = GroupRows(small, train, small.group[train], [None] * R, CPU, n_cells=k, neutralise_cells=False)
    W = torch.from_numpy(rng.normal(size=(R, K, rows.d)).astype(np.float32))
    b = torch.from_numpy(rng.normal(size=(R, K)).astype(np.float32))
    Wd = torch.from_numpy(rng.normal(size=(R, k, K)).astype(np.float32))
    s = torch.from_numpy(1.0 / np.sqrt(rng.uniform(0.2, 0.8, size=(R, k)))).float()
    clip_w = np.array([4.0, 0.05, 1.0], dtype=np.float32)
    idx, _ = poisson_sample_many(rows.n, 0.1, [np.random.default_rng(r) for r in range(R)])
    rb = rows.gather(idx[:, 0])
    z = batched.group_logits(W, b, rb["X"])
    G_t, nc_t = _w_gradient_sums(batched.group_softmax(z.float()).transpose(1, 2), rb["cellhot"], rb["valid"], Wd, s,
                                 torch.from_numpy(clip_w).view(R, 1))
    scan = batched_scan.Scan(rows, R)
    scan.sample(scan.positions(0.1, [np.random.default_rng(r) for r in range(R)], count=1), count=1)
    scan.logits(W, b)
    scan.clipped_sums(None, np.ones(R, dtype=np.float32), np.ones(R, dtype=np.float32), None)
    by_group, total, nc_c = scan.w_clipped_sums(w_distances(Wd, s), clip_w)
    G_c = w_gradient(Wd, s, by_group, total)
    L = idx.shape[2]
    assert torch.equal(nc_t, nc_c) and int(nc_c[1]) > 0
    scale = 2.0 * (s.abs()[:, :, None] + Wd.abs()).double() * L  # each row's |F_l| <= 1
    assert ((G_t.double() - G_c.double()).abs() <= (L + 8) * U32 * scale).all()


def test_every_linear_run_on_the_cpu_trains_on_the_compiled_pass(small, monkeypatch):
    """One path: every logistic-regression run on the CPU, alone (a group of one) or grouped,
    narrow rows or wide, sparse samples or dense, takes the compiled pass; an MLP does not
    (torch.func's per-sample gradients), nor a group forced onto torch's path (accelerators)."""
    from raco_cli.data import synthetic
    from raco_cli.methods import batched_scan

    used: list[int] = []
    sample = batched_scan.Scan.sample
    monkeypatch.setattr(batched_scan.Scan, "sample", lambda self, *a, **k: (used.append(self.R), sample(self, *a, **k))[1])
    wide = synthetic.load(n=600, n_features=40, seed=0)
    for data, batch_size in ((wide, 150), (small, 100), (wide, 20)):
        _group(data, "raco_dp", _specs("raco_dp", batch_size=batch_size))
        assert used[-STEPS:] == [3] * STEPS
    for name in ("raco_dp", "dp_sgd", "sgd", "sgda", "dp_fermi"):
        spec = (_fermi_specs() if name == "dp_fermi" else _specs(name))[0]
        cons = constraints.build("dp", n_classes=2, n_groups=small.n_groups, gamma=0.05)
        used.clear()
        methods.get(name).fit(small, _model(small), cons, spec, steps=5, seeds=Seeds.from_seed(0), device=CPU, reporter=NullReporter())
        assert used == [1] * 5, name
    used.clear()
    mlp = models.build("mlp", input_shape=small.input_shape, n_classes=2, options={"hidden": [8]})
    methods.get("raco_dp").fit(small, mlp, cons, _specs("raco_dp")[0], steps=5, seeds=Seeds.from_seed(0), device=CPU, reporter=NullReporter())
    assert used == []
    monkeypatch.setattr(batched, "COMPILED_SCAN", False)
    _group(small, "raco_dp", _specs("raco_dp"))
    assert used == []


def _group(data, name, specs):
    cons = [constraints.build("dp", n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.05) for _ in specs]
    members = [batched.Member(model=_model(data), constraints=c, spec=s, seeds=Seeds.from_seed(i)) for i, (c, s) in enumerate(zip(cons, specs))]
    return methods.get(name).fit_many(data, members, steps=STEPS, device=CPU)
