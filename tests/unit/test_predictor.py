"""The self-contained predictor: it encodes new rows bit for bit as training did (public
encoding + the DP standardisation, missing values at the DP mean), survives a save/load,
and is found in a run directory, its model/ folder or the artifact folder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raco_cli import models
from raco_cli.data import table
from raco_cli.data.fixtures import people_frame
from raco_cli.errors import DataNotFoundError
from raco_cli.predictor import Predictor, find
from raco_cli.privacy.preprocessing import dp_standardize

LEVELS = {"approved": ["no", "yes"], "sex": ["F", "M"], "city": ["Paris", "Lyon", "Nice"], "smoker": ["no", "yes"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "people.csv"
    df = people_frame(400, seed=1)
    df.to_csv(path, index=False)
    data = table.load(path=str(path), label="approved", sensitive="sex", types={"id": "drop"}, levels=LEVELS,
                      missing_indicator=["income"], preprocessing="public", bounds={"age": [18, 100], "income": [0, 200000]})
    data = dp_standardize(data, noise_multiplier=5.0, source=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    net = models.build("mlp", input_shape=data.input_shape, n_classes=2, options={"hidden": [8]})
    return df, data, net


def test_new_rows_are_encoded_exactly_as_the_training_rows(trained, tmp_path):
    df, data, net = trained
    pred = Predictor.from_run(data, model={"name": "mlp", "hidden": [8]}, state_dict=net.state_dict(), micro_batch=64, run={"method": "x"})
    again = Predictor.load(pred.save(tmp_path / "artifact"))
    rows = df.iloc[data.meta["file_rows"]]
    X, counts = again.features(rows)
    assert np.array_equal(X, data.X)  # bit for bit, DP scaling and DP-mean imputation included
    missing = data.meta["numeric_missing"][:, 1]
    assert missing.any() and (X[missing, 1] == 0.0).all()
    assert counts["income"]["missing"] == int(missing.sum()) and counts["city"]["unknown"] == int((rows["city"] == "Lille").sum())
    with torch.no_grad():
        ref = net(torch.from_numpy(data.X)).double().numpy()
    out = again.predict(rows)
    assert (out.frame["predicted"].to_numpy() == np.array(["no", "yes"], dtype=object)[ref.argmax(axis=1)]).all()
    assert out.accuracy == float((ref.argmax(axis=1) == data.y).mean()) and out.labelled == len(rows)


def test_find_accepts_the_three_layouts_and_explains_what_is_missing(trained, tmp_path):
    _, data, net = trained
    pred = Predictor.from_run(data, model={"name": "mlp", "hidden": [8]}, state_dict=net.state_dict(), micro_batch=64, run={})
    art = pred.save(tmp_path / "run" / "model" / "artifacts" / "predictor")
    for p in (tmp_path / "run", tmp_path / "run" / "model", art):
        assert find(p) == art
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "summary.json").write_text('{"dataset": "credit"}')
    with pytest.raises(DataNotFoundError, match="is a run of dataset=credit, which keeps no predictor artifact"):
        find(tmp_path / "other")
    with pytest.raises(DataNotFoundError, match="No raco model in"):
        find(tmp_path)
