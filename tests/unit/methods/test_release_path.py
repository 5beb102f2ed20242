"""What RaCO-DP's releases are computed from and what is done with them, observed from outside
through the release hook (``reporter.on_release(step, kind, value)``, the one ``raco audit``
uses) on data built so that every training row is visible in every release:

* row i has a feature of its own (a Dirac feature, value 10: its clipped gradient fills weight
  column i and nothing else) and a group of its own (its own histogram cell), so the released
  gradient shows which rows were in the gradient batch and the released histogram which rows
  were in the histogram batch (noise far below one row's contribution);
* ``sampling=independent`` must draw two independent Poisson samples (overlap q^2 n), the
  accountant charging two separately subsampled releases; ``shared`` one sample for both;
* the dual/primal post-processing must read the released (noisy) histogram, and the update
  must be the released gradient sum divided by the public q|D|, never the realised batch size.

A test that only counted releases or compared the code's own counters could not fail on
these bugs (issue 13).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.data.types import TabularData
from raco_cli.methods.base import Seeds
from raco_cli.methods.sgda import core, raco_dp

N_TRAIN, DIRAC = 40, 10.0


def dirac_data() -> TabularData:
    """Training row i: feature e_i * DIRAC, group i; 10 validation and 10 test rows of zeros."""
    n = N_TRAIN + 20
    X = np.zeros((n, N_TRAIN), dtype=np.float32)
    X[np.arange(N_TRAIN), np.arange(N_TRAIN)] = DIRAC
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, n)
    group = np.concatenate([np.arange(N_TRAIN), rng.integers(0, N_TRAIN, 20)])
    return TabularData(
        name="dirac", X=X, y=y, group=group, feature_names=tuple(f"e{i}" for i in range(N_TRAIN)),
        class_names=("0", "1"), group_names=tuple(f"row{i}" for i in range(N_TRAIN)),
        splits={"train": np.arange(N_TRAIN), "val": np.arange(N_TRAIN, N_TRAIN + 10), "test": np.arange(N_TRAIN + 10, n)},
    )


class Observer:
    """A reporter that keeps every release the hook shows, and the parameters at that moment."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.seen: dict[str, list[torch.Tensor | list[torch.Tensor]]] = {"histogram": [], "gradient": []}
        self.params: list[list[torch.Tensor]] = []

    def on_step(self, step, total, values) -> None:  # noqa: ANN001
        pass

    def on_eval(self, record) -> None:  # noqa: ANN001
        pass

    def on_release(self, step: int, kind: str, value) -> None:  # noqa: ANN001
        if kind == "gradient":
            self.params.append([p.detach().clone() for p in self.model.parameters()])
            value = [v.clone() for v in value]
        else:
            value = value.clone()
        self.seen[kind].append(value)


def observed_run(sampling: str, steps: int = 30, **kw) -> tuple[Observer, object]:
    data = dirac_data()
    cons = constraints.build("dp", n_classes=2, n_groups=data.n_groups, gamma=0.05)
    assert cons.Q == N_TRAIN  # one histogram cell per training row
    spec = paper_spec(**{"name": "raco_dp", "batch_size": N_TRAIN // 2, "clip_norm": 1.0, "noise_multiplier": 0.1,
                         "hist_noise_multiplier": 0.01, "sampling": sampling, "lr": 1e-3, "lr_dual": 0.0,
                         "eval_every": 10**6, "selection": "last", **kw})  # fmt: skip
    model = models.build("logreg", input_shape=data.input_shape, n_classes=2)
    obs = Observer(model)
    res = raco_dp.fit(data, model, cons, spec, steps=steps, seeds=Seeds.from_seed(4), device=torch.device("cpu"), reporter=obs)
    return obs, res


def batches(obs: Observer) -> tuple[list[set[int]], list[set[int]]]:
    """Rows of each step's histogram batch (cell mass ~1) and gradient batch (weight column norm ~C)."""
    hist = [set(np.flatnonzero(H.sum(dim=1).numpy() > 0.5).tolist()) for H in obs.seen["histogram"]]
    grad = [set(np.flatnonzero(G[0].norm(dim=0).numpy() > 0.5).tolist()) for G in obs.seen["gradient"]]  # type: ignore[index]
    return hist, grad


def test_shared_sampling_feeds_one_batch_to_both_releases(engine):
    obs, res = observed_run("shared")
    hist, grad = batches(obs)
    assert len(hist) == len(grad) == res.steps
    assert hist == grad
    assert np.mean([len(b) for b in grad]) == pytest.approx(N_TRAIN / 2, rel=0.25)


def test_independent_sampling_draws_two_independent_batches(engine):
    """Two independent Poisson samples at q = 1/2: each row is in both with probability 1/4.
    Reusing the gradient batch for the histogram (the accountant still charging two
    independent samples) would put it in both with probability 1/2."""
    T = 30
    obs, res = observed_run("independent", steps=T)
    hist, grad = batches(obs)
    q = 0.5
    both = sum(len(h & g) for h, g in zip(hist, grad))
    expected, sd = q * q * N_TRAIN * T, np.sqrt(N_TRAIN * T * q * q * (1 - q * q))
    assert abs(both - expected) < 5 * sd, (both, expected)
    for sample in (hist, grad):  # both are Poisson samples at rate q
        sizes = [len(b) for b in sample]
        assert abs(np.sum(sizes) - q * N_TRAIN * T) < 5 * np.sqrt(N_TRAIN * T * q * (1 - q))
    assert sum(h == g for h, g in zip(hist, grad)) <= 1


def test_post_processing_reads_the_released_histogram(engine, dual_inputs):
    """Denominators, regularizer weights and the dual gradient are computed from the histogram
    the hook saw (the noisy release), never from the exact one."""
    given_to_step = dual_inputs
    obs, _ = observed_run("independent", steps=10, hist_noise_multiplier=5.0)
    assert len(given_to_step) == len(obs.seen["histogram"]) == 10
    for H_step, H_released in zip(given_to_step, obs.seen["histogram"]):
        assert torch.equal(H_step, H_released)  # type: ignore[arg-type]


def test_update_is_the_released_sum_divided_by_the_expected_batch_size(engine):
    """theta_t - theta_{t-1} = -lr * G_t / (q |D|) for plain SGD, whatever the realised batch
    size (dividing by the realised size would leak it and break the noise calibration)."""
    lr = 0.3
    obs, res = observed_run("independent", steps=12, lr=lr)
    expected_batch = N_TRAIN // 2  # q |D| = batch_size
    after = obs.params[1:] + [list(res.state_dict.values())]  # selection=last: the final parameters
    assert len({len(g) for g in batches(obs)[1]}) > 1  # the realised batch sizes do vary
    for before, now, G in zip(obs.params, after, obs.seen["gradient"]):
        for p0, p1, g in zip(before, now, G):  # type: ignore[call-overload]
            torch.testing.assert_close(p1 - p0, -lr * g / expected_batch, rtol=1e-4, atol=1e-6)


# --- the training histogram's sensitivity (core._histogram, the one the releases use) ----------


@settings(max_examples=40, deadline=None)
# a non-finite row under soft rates with one-hot cells (the numpy product's branch), every time
@example(n=6, Q=2, K=3, drop=2, bad=float("nan"), hard=False, onehot=True, seed=1)
@example(n=6, Q=2, K=3, drop=2, bad=float("inf"), hard=False, onehot=True, seed=1)
@given(
    n=st.integers(1, 12),
    Q=st.integers(1, 4),
    K=st.integers(2, 4),
    drop=st.integers(0, 11),
    bad=st.sampled_from([None, float("nan"), float("inf"), -float("inf")]),
    hard=st.booleans(),
    onehot=st.booleans(),
    seed=st.integers(0, 10**6),
)
def test_training_histogram_moves_by_at_most_one_in_l1(n, Q, K, drop, bad, hard, onehot, seed):
    """Add/remove one row changes the histogram of a batch by at most 1 in l1 (the Laplace
    release's sensitivity), whatever the row's logits (also NaN/inf) and the cell encoding;
    the histogram of finite rows sums to their number."""
    gen = torch.Generator().manual_seed(seed)
    logits = 5 * torch.randn(n, K, generator=gen)
    if bad is not None:
        logits[drop % n, int(seed) % K] = bad
    cells = torch.randint(0, Q, (n,), generator=gen)
    spec = paper_spec(name="raco_dp", dual="hard" if hard else "soft", temperature=3.0)
    encode = (lambda c: torch.nn.functional.one_hot(c, Q).float()) if onehot else (lambda c: c)  # noqa: E731

    def hist(rows: torch.Tensor) -> torch.Tensor:
        return core._histogram(logits[rows], encode(cells[rows]), Q, K, spec, torch.device("cpu"))

    full = torch.arange(n)
    without = full[full != drop % n]
    H, H_minus = hist(full), hist(without)
    assert H.shape == (Q, K) and torch.isfinite(H).all()
    assert float((H - H_minus).abs().sum()) <= 1.0 + 1e-6
    finite = torch.isfinite(logits).all(dim=1)
    if bool(finite.all()):
        assert float(H.sum()) == pytest.approx(n, abs=1e-5)
    else:
        assert float(H.sum()) <= n + 1e-5
