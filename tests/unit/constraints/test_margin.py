"""Generalisation margins of ``constraint.confidence`` (raco_cli/constraints/margin.py), the DP
cell counts they read (raco_cli/privacy/size.py ``dp_cell_counts``) and how ``prepare_run``
wires them (raco_cli/run/prepare.py ``with_margins``).

The Monte-Carlo checks draw training and fresh samples from a population with known rates and
count how often the fresh-data gap exceeds the training gap plus the margin: they use the margin
function only as the thing under test, never its formulas.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raco_cli.constraints import ConstraintSet, build
from raco_cli.constraints.families import false_negative_rate
from raco_cli.constraints.margin import TEST_PER_TRAIN, Signal, distinct_constraints, margins
from raco_cli.privacy import releases
from raco_cli.privacy.size import dp_cell_counts, size_event

# --- (a) Monte Carlo: the margin covers the fresh-data gap with the stated confidence ----------


def _fresh_size(train_rows: np.ndarray) -> int:
    """"New data" the size of the held-out test split: 25 % of the rows, the training split
    75 % x 85 % of them (raco_cli/data/tabular.py)."""
    return round(train_rows.sum() * 0.25 / (0.75 * 0.85))


def _dp_exceedance(rates, train_rows, margin, *, trials=20_000, seed=0) -> float:
    """P(|fresh DP gap| > |training DP gap| + margin) for a fixed classifier whose positive
    rate is ``rates[g]`` in group g: training samples have ``train_rows[g]`` rows of group g,
    fresh samples the test split's size with group counts drawn from the population shares."""
    rng = np.random.default_rng(seed)
    rates, train_rows = np.asarray(rates, float), np.asarray(train_rows)
    train_gap = (rng.binomial(train_rows[0], rates[0], trials) / train_rows[0]
                 - rng.binomial(train_rows[1], rates[1], trials) / train_rows[1])
    n_fresh = _fresh_size(train_rows)
    fresh_a = rng.binomial(n_fresh, train_rows[0] / train_rows.sum(), trials)
    fresh_b = n_fresh - fresh_a
    fresh_gap = rng.binomial(fresh_a, rates[0]) / fresh_a - rng.binomial(fresh_b, rates[1]) / fresh_b
    return float(np.mean(np.abs(fresh_gap) > np.abs(train_gap) + margin))


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95])
@pytest.mark.parametrize("rates", [(0.5, 0.5), (0.55, 0.45), (0.3, 0.2), (0.9, 0.85)])
def test_the_dp_margin_covers_the_fresh_gap_with_the_stated_confidence(rates, confidence):
    train_rows = np.array([700, 300])
    cons = build("dp", n_classes=2, n_groups=2, gamma=0.5)
    m = float(margins(cons, train_rows, confidence=confidence, signal=None).margin.max())
    assert _dp_exceedance(rates, train_rows, m) <= 1 - confidence


def test_the_monte_carlo_check_catches_half_a_margin():
    """The check above has power: half the margin is exceeded more often than 1 - confidence
    (so a margin computed from, say, four times the rows would fail it)."""
    train_rows = np.array([700, 300])
    m = float(margins(build("dp", n_classes=2, n_groups=2, gamma=0.5), train_rows, confidence=0.9, signal=None).margin.max())
    assert _dp_exceedance((0.55, 0.45), train_rows, m / 2) > 0.1
    assert _dp_exceedance((0.55, 0.45), train_rows, 0.0) > 0.3


def _fnr_exceedance(fnr: float, positives: int, margin: float, *, trials=20_000, seed=1) -> float:
    """P(fresh FNR > training FNR + margin) for a fixed classifier missing ``fnr`` of the
    positives, with ``positives`` of 1000 training rows positive."""
    rng = np.random.default_rng(seed)
    train = rng.binomial(positives, fnr, trials) / positives
    fresh_pos = rng.binomial(_fresh_size(np.array([positives, 1000 - positives])), positives / 1000, trials)
    fresh = rng.binomial(fresh_pos, fnr) / fresh_pos
    return float(np.mean(fresh > train + margin))


def _fnr_margin(positives: int, confidence: float = 0.9) -> float:
    cons = ConstraintSet.build(false_negative_rate(n_classes=2, n_groups=2, gamma=0.5, positive_class=1), n_classes=2, n_groups=2)
    assert cons.J == 1 and cons.Q == 2  # the partition by label: positives, negatives
    cell_rows = np.zeros(cons.Q)
    cell_rows[cons.cell_of[1, 0]], cell_rows[cons.cell_of[0, 0]] = positives, 1000 - positives
    return float(margins(cons, cell_rows, confidence=confidence, signal=None).margin[0])


@pytest.mark.parametrize("fnr", [0.3, 0.2, 0.05])
def test_the_fnr_margin_covers_the_fresh_rate(fnr):
    """FNR of the positive class (one one-sided constraint): P(fresh FNR > train FNR + m) <= 1 - c."""
    m = _fnr_margin(200)
    assert _fnr_exceedance(fnr, 200, m) <= 0.1
    assert _fnr_exceedance(fnr, 200, m / 3) > 0.1  # power


def test_at_the_worst_case_the_normal_approximation_is_tight_not_conservative():
    """A single one-sided constraint at rate 0.5 (where Popoviciu's bound is attained) leaves no
    slack: the margin is a normal approximation, and the random size of the fresh sample's cells
    and the binomial's discreteness put the exceedance a little above 1 - c (measured with 10^6
    trials: 0.1009 with 200 positives, 0.1038 with 50).  Pinned here so a change of the margin
    that makes it worse shows."""
    for positives in (200, 50):
        assert _fnr_exceedance(0.5, positives, _fnr_margin(positives), trials=100_000) <= 0.106


# --- (b) one small case by hand --------------------------------------------------------------


def test_hand_computed_margins_of_demographic_parity():
    """DP, two groups of 100 and 400 training rows, confidence 0.9.

    A row of group a moves the gap P_1(a) - P_1(b) by a value in an interval of width 1 (its own
    rate's weight), so by Popoviciu the variance of the gap is <= 1/(4*100) + 1/(4*400) =
    0.003125 on the training rows; the test split holds r = 0.25 / (0.75 * 0.85) = 0.392157 rows
    per training row, so the fresh term is 0.003125 / r = 0.0079688, s = sqrt(0.0110938) =
    0.105327.  Both signs of the gap are one statistic (S = 1, delta = 0.1) bounded from both
    sides, h = gamma = 0.5; the far side's Phi(-(2h - m)/s) = Phi(-8.2) is ~1e-16, so the root
    is z = z_{0.9} = 1.281552 and m = 1.281552 * 0.105327 = 0.134982.
    With a training signal of Poisson batches at q = 0.1 over a window of 10 steps (batches of
    10 and 40 rows): + (1/40 + 1/160) / 10 = 0.003125, s = 0.119243, m = 0.152816.
    With Laplace(1) noise on its histogram cells (variance 2 per count, K = 2 counts per cell,
    each moving its rate by at most 1 / (batch rows)): + 2 * 2 * (1/10^2 + 1/40^2) / 10 = 0.00425,
    s = 0.135900, m = 0.174163.
    """
    cons = build("dp", n_classes=2, n_groups=2, gamma=0.5)
    rows = np.array([100.0, 400.0])
    assert TEST_PER_TRAIN == pytest.approx(0.392157, abs=1e-6)
    assert distinct_constraints(cons) == 1
    plain = margins(cons, rows, confidence=0.9, signal=None)
    assert plain.z == pytest.approx([1.281552] * 4, abs=1e-6)
    assert plain.margin == pytest.approx([0.134982] * 4, abs=1e-6)
    signal = margins(cons, rows, confidence=0.9, signal=Signal(sample_rate=0.1, window=10, laplace_scale=0.0))
    assert signal.margin == pytest.approx([0.152816] * 4, abs=1e-6)
    noisy = margins(cons, rows, confidence=0.9, signal=Signal(sample_rate=0.1, window=10, laplace_scale=1.0))
    assert noisy.margin == pytest.approx([0.174163] * 4, abs=1e-6)
    assert noisy.subset_rows.tolist() == [100.0, 400.0]


def _pair_root(s: float, h: float, delta: float) -> float:
    """The pair's margin recomputed with scipy (an independent root finder and normal cdf)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    return s * brentq(lambda z: norm.cdf(-z) + norm.cdf(-(2 * h / s - z)) - delta, 0.0, h / s)


@pytest.mark.parametrize("gamma", [0.12, 0.15, 0.3])
def test_the_pair_margin_is_the_root_of_both_sides_risk(gamma):
    """Near h the far side's term matters: the margin is the root of Phi(-m/s) + Phi(-(2h-m)/s)
    = 1 - c, not the one-sided s z_{1-(1-c)}; recomputed independently."""
    cons = build("dp", n_classes=2, n_groups=2, gamma=gamma)
    rows = np.array([700.0, 300.0])
    found = margins(cons, rows, confidence=0.9, signal=None)
    s = float(found.margin[0] / found.z[0])
    assert s == pytest.approx(math.sqrt((1 / 2800 + 1 / 1200) * (1 + 1 / TEST_PER_TRAIN)), rel=1e-9)
    assert found.margin == pytest.approx([_pair_root(s, gamma, 0.1)] * 4, rel=1e-6)
    assert (found.z >= 1.281552 - 1e-6).all()
    if gamma == 0.12:  # here the far side adds 0.0037 to the one-sided 0.0834
        assert found.margin[0] > 1.281552 * s + 0.003


def test_the_union_bound_counts_distinct_statistics():
    """Three groups: three statistics P_1(g) - P_1(rest), each bounded from both sides (class
    0's rows are class 1's with the sign flipped), so delta = 0.1 / 3; at gamma 0.5 the far
    side is negligible and z = z_{1 - 0.1/3} = 1.833915.  At gamma 0.1 a centred model already
    fails too often (h / s < z_{1 - delta/2}): the two-sided z_{1 - 0.1/6} = 2.128045, > h."""
    rows = np.array([100.0, 200.0, 300.0])
    assert distinct_constraints(build("dp", n_classes=2, n_groups=3, gamma=0.5)) == 3
    assert margins(build("dp", n_classes=2, n_groups=3, gamma=0.5), rows, confidence=0.9, signal=None).z == pytest.approx(
        [1.833915] * 6, abs=1e-6)
    declined = margins(build("dp", n_classes=2, n_groups=3, gamma=0.1), rows, confidence=0.9, signal=None)
    assert declined.z == pytest.approx([2.128045] * 6, abs=1e-6)
    assert (declined.margin > 0.1).all()


def test_one_sided_statistics_take_the_one_sided_z():
    """FNR of each class bounded from above only: two statistics, z = z_{1 - 0.1/2}."""
    cons = build("fnr", n_classes=2, n_groups=2, gamma=0.3)
    assert distinct_constraints(cons) == 2
    cell_rows = np.full(cons.Q, 250.0)
    assert margins(cons, cell_rows, confidence=0.9, signal=None).z == pytest.approx([1.644854] * cons.J, abs=1e-6)


# --- (a') Monte Carlo of a trained model: its training gap pinned at the target ----------------


def _pinned_risk(gamma: float, margin: float, *, rows=(700, 300), trials=20_000, seed=0) -> float:
    """P(|fresh DP gap| > gamma) for a model that training drives to its target: a one-parameter
    family (positive rates 0.5 + t/2 in group a, 0.5 - t/2 in group b, thresholds on shared
    per-row uniforms, so Popoviciu's bound is attained), of which the procedure keeps the
    largest t whose training gap is <= gamma - margin (the binding constraint of an accuracy
    that grows with t).  Fresh samples are the test split's size."""
    rng = np.random.default_rng(seed)
    n_a, n_b = rows
    u_a, u_b = rng.random((trials, n_a)), rng.random((trials, n_b))
    lo, hi = np.full(trials, -1.0), np.full(trials, 1.0)
    for _ in range(30):  # bisection on t, every trial at once
        t = (lo + hi) / 2
        ok = (u_a < 0.5 + t[:, None] / 2).mean(axis=1) - (u_b < 0.5 - t[:, None] / 2).mean(axis=1) <= gamma - margin
        lo, hi = np.where(ok, t, lo), np.where(ok, hi, t)
    n_fresh = _fresh_size(np.asarray(rows))
    fresh_a = rng.binomial(n_fresh, n_a / (n_a + n_b), trials)
    fresh = rng.binomial(fresh_a, 0.5 + lo / 2) / fresh_a - rng.binomial(n_fresh - fresh_a, 0.5 - lo / 2) / (n_fresh - fresh_a)
    return float(np.mean(np.abs(fresh) > gamma))


@pytest.mark.parametrize("gamma", [0.108, 0.2])
def test_a_model_trained_to_the_target_meets_gamma_on_fresh_data_with_the_stated_confidence(gamma):
    """The case the margin is for, simulated without its formulas: at rates 0.5 the normal
    approximation is tight (measured 0.103 at gamma 0.108, 0.101 at 0.2, 20 000 trials with
    sd 0.002), so the bound allows 0.106 as the one-sided test above does; half the margin, and
    near h the one-sided margin (the far side ignored: 0.116 at gamma 0.108), are exceeded
    clearly more often."""
    cons = build("dp", n_classes=2, n_groups=2, gamma=gamma)
    found = margins(cons, np.array([700.0, 300.0]), confidence=0.9, signal=None)
    m, s = float(found.margin[0]), float(found.margin[0] / found.z[0])
    assert _pinned_risk(gamma, m) <= 0.106
    assert _pinned_risk(gamma, m / 2) > 0.2
    if gamma == 0.108:
        assert _pinned_risk(gamma, 1.281552 * s) > 0.112


# --- (c) limits ----------------------------------------------------------------------------------


def _dp_margin(rows, confidence=0.9, signal=None, **kw) -> float:
    return float(margins(build("dp", n_classes=2, n_groups=2, gamma=0.5), np.asarray(rows, float),
                         confidence=confidence, signal=signal, **kw).margin.max())


def test_the_margin_shrinks_with_rows_and_grows_with_confidence():
    assert _dp_margin([400, 1600]) == pytest.approx(_dp_margin([100, 400]) / 2)  # every term ~ 1/sqrt(n)
    sizes = [_dp_margin([n, 3 * n]) for n in (50, 100, 1000, 10_000, 100_000)]
    assert all(a > b for a, b in zip(sizes, sizes[1:])) and sizes[-1] < 0.01
    by_confidence = [_dp_margin([100, 400], c) for c in (0.5, 0.8, 0.9, 0.95, 0.99)]
    assert all(a < b for a, b in zip(by_confidence, by_confidence[1:]))


def test_the_margin_tends_to_the_training_term_as_the_fresh_data_grows():
    train_only = 1.281552 * math.sqrt(1 / 400 + 1 / 1600)  # gamma 0.5: the far side negligible
    assert _dp_margin([100, 400], test_per_train=1e9) == pytest.approx(train_only, rel=1e-5)
    assert _dp_margin([100, 400], test_per_train=1.0) == pytest.approx(train_only * math.sqrt(2), rel=1e-5)


def test_the_signal_term_shrinks_with_the_window_and_grows_with_the_noise():
    def with_signal(window, scale):
        return _dp_margin([100, 400], signal=Signal(sample_rate=0.1, window=window, laplace_scale=scale))

    assert with_signal(10**9, 5.0) == pytest.approx(_dp_margin([100, 400]), rel=1e-6)
    assert with_signal(10, 0.0) < with_signal(10, 1.0) < with_signal(10, 2.0)
    assert with_signal(100, 2.0) < with_signal(10, 2.0)


# --- (d) the DP cell counts --------------------------------------------------------------------


def test_dp_cell_counts_add_gaussian_noise_of_sd_sigma_per_cell_and_sum_to_the_size():
    """Exact integers: counts + the discrete Gaussian of sd sigma_Z = discrete_gaussian_for(50) = 51
    (the scale GaussianDpEvent(50) covers, raco_cli/privacy/discrete.py), independent per cell."""
    counts = np.array([100, 2000, 30])
    gen = torch.Generator().manual_seed(3)
    draws = []
    for _ in range(4000):
        size, noisy = dp_cell_counts(counts, noise_multiplier=50.0, source=gen)
        assert size == max(1, round(noisy.sum()))
        draws.append(noisy)
    draws = np.array(draws)
    assert np.array_equal(draws, np.round(draws)) and draws.dtype == np.float64
    assert np.abs(draws.mean(axis=0) - counts).max() < 4 * 51 / math.sqrt(4000)
    assert draws.std(axis=0) == pytest.approx([51.0] * 3, rel=0.05)
    assert abs(np.corrcoef(draws.T)[0, 1]) < 0.06  # independent cells


def test_the_cell_counts_are_one_release_of_sensitivity_one_on_the_tape():
    """A record is in exactly one cell: removing one changes the exact count vector by a unit
    vector (L2 sensitivity 1), which is what ``size_event(sigma)`` = ``GaussianDpEvent(sigma)``
    (noise sd / sensitivity) accounts for."""
    cons = build("eo", n_classes=2, n_groups=3, gamma=0.1)
    rng = np.random.default_rng(0)
    y, g = rng.integers(0, 2, 500), rng.integers(0, 3, 500)
    exact = np.bincount(cons.cells(y, g), minlength=cons.Q)
    for i in (0, 17, 499):
        neighbour = np.bincount(cons.cells(np.delete(y, i), np.delete(g, i)), minlength=cons.Q)
        assert np.linalg.norm(exact - neighbour) == 1.0
    assert str(size_event(7.0)) == "GaussianDpEvent(noise_multiplier=7.0)"
    with releases.recording() as tape:
        dp_cell_counts(exact, noise_multiplier=7.0, source=torch.Generator().manual_seed(0))
    assert tape.kinds() == {"size": 1} and len(tape.entries[0][1]) == cons.Q


# --- prepare_run: margins from the released counts, two noise sds lower ----------------------------

RUN = ["dataset=synthetic", "eps=2", "method.batch_size=150", "method.max_steps=30", "method.eval_every=5",
       "constraint.gamma=0.25", "tracking=none"]


def _prepare(*extra, tape=None):
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.prepare import prepare_run

    cfg = compose_config([*RUN, *extra])
    if tape is None:
        with releases.recording() as recorded:
            return prepare_run(cfg), recorded
    with releases.replaying(tape):
        return prepare_run(cfg), tape


def test_scope_model_margins_read_the_released_cell_counts_two_sds_lower():
    """The margins and n~ come from the tape's cell counts (the DP release), lowered by two sds
    of their noise per cell (the discrete Gaussian's sd 51 at privacy.size_noise_multiplier = 50,
    privacy/size.py): a planted release, far from the exact counts,
    moves them; the exact counts never do."""
    prep, tape = _prepare()
    assert prep.spec.scope == "model" and prep.spec.constraint.confidence == 0.9
    (kind, released), *_ = tape.entries
    assert kind == "size" and len(released) == prep.constraints.Q == 2
    planted = np.asarray(released, float) + np.array([900.0, 600.0])  # well away from the exact counts
    tape.entries[0] = ("size", planted)
    replayed, _ = _prepare(tape=tape)
    sigma = replayed.spec.size_noise_multiplier
    assert sigma == 50.0
    # the planned tree charges the cell counts once, as the Gaussian of sensitivity 1 at sigma
    assert str(replayed.plan.event).count(str(size_event(sigma))) == 1
    lowered = np.maximum(planted - 2 * 51, 1.0)  # sigma_Z = ceil(sqrt(50^2 + 2^2)) = 51
    assert replayed.margins.subset_rows == pytest.approx(replayed.requested.membership @ lowered)
    assert replayed.spec.method.train_size is None and replayed.plan.spec.train_size == round(planted.sum())
    # the margins really depend on those counts: more rows, smaller margins
    assert (replayed.margins.margin < prep.margins.margin).all()


def test_scope_model_trains_against_gamma_minus_the_margin():
    prep, _ = _prepare()
    m = prep.margins.margin
    assert (m > 0.01).all() and (m < 0.25).all()
    assert prep.requested.gamma == pytest.approx([0.25] * 4)
    assert prep.constraints.gamma == pytest.approx(0.25 - m)
    assert prep.constraints.names == prep.requested.names


def test_confidence_null_and_scope_paper_train_against_gamma_itself():
    for extra in (["constraint.confidence=null"], ["privacy.scope=paper"]):
        prep, _ = _prepare(*extra)
        assert prep.margins is None
        assert prep.constraints.gamma == pytest.approx([0.25] * 4)
    paper, _ = _prepare("privacy.scope=paper")
    assert paper.spec.constraint.confidence is None
    # an explicit confidence under scope=paper: margins from the exact counts (nothing to protect), no signal noise
    explicit, tape = _prepare("privacy.scope=paper", "constraint.confidence=0.9")
    assert explicit.margins is not None and "size" not in tape.kinds()
    assert explicit.constraints.gamma == pytest.approx(0.25 - explicit.margins.margin)


def test_dual_auto_reads_hard_rates_when_a_margin_applies():
    """``method.dual=auto`` (raco_dp's default): the margin certifies hard rates (what the test
    split reports), so a run with a margin steps its dual on hard rates; without a margin it keeps
    the paper's soft rates; an explicit choice is kept."""
    prep, _ = _prepare()
    assert prep.spec.auto_dual and prep.margins is not None
    assert prep.plan.spec.dual == "hard"
    for extra in (["constraint.confidence=null"], ["privacy.scope=paper"]):
        unmargined, _ = _prepare(*extra)
        assert unmargined.margins is None and unmargined.plan.spec.dual == "soft"
    explicit, _ = _prepare("method.dual=soft")
    assert explicit.margins is not None and not explicit.spec.auto_dual and explicit.plan.spec.dual == "soft"


def test_the_certificate_is_planned_inside_eps_and_only_where_a_confidence_is_claimed():
    """scope=model with a confidence: the certificate's release (privacy.certificate_noise_multiplier)
    is in the run's DpEvent tree before training, so the printed eps covers it; without a
    confidence, or under scope=paper (exact counts, nothing to account), it is not."""
    import dp_accounting as dpa

    prep, _ = _prepare()
    assert prep.plan.spec.certificate_noise == 10.0
    leaves = repr(prep.plan.event)
    assert "GaussianDpEvent(noise_multiplier=10.0)" in leaves and prep.plan.eps_planned <= prep.spec.eps
    without = [e for e in prep.plan.event.events if e != dpa.GaussianDpEvent(10.0)]
    from raco_cli.privacy import accountant

    assert accountant.cached_epsilon(dpa.ComposedDpEvent(without), prep.spec.delta) < prep.plan.eps_planned
    for extra in (["constraint.confidence=null"], ["privacy.scope=paper", "constraint.confidence=0.9"]):
        other, _ = _prepare(*extra)
        assert other.plan.spec.certificate_noise == 0.0 and "GaussianDpEvent(noise_multiplier=10.0)" not in repr(other.plan.event)
