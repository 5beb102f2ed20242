"""The replay test over true neighbouring datasets: what ``privacy.scope=model`` writes holds
against a reader of every record.

Two datasets D and D' differ by one whole record (features, label and group) added to or
removed from the training or the validation split; the test split is the same.  A run on D
records its tape of noisy releases (the DP count of the training rows, the DP standardisation,
histograms, gradient sums, DP-FERMI's and DPSE's releases, the DRO methods' releases, the
selection's noisy scores); the same run on D', fed that tape in place of the mechanisms, must
consume it exactly and write the same bytes: model.pt, summary.json (but its MLflow run id),
config.yaml, predictor.json, the MLflow params, metric histories and tags, and the log file
(whose lines carry no clock time under scope=model).  Anything in the records that depends on
the data other than through an accounted release (the exact n in the sample rate, training
group sizes, batch sizes, a seed that replays the noise) shows up as a difference.

Parametrised over every private method and mode, a sweep group trained by the batched engine,
seeded and secret randomness.  ``test_a_default_run_cannot_be_replayed_from_its_records`` is
the attack itself: re-run from everything a default run wrote, the model does not come back.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from raco_cli.privacy import releases

HYDRA_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job log format
SMALL = ["method.batch_size=150", "method.max_steps=30", "method.eval_every=5"]
# RaCO-DP under the default constraint.confidence (0.9): a gamma the margins of 30 steps on the
# synthetic table fit under (about 0.15), so its runs release the partition's cell counts and
# train against gamma - margin, and the replay covers the margins too
MARGIN = [*SMALL, "constraint.gamma=0.25"]
DRO = ["objective=dro", "method.steps=10", "method.batch_size=150", "method.eval_every=5"]
CASES = {
    "raco_dp": ["method=raco_dp", *MARGIN],
    "raco_dp_shared": ["method=raco_dp", "method.sampling=shared", *MARGIN],
    "raco_dp_seeded": ["method=raco_dp", "privacy.secure_rng=false", *MARGIN],
    "dp_sgd": ["method=dp_sgd", "constraint=none", *SMALL],
    "dp_fermi": ["method=dp_fermi", *SMALL],
    "dpse": ["method=dpse", "constraint=none", "method.steps=20", "method.eval_every=5"],
    "dp_double_spider": ["method=dp_double_spider", *DRO],
    "dp_recursive_spider": ["method=dp_recursive_spider", *DRO],
    "dp_sgda": ["method=dp_sgda", *DRO],
    "dp_private_diff": ["method=dp_private_diff", *DRO],
}
REGRESSION = ["experiment=dpse_table1", "dataset.options.sizes=[600,150,150,150,150]", "dataset.options.eval_size=300",
              "method.steps=20", "method.eval_every=20"]


# the 600-row tables' released training size: the sum of 4 cell counts with N(0, 50^2) each at the
# default (sd 100 rows) fell below their batch of 100 in ~0.3 % of runs, a ConfigError (privacy/size.py)
TABLE_SIZE_NOISE = "privacy.size_noise_multiplier=10"


def _config(tmp_path: Path, overrides: list[str], *, dataset: list[str] | None = None):
    from raco_cli.cli.validate import compose_config

    return compose_config([*(["dataset=synthetic", "eps=2"] if dataset is None else dataset), *overrides,
                           f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "tracking.run_name=replayed"])


def _load(cfg):
    from raco_cli.run.prepare import load_data_uncached
    from raco_cli.run.spec import build_run_spec

    return load_data_uncached(build_run_spec(cfg))


def neighbours(data, split: str, direction: str):
    """(D, D'): D' is D with one whole record of ``split`` removed, or (``add``) the other way round."""
    idx = np.asarray(data.splits[split])
    smaller = replace(data, splits={**data.splits, split: np.delete(idx, len(idx) // 2)})
    return (data, smaller) if direction == "remove" else (smaller, data)


class _LogFile:
    """A log file with Hydra's job format on the root logger, as ``raco train`` writes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter(HYDRA_FORMAT))
        self.handler.setLevel(logging.INFO)

    def __enter__(self) -> _LogFile:
        root = logging.getLogger()
        self.level = root.level
        root.addHandler(self.handler)
        root.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self.level)
        self.handler.close()


def _run(monkeypatch, tmp_path: Path, name: str, cfg, data) -> dict:
    from raco_cli.run import prepare
    from raco_cli.run import train as train_mod

    monkeypatch.setattr(prepare, "load_data", lambda spec: data)
    monkeypatch.setattr(train_mod, "_SECURE_RNG_WARNED", False)  # warned once per process: in both logs
    run_dir = tmp_path / name
    with _LogFile(tmp_path / f"{name}.log") as logfile:
        summary = train_mod.train(cfg, run_dir=run_dir)
    return records(tmp_path, run_dir, summary, logfile.path)


def records(tmp_path: Path, run_dir: Path, summary: dict, log_path: Path | None = None) -> dict:
    """Everything a run wrote, in comparable form (run ids and directories aside)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(summary["mlflow"]["run_id"])
    histories = {k: client.get_metric_history(run.info.run_id, k) for k in run.data.metrics}
    stamps = {m.timestamp for ms in histories.values() for m in ms}
    tags = {k: v for k, v in run.data.tags.items()
            if not k.startswith("mlflow.") and k != "raco.run_dir"}  # (no heartbeat or pid start under scope=model)
    written = json.loads((run_dir / "summary.json").read_text())
    written.pop("mlflow")
    out = {
        "model.pt": (run_dir / "model.pt").read_bytes(),
        "summary": written,
        "config.yaml": (run_dir / "config.yaml").read_text(),
        "params": run.data.params,
        "metrics": {k: [(m.step, m.value) for m in ms] for k, ms in histories.items()},
        "metric_clock_times": len(stamps),  # scope=model: one (the run's creation), no per-window timing
        "run_times": (run.info.start_time, run.info.end_time),  # scope=model: the public day, start = end
        "tags": tags,
        "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id)),
        "log": log_path.read_text() if log_path is not None else None,
    }
    predictor = run_dir / "model" / "artifacts" / "predictor"
    if predictor.is_dir():
        out["predictor.json"] = (predictor / "predictor.json").read_text()
        out["predictor model.pt"] = (predictor / "model.pt").read_bytes()
    return out


def _replay(monkeypatch, tmp_path: Path, cfg, data, split: str, direction: str):
    d, d_prime = neighbours(data, split, direction)
    with releases.recording() as tape:
        first = _run(monkeypatch, tmp_path, "D", cfg, d)
    with releases.replaying(tape):  # raises unless the tape is consumed exactly
        second = _run(monkeypatch, tmp_path, "D_prime", cfg, d_prime)
    return tape, first, second


def assert_same_records(first: dict, second: dict) -> None:
    assert first["metric_clock_times"] == 1, "scope=model metrics must not time the evaluation windows"
    start, end = first["run_times"]
    assert start == end, "a scope=model run's MLflow start and end times must carry no duration"
    for key in first:
        assert first[key] == second[key], f"{key} differs between neighbouring datasets"
    assert first["log"] and "Privacy plan" in first["log"]


@pytest.mark.parametrize("case", list(CASES))
def test_neighbouring_datasets_give_the_same_records(monkeypatch, tmp_path, case):
    cfg = _config(tmp_path, CASES[case])
    split, direction = ("val", "add") if case.endswith("spider") else ("train", "remove" if list(CASES).index(case) % 2 else "add")
    tape, first, second = _replay(monkeypatch, tmp_path, cfg, _load(cfg), split, direction)
    kinds = tape.kinds()
    assert kinds["size"] == 1, kinds  # the training size: a DP count, released once
    assert first["summary"]["privacy_scope"] == "model" and first["summary"]["train_size"] is not None
    if case.startswith("raco_dp"):  # the size release is the partition's cell counts, and the margins read them
        size = dict(tape.entries)["size"]
        assert np.ndim(size) == 1 and len(size) == first["summary"]["partition_cells"] == 2
        assert all(m > 0 for m in first["summary"]["margins"].values())
        # the released model's certificate: its validation counts, released once, and the claim read from them
        assert kinds["certificate"] == 1 and first["summary"]["certificate"]["count_sd"] > 0, kinds
    assert_same_records(first, second)


@pytest.mark.parametrize("split,direction", [("train", "add"), ("train", "remove"), ("val", "add"), ("val", "remove")])
def test_raco_dp_both_directions_both_splits(monkeypatch, tmp_path, split, direction):
    cfg = _config(tmp_path, CASES["raco_dp"])
    _, first, second = _replay(monkeypatch, tmp_path, cfg, _load(cfg), split, direction)
    assert_same_records(first, second)


def test_dpse_regression(monkeypatch, tmp_path):
    cfg = _config(tmp_path, REGRESSION, dataset=[])
    _, first, second = _replay(monkeypatch, tmp_path, cfg, _load(cfg), "train", "remove")
    assert first["summary"]["task"] == "regression"
    assert_same_records(first, second)


def test_a_table_with_its_predictor(monkeypatch, tmp_path):
    from raco_cli.data.fixtures import people_frame

    csv = tmp_path / "people.csv"
    people_frame(600, seed=4).to_csv(csv, index=False)
    dataset = [
        "dataset=table", f"dataset.options.path={csv}", "dataset.options.label=approved", "dataset.options.sensitive=[sex]",
        "+dataset.options.types.id=drop", "+dataset.options.levels={approved:[no,yes],sex:[F,M],city:[Paris,Lyon,Nice],smoker:[no,yes]}",
        "dataset.options.missing_indicator=[income]", "+dataset.bounds={age:[18,100],income:[0,200000]}", "eps=4",
    ]  # fmt: skip
    # constraint.confidence=null: 380 training rows cannot support the default margin at gamma=0.05
    cfg = _config(tmp_path, ["method.batch_size=100", "method.max_steps=30", "method.eval_every=5", "constraint.confidence=null",
                             TABLE_SIZE_NOISE], dataset=dataset)
    _, first, second = _replay(monkeypatch, tmp_path, cfg, _load(cfg), "train", "add")
    assert "predictor.json" in first
    assert_same_records(first, second)


PRIVATE_TABLE = [
    "+dataset.options.types.id=drop", "+dataset.options.levels={approved:private,sex:private,city:private,smoker:private}",
    "dataset.options.missing_indicator=private", "+dataset.bounds={age:private,income:{source:private,transform:log1p}}",
    "dataset.estimate_noise_multiplier=2", "eps=4",
]  # fmt: skip


@pytest.mark.parametrize(("split", "direction"), [("train", "remove"), ("val", "add")])
def test_a_table_with_private_estimates(monkeypatch, tmp_path, split, direction):
    """dataset=table whose bounds, level lists (label and groups included) and missing-value
    indicators are estimated privately from the training split: the estimates are one
    release on the tape, and the neighbour's run writes the same records."""
    from raco_cli.data.fixtures import people_frame

    csv = tmp_path / "people.csv"
    people_frame(600, seed=4).to_csv(csv, index=False)
    dataset = ["dataset=table", f"dataset.options.path={csv}", "dataset.options.label=approved", "dataset.options.sensitive=[sex]",
               *PRIVATE_TABLE]
    # constraint.confidence=null: 380 training rows cannot support the default margin at gamma=0.05
    cfg = _config(tmp_path, ["method.batch_size=100", "method.max_steps=30", "method.eval_every=5", "constraint.confidence=null",
                             TABLE_SIZE_NOISE], dataset=dataset)
    data = _load(cfg)
    assert data.meta["pending"]  # loaded (and cached) without the estimates: they are drawn per run
    tape, first, second = _replay(monkeypatch, tmp_path, cfg, data, split, direction)
    assert tape.kinds()["estimates"] == 1 and [k for k, _ in tape.entries][:2] == ["estimates", "size"]
    estimates = first["summary"]["estimates"]
    assert estimates["levels"]["approved"] == ["no", "yes"] and estimates["bounds"]["income"][0] >= 0
    assert "GaussianDpEvent(noise_multiplier=2.0)" in first["summary"]["event"] and "Private estimates" in first["log"]
    assert "predictor.json" in first
    assert_same_records(first, second)


@pytest.mark.parametrize("secure", [True, False])
def test_a_sweep_group_trained_together(monkeypatch, tmp_path, secure):
    """The batched engine: three runs of a group, prepared (each its own size count and
    standardisation release) and trained as one problem, replayed on the neighbour."""
    from raco_cli.run import prepare
    from raco_cli.run.group import train_group
    from raco_cli.run.spec import plain_config

    cfg = plain_config(_config(tmp_path, [*CASES["raco_dp"], f"privacy.secure_rng={str(secure).lower()}"]))
    data = _load(cfg)
    d, d_prime = neighbours(data, "train", "remove")

    def group(name: str, rows) -> list[dict]:
        monkeypatch.setattr(prepare, "load_data", lambda spec: rows)
        members = [{"num": s, "run_dir": str(tmp_path / name / str(s)), "config": {**cfg, "seed": s}} for s in range(3)]
        summaries = train_group(members, sweep_dir=None, memory_gb=2.0)
        assert all(s is not None for s in summaries)
        return [records(tmp_path, Path(m["run_dir"]), s) for m, s in zip(members, summaries)]

    with releases.recording() as tape:
        first = group("D", d)
    with releases.replaying(tape):
        second = group("D_prime", d_prime)
    for a, b in zip(first, second):
        a.pop("log"), b.pop("log")
        assert_same_records({**a, "log": "Privacy plan"}, {**b, "log": "Privacy plan"})
    if secure:  # runs of one group never share draws: their models differ although their seeds differ only in init
        assert first[0]["model.pt"] != first[1]["model.pt"]


def test_a_default_run_cannot_be_replayed_from_its_records(tmp_path):
    """The attack: everything a default (scope=model) run wrote -- its config.yaml with the seed,
    summary.json, the MLflow tags -- is not enough to re-run it and get its model back; with
    ``privacy.secure_rng=false`` (the recorded seed replays every draw) it is."""
    from omegaconf import OmegaConf

    from raco_cli.run import train as train_mod

    cfg = _config(tmp_path, CASES["raco_dp"])
    first = train_mod.train(cfg, run_dir=tmp_path / "released")
    assert first["secure_rng"] is True and first["seeds"]["noise"] is None and first["seeds"]["sampling"] is None
    replayed_cfg = OmegaConf.load(tmp_path / "released" / "config.yaml")  # what the reader has
    train_mod.train(replayed_cfg, run_dir=tmp_path / "attack")
    assert (tmp_path / "released" / "model.pt").read_bytes() != (tmp_path / "attack" / "model.pt").read_bytes()

    seeded = _config(tmp_path, [*CASES["raco_dp"], "privacy.secure_rng=false"])
    train_mod.train(seeded, run_dir=tmp_path / "seeded")
    train_mod.train(OmegaConf.load(tmp_path / "seeded" / "config.yaml"), run_dir=tmp_path / "seeded_attack")
    assert (tmp_path / "seeded" / "model.pt").read_bytes() == (tmp_path / "seeded_attack" / "model.pt").read_bytes()


def test_no_record_of_a_default_run_holds_a_noise_seed(tmp_path):
    """Under secret randomness no derived seed of the noise, the batches, the selection, the
    standardisation or the size count appears in anything the run wrote (the init seed may)."""
    from mlflow.tracking import MlflowClient

    from raco_cli.methods.base import Seeds
    from raco_cli.run import train as train_mod

    cfg = _config(tmp_path, CASES["raco_dp"])
    with _LogFile(tmp_path / "run.log"):
        summary = train_mod.train(cfg, run_dir=tmp_path / "run")
    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(summary["mlflow"]["run_id"])
    written = "\n".join([
        (tmp_path / "run" / "summary.json").read_text(), (tmp_path / "run" / "config.yaml").read_text(),
        (tmp_path / "run.log").read_text(), json.dumps(run.data.tags), json.dumps(run.data.params),
    ])  # fmt: skip
    seeds = Seeds.from_seed(summary["seed"])
    for name in ("sampling", "noise", "selection", "preprocessing", "size", "estimates"):
        assert str(getattr(seeds, name)) not in written, f"the {name} seed is in the records"
    assert str(seeds.init) in written  # the init seed is written (initialisation may stay seeded)


def test_a_table_with_private_types(monkeypatch, tmp_path):
    """Issue 59: the types describe writes (`private`: numeric / categorical / binary / drop
    decided with the bounds or levels inside the estimates release) reach the records only
    through that release: replayed on the neighbour, every record is the same."""
    from raco_cli.data.fixtures import people_frame

    csv = tmp_path / "people.csv"
    people_frame(600, seed=4).to_csv(csv, index=False)
    dataset = ["dataset=table", f"dataset.options.path={csv}", "dataset.options.label=approved", "dataset.options.sensitive=[sex]",
               "+dataset.options.types={id:drop,age:private,income:private,city:private,smoker:private}",
               "+dataset.options.levels={approved:private,sex:private}", "dataset.options.missing_indicator=private",
               "dataset.estimate_noise_multiplier=2", "eps=4"]  # fmt: skip
    cfg = _config(tmp_path, ["method.batch_size=100", "method.max_steps=30", "method.eval_every=5", "constraint.confidence=null",
                             TABLE_SIZE_NOISE], dataset=dataset)
    data = _load(cfg)
    assert data.meta["pending"] and data.feature_names == ()  # no type decided before the release
    tape, first, second = _replay(monkeypatch, tmp_path, cfg, data, "train", "remove")
    assert tape.kinds()["estimates"] == 1
    types = first["summary"]["estimates"]["types"]
    assert types == {"age": "numeric", "income": "numeric", "city": "categorical", "smoker": "binary"}, types
    assert "dataset.options.types.city" in first["params"] and first["params"]["dataset.options.types.city"] == "private"
    assert_same_records(first, second)


# --- the neighbour varied (issue 59) ---------------------------------------------------------
# The tests above remove one fixed record from the split index arrays.  A leak that reads a
# statistic of one label, one group or one column's extremes (the exact count of class-1 rows in
# a log line, a plan that branches on its parity, the exact validation accuracy) is invisible
# when the removed record leaves that statistic unchanged.  Below the removed or added record is
# one of each label, each group, the largest and smallest value of each feature, in train and in
# validation; one case plans with method.batch_size=auto; and the neighbouring *file* goes through
# everything a user runs: raco data describe -> the loader -> the per-record split -> training.
# Every written byte is compared (curves.png included) but the accounted noise, which the tape
# replays.

KINDS = ("label0", "label1", "group0", "group1")


def pick(data, split: str, kind: str) -> int:
    """The position, in ``data.splits[split]``, of a record of ``kind``: ``label<k>``,
    ``group<k>``, or ``max<j>`` / ``min<j>`` (the extreme value of feature column ``j``)."""
    idx = np.asarray(data.splits[split])
    if kind.startswith(("label", "group")):
        values = (data.y if kind.startswith("label") else data.group)[idx]
        (where,) = np.flatnonzero(values == int(kind[5:]))[:1]
        return int(where)
    column = np.asarray(data.X[idx])[:, int(kind[3:])]
    return int(np.argmax(column) if kind.startswith("max") else np.argmin(column))


def neighbour_pair(data, split: str, kind: str, direction: str):
    """(D, D'): D' is D with the record of ``kind`` removed from ``split`` (or added: swapped)."""
    idx = np.asarray(data.splits[split])
    smaller = replace(data, splits={**data.splits, split: np.delete(idx, pick(data, split, kind))})
    return (data, smaller) if direction == "remove" else (smaller, data)


def with_curves(out: dict, run_dir: Path) -> dict:
    curves = run_dir / "curves.png"
    return {**out, "curves.png": curves.read_bytes() if curves.exists() else None}


def _train_one(monkeypatch, tmp_path: Path, name: str, cfg, data=None) -> dict:
    """One run (``data`` given: the loader bypassed) with everything it wrote."""
    from raco_cli.run import prepare
    from raco_cli.run import train as train_mod

    if data is not None:
        monkeypatch.setattr(prepare, "load_data", lambda spec: data)
    monkeypatch.setattr(train_mod, "_SECURE_RNG_WARNED", False)
    run_dir = tmp_path / name
    with _LogFile(tmp_path / f"{name}.log") as logfile:
        summary = train_mod.train(cfg, run_dir=run_dir)
    return with_curves(records(tmp_path, run_dir, summary, logfile.path), run_dir)


def _replay_pair(monkeypatch, tmp_path: Path, cfg, d, d_prime, name: str = ""):
    with releases.recording() as tape:
        first = _train_one(monkeypatch, tmp_path, f"{name}D", cfg, d)
    with releases.replaying(tape):  # raises unless the tape is consumed exactly
        second = _train_one(monkeypatch, tmp_path, f"{name}D_prime", cfg, d_prime)
    return first, second


# the default run: a class-1 training record and a group-0 validation record (the leaks of one
# label's count and of the validation accuracy); every other label, group and split: slow
FAST_KINDS = {("label1", "train"), ("group0", "val")}


@pytest.mark.parametrize(("kind", "split"), [pytest.param(k, s, id=f"{k}-{s}", marks=() if (k, s) in FAST_KINDS else pytest.mark.slow)
                                             for k in KINDS for s in ("train", "val")])
def test_a_record_of_each_label_and_group(monkeypatch, tmp_path, kind, split):
    cfg = _config(tmp_path, CASES["raco_dp"])
    data = _load(cfg)
    first, second = _replay_pair(monkeypatch, tmp_path, cfg, *neighbour_pair(data, split, kind, "remove"))
    assert first["curves.png"] is not None
    assert_same_records(first, second)


@pytest.mark.slow  # two runs per feature column and extreme
def test_the_extreme_records_of_every_feature(monkeypatch, tmp_path):
    cfg = _config(tmp_path, CASES["raco_dp"])
    data = _load(cfg)
    for j in range(len(data.feature_names)):
        for kind, split in ((f"max{j}", "train"), (f"min{j}", "val")):
            first, second = _replay_pair(monkeypatch, tmp_path, cfg, *neighbour_pair(data, split, kind, "add"), name=f"{kind}-")
            assert_same_records(first, second)


def test_the_automatic_batch_size(monkeypatch, tmp_path):
    """``method.batch_size=auto`` plans the batch from the released training size only."""
    overrides = [o for o in CASES["raco_dp"] if not o.startswith("method.batch_size")] + ["method.batch_size=auto"]
    cfg = _config(tmp_path, overrides)
    first, second = _replay_pair(monkeypatch, tmp_path, cfg, *neighbour_pair(_load(cfg), "train", "label1", "remove"))
    assert "method.batch_size=auto: " in first["log"]  # planned from the released size: the same in both
    assert_same_records(first, second)


@pytest.mark.parametrize("kind", ["flag=y", *(pytest.param(k, marks=pytest.mark.slow) for k in ("approved=yes", "approved=no", "sex=F", "sex=M"))])
def test_the_neighbouring_file_through_describe_load_split_and_train(monkeypatch, tmp_path, kind):
    """The file and the file minus one row (the row that flips a type: ``flag`` is ``x`` in every
    row but this one; slow: a row of each class and each group), in the training split by its own
    hash: ``raco data describe`` prints the same configuration for both, and training on each, the
    second fed the first's tape, writes the same records."""
    import yaml

    from raco_cli.data.describe import describe
    from raco_cli.data.fixtures import people_frame
    from raco_cli.run import prepare

    frame = people_frame(900, seed=7).assign(flag="x")  # issue 59's type flip: one value, or two with the odd row
    conf = tmp_path / "conf" / "dataset"
    conf.mkdir(parents=True)
    csv = tmp_path / "people.csv"
    frame.to_csv(csv, index=False)
    (conf / "people.yaml").write_text(describe(str(csv), label="approved", sensitive=["sex"])[0])  # (the YAML, its notes)
    overrides = ["--config-dir", str(tmp_path / "conf"), "dataset=people", "method.batch_size=100", "method.max_steps=30",
                 "method.eval_every=5", "constraint.confidence=null", "eps=4", "privacy.size_noise_multiplier=10",
                 "dataset.estimate_noise_multiplier=2"]
    cfg = _config(tmp_path, overrides, dataset=[])
    column, value = kind.split("=")

    def train_rows(rows) -> np.ndarray:  # the file rows the loader puts in train (its own split, as the run makes it)
        rows.to_csv(csv, index=False)
        prepare._DATA_CACHE.clear()
        data = _load(cfg)
        return data.meta["file_rows"][data.splits["train"]]

    if column == "flag":  # the first row that lands in train once it holds the odd value
        odd = lambda r: frame.assign(flag=np.where(np.arange(len(frame)) == r, "y", "x"))  # noqa: E731
        row = next(r for r in range(len(frame)) if r in train_rows(odd(r)))
        frame.loc[row, "flag"] = "y"
    else:
        row = next(r for r in train_rows(frame) if frame.iloc[r][column] == value)
    frame.to_csv(csv, index=False)
    described = describe(str(csv), label="approved", sensitive=["sex"])[0]
    (conf / "people.yaml").write_text(described)
    assert "flag: private" in described

    prepare._DATA_CACHE.clear()
    with releases.recording() as tape:
        first = _train_one(monkeypatch, tmp_path, "D", cfg)
    frame.drop(index=row).to_csv(csv, index=False)  # the neighbouring file, at the same path
    strip = lambda text: yaml.safe_load(text)  # noqa: E731 - describe's comments show the file's values: not a record
    assert strip(describe(str(csv), label="approved", sensitive=["sex"])[0]) == strip(described)
    prepare._DATA_CACHE.clear()
    with releases.replaying(tape):
        second = _train_one(monkeypatch, tmp_path, "D_prime", cfg)
    prepare._DATA_CACHE.clear()
    assert first["summary"]["privacy_scope"] == "model"
    assert_same_records(first, second)
