"""The training size as a DP count (raco_cli/privacy/size.py): its noise, its place in the event
tree and the plan, and that the run uses the released count, never the exact n."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli.privacy import accountant, releases
from raco_cli.privacy.discrete import discrete_gaussian_for
from raco_cli.privacy.mechanisms import SecureNoise
from raco_cli.privacy.size import dp_size, noisy_count, size_event


def test_count_noise_is_the_discrete_gaussian_of_the_planned_scale():
    """Monte Carlo: n~ - n is an integer of std sigma_Z = discrete_gaussian_for(sigma) = 21 at
    sigma = 20 (the discrete Gaussian GaussianDpEvent(20) covers, raco_cli/privacy/discrete.py)
    and mean ~0; a count without noise (or with another scale) fails.  3000 draws: the std's
    relative se is 1.3 %."""
    assert discrete_gaussian_for(20.0) == 21
    g = torch.Generator().manual_seed(0)
    draws = np.array([noisy_count(10_000, 20.0, g) - 10_000 for _ in range(3000)])
    assert all(isinstance(noisy_count(10_000, 20.0, g), int) for _ in range(3))
    assert draws.std() == pytest.approx(21.0, rel=0.06)
    assert abs(draws.mean()) < 4 * 21.0 / np.sqrt(3000)


def test_secure_count_noise_has_the_same_scale():
    """The same with SecureNoise (os.urandom, unseeded): 1500 draws, 5 standard errors."""
    secure = np.array([noisy_count(10_000, 20.0, SecureNoise()) - 10_000 for _ in range(1500)])
    assert secure.std() == pytest.approx(21.0, rel=0.09)


def test_a_huge_count_noise_has_the_discrete_gaussians_variance():
    """sigma = 3e6 (sigma_Z = 3 000 001): the variance of n~ - n is sigma_Z^2 (the clamp at 1 is
    never reached from n = 10^9); 3000 draws, a sample variance within 5 of its standard errors."""
    sigma_z = discrete_gaussian_for(3e6)
    assert sigma_z == 3_000_001
    g = torch.Generator().manual_seed(5)
    draws = np.array([noisy_count(10**9, 3e6, g) - 10**9 for _ in range(3000)], dtype=np.float64)
    assert draws.var() == pytest.approx(sigma_z**2, rel=5 * math.sqrt(2 / 3000))
    assert abs(draws.mean()) < 5 * sigma_z / math.sqrt(3000)


def test_the_count_is_at_least_one_row():
    assert noisy_count(0, 50.0, torch.Generator().manual_seed(3)) >= 1


def test_the_release_is_on_the_tape():
    with releases.recording() as tape:
        n = dp_size(500, noise_multiplier=5.0, source=torch.Generator().manual_seed(1))
    assert tape.entries == [("size", n)]
    with releases.replaying(tape):
        assert dp_size(501, noise_multiplier=5.0, source=torch.Generator().manual_seed(2)) == n


def test_the_plan_composes_the_count_and_stays_within_eps():
    """scope=model: the count's Gaussian is one leaf of the run's tree, eps of the plan equals an
    independent PLD composition of the same leaves, and it costs steps (never eps)."""
    from raco_cli.methods import get
    from raco_cli.methods.planning import plan_uncached

    method = get("dp_sgd")
    spec = paper_spec(name="dp_sgd", batch_size=256, noise_multiplier=1.0, clip_norm=1.0, hist_noise_multiplier=None)
    without = plan_uncached(method, spec, n_train=10_000, eps=1.0, delta=1e-5, constrained=False)
    counted = paper_spec(name="dp_sgd", batch_size=256, noise_multiplier=1.0, clip_norm=1.0, hist_noise_multiplier=None,
                         size_noise=20.0, train_size=10_013.0)
    with_count = plan_uncached(method, counted, n_train=10_013.0, eps=1.0, delta=1e-5, constrained=False)
    assert "GaussianDpEvent(noise_multiplier=20.0)" in str(with_count.event)
    assert with_count.eps_planned <= 1.0 and with_count.steps <= without.steps
    independent = dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 10_013.0, dpa.GaussianDpEvent(1.0)), with_count.steps),
        size_event(20.0),
    ])  # fmt: skip
    assert accountant.epsilon(independent, 1e-5) == pytest.approx(with_count.eps_planned, rel=1e-9)


def test_a_scope_model_run_uses_the_released_size(tmp_path):
    """The run's q and train_size come from the released count (replayed here as a value far
    from n: the summary follows the tape, not the data)."""
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.prepare import prepare_run

    cfg = compose_config(["dataset=synthetic", "method=dp_sgd", "constraint=none", "method.batch_size=150", "tracking=none"])
    with releases.recording() as tape:
        prep = prepare_run(cfg)
    n = len(prep.data.splits["train"])
    assert tape.entries[0][0] == "size" and prep.plan.spec.train_size == tape.entries[0][1]
    tape.entries[0] = ("size", n + 500)
    with releases.replaying(tape):
        replayed = prepare_run(cfg)
    assert replayed.plan.spec.train_size == n + 500 and replayed.plan.sample_rate == pytest.approx(150 / (n + 500))


def test_scope_paper_uses_the_exact_size():
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.prepare import prepare_run

    with releases.recording() as tape:
        prep = prepare_run(compose_config(["dataset=synthetic", "method=dp_sgd", "constraint=none", "privacy.scope=paper",
                                           "method.batch_size=150", "tracking=none"]))
    assert "size" not in tape.kinds() and prep.plan.spec.train_size is None
    assert prep.plan.sample_rate == 150 / len(prep.data.splits["train"])


def test_a_released_size_below_the_batch_samples_every_row(caplog):
    """scope=model: the noise of n~ can put it below a batch size the table allows (a few hundred
    rows, sd 100 over 4 cells).  The run then samples at q = min(1, B / n~) = 1, as its training
    loop does, is accounted at q = 1 (post-processing of n~), and says so; it is no config error."""
    import logging

    from raco_cli import methods
    from raco_cli.cli.validate import compose_config
    from raco_cli.methods.base import NullReporter, Seeds
    from raco_cli.run.prepare import prepare_run

    cfg = compose_config(["dataset=synthetic", "method=dp_sgd", "constraint=none", "method.batch_size=150", "method.max_steps=3",
                          "eps=8", "tracking=none"])
    with releases.recording() as tape:
        prepare_run(cfg)
    tape.entries[0] = ("size", 100.0)  # n~ below the batch of 150
    with releases.replaying(tape), caplog.at_level(logging.WARNING, logger="raco_cli.methods.planning"):
        prep = prepare_run(cfg)
    assert prep.plan.sample_rate == 1.0 and prep.plan.spec.train_size == 100.0
    assert "PoissonSampledDpEvent(sampling_probability=1.0" in str(prep.plan.event)
    assert any("method.batch_size=150 is above the released training size n~ = 100" in r.getMessage() for r in caplog.records)
    result = methods.get("dp_sgd").fit(prep.data, prep.model, prep.constraints, prep.plan.spec, steps=prep.plan.steps,
                                       seeds=Seeds.from_seed(0), device=torch.device("cpu"), reporter=NullReporter())
    n = len(prep.data.splits["train"])
    assert result.stats["sample_rate"] == prep.plan.sample_rate and result.stats["mean_batch_size"] == n  # every row, every step
