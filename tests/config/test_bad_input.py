"""Bad configuration values and types: one clear line (a RacoError), before the MLflow store
exists; a property test throws random overrides at the whole pre-run pipeline."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raco_cli import models
from raco_cli.cli.validate import compose_config
from raco_cli.errors import ConfigError, RacoError
from raco_cli.run.prepare import prepare_run

BASE = ["dataset=synthetic", "dataset.options.n=400", "method.max_steps=5", "method.batch_size=100"]


def _prepare(*extra: str, tmp_path=None):
    uri = [f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"] if tmp_path is not None else []
    return prepare_run(compose_config([*BASE, *uri, *extra]))


@pytest.mark.parametrize(
    "override,message",
    [
        ("eps=0", "eps must be > 0 (got eps=0.0); eps is the total privacy budget of the run."),
        ("eps=-0.5", "eps must be > 0 (got eps=-0.5); eps is the total privacy budget of the run."),
        ("eps=nan", "eps must be > 0 (got eps=nan); eps is the total privacy budget of the run."),
        ("delta=0", "delta must be in (0, 1) (got delta=0.0); delta is the failure probability of the (eps, delta) guarantee, typically 1e-5 or below 1/n."),
        ("delta=1.5", "delta must be in (0, 1) (got delta=1.5); delta is the failure probability of the (eps, delta) guarantee, typically 1e-5 or below 1/n."),
        ("constraint.gamma=-0.1", "constraint.gamma must be >= 0 (got -0.1); gamma is the allowed gap of each rate constraint."),
        ("eps=one", "eps must be a number (got eps='one'); eps is the total privacy budget of the run."),
        ("constraint.gamma=[1]", "constraint.gamma must be a number (got constraint.gamma=[1]); gamma is the allowed gap of each rate constraint."),
        ("method.lr=fast", "method.lr must be a number (got method.lr='fast'); see conf/method/<name>.yaml for its meaning."),
        ("method.batch_size=12.5", "method.batch_size must be an integer (got method.batch_size=12.5); a count, or auto (from the training size)."),
        ("seed=-1", "seed must be a non-negative integer (got seed=-1)."),
        ("method.noise_multiplier=1e-31", "method.noise_multiplier must be >= 0.1 (got method.noise_multiplier=1e-31): smaller noise costs eps in the hundreds per step and the accountant cannot represent it; for training without noise use method=sgda or method=sgd."),
        ("method.hist_noise_multiplier=0.001", "method.hist_noise_multiplier must be >= 0.01 (got method.hist_noise_multiplier=0.001): smaller noise costs eps in the hundreds per step and the accountant cannot represent it; for training without noise use method=sgda or method=sgd."),
        ("privacy.discretization=1e-300", "privacy.discretization must be in [1e-06, 0.1] (got 1e-300); it is the PLD loss grid (default 1e-4; smaller is tighter and slower)."),
        ("dataset.options.n_features=1000000", "dataset.options.n_features must be <= 10000 (got dataset.options.n_features=1000000); see conf/dataset/synthetic.yaml."),
        ("threads=0", "threads must be a positive integer or null (got threads=0); null keeps torch's default."),
        ("dataset.split_seed=-1", "dataset.split_seed must be an integer in [0, 2^32 - 1] (got dataset.split_seed=-1)."),
        ("method=adam", "Unknown method 'adam'. Available: dp_double_spider, dp_fermi, dp_private_diff, dp_recursive_spider, dp_sgd, dp_sgda, dpse, raco_dp, sgd, sgda, spider."),
        ("model=resnet", "Unknown model 'resnet'. Available: linear, logreg, mlp, resnet16, resnet20."),
        ("+model.input_dim=5", "Unknown key model.input_dim for model=logreg. Allowed: none."),
        ("+dataset.options.rows=5", "Unknown key dataset.options.rows for dataset 'synthetic'. Allowed: n, n_classes, n_features, n_groups, seed (see conf/dataset/synthetic.yaml)."),
        ("dataset.options.n=5", "dataset.options.n must be an integer >= 100 (got dataset.options.n=5); see conf/dataset/synthetic.yaml."),
        ("task=regression", "task=regression needs a dataset with a real-valued label (dataset=group_mixture); dataset=synthetic has class labels (task=classification). Use task=auto."),
        ("privacy.secure_rng=yes", "privacy.secure_rng must be true, false or auto (got privacy.secure_rng='yes'); secret noise and batches from the OS CSPRNG (auto: true under privacy.scope=model)."),
    ],
)
def test_bad_values_give_one_exact_line_and_no_store(tmp_path, override, message):
    with pytest.raises(RacoError) as info:
        _prepare(override, tmp_path=tmp_path)
    assert str(info.value) == message
    assert "\n" not in str(info.value)
    assert not (tmp_path / "mlflow.db").exists()


def test_unknown_names_and_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"^Unknown dataset 'adlt'\. Available: acs_employment, adult, celeba, cifar10, credit, digits, fashion_mnist, group_mixture, heart, mnist, parkinsons, synthetic, synthetic_images, table\.$"):
        _prepare("dataset=adlt")
    with pytest.raises(ConfigError, match=r"Key 'learning_rate' is not in the config; check the key name"):
        _prepare("method.learning_rate=3")


def test_a_batch_larger_than_the_data_is_one_line_with_a_value_that_works(tmp_path):
    """scope=paper names the exact size.  scope=model knows only the released DP count, whose
    noise can put it below a batch the table allows: the run samples every row (q = 1,
    test_size.py) and, with a batch far too large, the budget error that follows says what to lower."""
    with pytest.raises(RacoError) as info:
        _prepare("method.batch_size=100000", "privacy.scope=paper", tmp_path=tmp_path)
    assert str(info.value) == ("method.batch_size must be <= the number of training rows (got method.batch_size=100000; the "
                               "training split has 255 rows); it is the expected Poisson batch size. Use e.g. method.batch_size=25.")
    with pytest.raises(RacoError, match=r"^Cannot reach eps=1\.0 \(delta=1e-05, sample_rate=1, .*a single step already spends eps=.*"
                       r"lower the batch size\.$"):
        _prepare("method.batch_size=100000", tmp_path=tmp_path)
    assert not (tmp_path / "mlflow.db").exists()


def test_budget_that_cannot_be_met(tmp_path):
    # 4 000 rows: under scope=model the released training size is n + N(0, 50^2) per cell, and
    # on BASE's 400 rows it fell below method.batch_size=100 in ~1 run of 100 (a different,
    # also correct, error)
    with pytest.raises(RacoError, match=r"^Cannot reach eps=0\.001 \(delta=1e-05, sample_rate=.*a single step already spends eps="):
        _prepare("eps=0.001", "dataset.options.n=4000", tmp_path=tmp_path)
    with pytest.raises(RacoError, match=r"^Cannot reach eps=0\.05 \(delta=1e-05, steps=5, .*the run would spend eps="):
        _prepare("eps=0.05", "method.steps=5", "method.batch_size=250", "privacy.scope=paper", tmp_path=tmp_path)
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(
    "extra,message",
    [
        (["model=mlp", "model.hidden=[-3]"], "model.hidden must be a list of layer widths, integers in 1..1000000 (got model.hidden=[-3]); e.g. model.hidden=[64,64] for model=mlp."),
        (["model=mlp", "model.hidden=5"], "model.hidden must be a list of layer widths, integers in 1..1000000 (got model.hidden=5); e.g. model.hidden=[64,64] for model=mlp."),
        (["model=mlp", "model.hidden=[0]"], "model.hidden must be a list of layer widths, integers in 1..1000000 (got model.hidden=[0]); e.g. model.hidden=[64,64] for model=mlp."),
    ],
)
def test_models_with_impossible_shapes(extra, message):
    with pytest.raises(ConfigError) as info:
        _prepare(*extra)
    assert str(info.value) == message


def test_a_model_that_does_not_fit_the_data_shape(monkeypatch):
    """A model built for another example shape (e.g. images) fails its dry forward pass."""
    from torch import nn

    monkeypatch.setitem(models.MODELS, "image_cnn", lambda input_shape, n_classes: nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(n_classes)))
    monkeypatch.setitem(models.OPTIONS, "image_cnn", ())
    with pytest.raises(ConfigError) as info:
        models.build("image_cnn", input_shape=(8,), n_classes=2)
    assert str(info.value).startswith("model=image_cnn does not fit the data: examples have shape (8,), and the forward pass fails with: ")
    assert str(info.value).endswith("Choose a model for this input shape (model=logreg or model=mlp for tables).")
    monkeypatch.setitem(models.MODELS, "three_logits", lambda input_shape, n_classes: nn.Sequential(nn.Flatten(), nn.Linear(8, 3)))
    monkeypatch.setitem(models.OPTIONS, "three_logits", ())
    with pytest.raises(ConfigError, match=r"returns outputs of shape \(3,\) per example, the data has 2 classes"):
        models.build("three_logits", input_shape=(8,), n_classes=2)


# --- property test ------------------------------------------------------------------------

KEYS = [
    "eps", "delta", "seed", "device", "constraint.gamma", "method.lr", "method.lr_dual", "method.batch_size",
    "method.noise_multiplier", "method.hist_noise_multiplier", "method.clip_norm", "method.temperature",
    "method.lambda_max", "method.sampling", "method.dual", "method.selection", "method.optimizer",
    "method.momentum", "method.denominator_floor", "method.eval_every", "method.calibrate_noise",
    "dataset.subset", "dataset.split_seed", "dataset.options.n_groups", "dataset.options.n_features",
    "privacy.discretization", "privacy.secure_rng", "tracking.enabled", "model.hidden", "method.lrr", "foo",
    "dataset", "method", "model", "constraint",
]  # fmt: skip
VALUES = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(lambda f: repr(float(f))),
    st.sampled_from(["true", "false", "null", "[]", "[1,2]", "[-1]", "{}", "''", "abc", "sgd", "soft", "mlp", "dp", "none", "1e-300", "1e308"]),
    st.text(alphabet="abc01.-_[]{}$,=:'\" ", min_size=0, max_size=8),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=4))
def test_random_overrides_never_escape_as_tracebacks(tmp_path, pairs):
    overrides = [f"{k}={v}" for k, v in pairs]
    overrides = [o for o in overrides if not o.startswith(("method.max_steps", "method.steps"))]
    try:
        _prepare(*overrides, tmp_path=tmp_path)
    except RacoError as exc:
        assert "\n" not in str(exc) and str(exc)
    assert not (tmp_path / "mlflow.db").exists()


REGRESSION = ["dataset=group_mixture", "dataset.options.eval_size=20", "dataset.options.largest=200", "constraint=none",
              "method=dpse", "method.steps=3", "method.selection=last", "model=linear"]


def _prepare_regression(*extra: str, tmp_path):
    return prepare_run(compose_config([*REGRESSION, f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", *extra]))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["constraint=dp"], "constraint=dp needs class rates (P(prediction = k | group)); task=regression has a real-valued label and no "
                            "classes. Use constraint=none (DPSE's bounded group loss is method.options.bgl_penalty)."),
        (["method=raco_dp"], "method=raco_dp does not support task=regression (it needs class labels: a cross-entropy loss and class "
                             "rates); use method=dpse, dp_sgd or sgd."),
        (["method=dp_fermi"], "method=dp_fermi does not support task=regression (it needs class labels: a cross-entropy loss and class "
                              "rates); use method=dpse, dp_sgd or sgd."),
        (["task=classification"], "task=classification needs a dataset with class labels; dataset=group_mixture has a real-valued label "
                                  "(task=regression). Use task=auto."),
        (["task=ordinal"], "task must be one of auto, classification, regression (got task='ordinal'); auto follows the dataset "
                           "(group_mixture: regression, the others: classification)."),
        (["method.selection=best_feasible"], "method.selection=best_feasible needs a bounded validation score for the private checkpoint "
                                             "choice of privacy.scope=model, and task=regression has none (the squared error is "
                                             "unbounded). Use method.selection=last (the paper's last iterate) or privacy.scope=paper."),
        (["privacy.rho=-2"], "privacy.rho must be in (0, 10000] or null (got privacy.rho=-2); it is a rho-zCDP budget (the DPSE paper's "
                             "2, 4.5, 8), used instead of eps."),
        (["privacy.rho=two"], "privacy.rho must be a number (got privacy.rho='two'); a rho-zCDP budget (null: use eps)."),
        (["model.bias=maybe"], "model.bias must be true or false (got model.bias='maybe'); whether the linear model has an intercept."),
        (["method.options.allocation=equal"], "method.options.allocation must be one of max, sum, uniform (got 'equal'); max: w_k = s_k^2 / "
                                              "max_j s_j^2, sum: the paper's s_k^2 / sum_j s_j^2, uniform: DPNoSE."),
        (["dataset.options.K=3"], "dataset.options.slopes must have one entry per group (K=3, got 2: [-10, 10]); see "
                                  "conf/dataset/group_mixture.yaml."),
        (["privacy.rho=2", "privacy.delta_exponent=1.1"], "privacy.delta_exponent=1.1 cannot be combined with privacy.rho=2 (rho is "
                                                         "converted to eps at the configured delta); set one of them to null."),
    ],
)
def test_regression_refusals_are_one_line(tmp_path, overrides, message):
    with pytest.raises(RacoError) as info:
        _prepare_regression(*overrides, tmp_path=tmp_path)
    assert str(info.value) == message
    assert not (tmp_path / "mlflow.db").exists()


def test_a_rho_budget_sets_eps_and_the_regression_run_is_planned(tmp_path):
    from raco_cli.privacy.accountant import rho_epsilon

    prep = _prepare_regression("privacy.rho=4.5", "method.calibrate_noise=true", tmp_path=tmp_path)
    assert prep.spec.rho == 4.5 and prep.spec.eps == rho_epsilon(4.5, 1e-5)
    assert prep.data.task == "regression" and prep.plan.eps_planned <= prep.spec.eps


def test_delta_exponent_with_a_released_size_of_one_is_one_line(monkeypatch):
    """privacy.delta_exponent with a released n~ clamped to 1 (a tiny table under the size noise)
    gave delta = 1, a guarantee of nothing (and Theorem 7's phase divided by log 1 = 0): one line."""
    from raco_cli.methods.base import MethodSpec

    monkeypatch.setattr(MethodSpec, "size_of", lambda self, n_rows: 1.0)
    with pytest.raises(ConfigError) as info:
        _prepare("privacy.delta_exponent=1.1", "privacy.scope=paper")
    msg = str(info.value)
    assert msg.startswith("privacy.delta_exponent=1.1 gives delta = n^-1.1 = 1 from a training size of 1") and "\n" not in msg
