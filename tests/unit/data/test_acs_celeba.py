"""ACSEmployment and CelebA loaders on generated files in the exact upstream layouts."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from raco_cli import data
from raco_cli.data import acs, celeba, fixtures
from raco_cli.errors import ConfigError, DataIntegrityError, DataNotFoundError

# --- ACSEmployment ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acs_mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    fixtures.write_acs(root, n=900)
    return root


@pytest.fixture(scope="module")
def acs_data(acs_mirror, tmp_path_factory):
    return data.load("acs_employment", data_dir=tmp_path_factory.mktemp("cache"), mirror=str(acs_mirror), allow_download=False)


def test_acs_fixture_is_the_upstream_layout(acs_mirror):
    from folktables import ACSDataSource, ACSEmployment

    path = acs_mirror / "acs" / "2018" / "1-Year" / "psam_p01.csv"
    header = path.read_text().splitlines()[0].split(",")
    assert set(acs.REQUIRED) <= set(header) and header[:2] == ["RT", "SERIALNO"]
    raw = ACSDataSource(survey_year="2018", horizon="1-Year", survey="person", root_dir=str(acs_mirror / "acs")).get_data(states=["AL"])
    X, y, g = ACSEmployment.df_to_numpy(raw)
    assert X.shape == (900, 16) and set(np.unique(g)) == set(range(1, 10))
    assert raw["ESR"].isna().any()  # N/A for persons under 16, as upstream


def test_acs_definitions(acs_data, acs_mirror):
    from folktables import ACSDataSource, ACSEmployment

    d = acs_data
    raw = ACSDataSource(survey_year="2018", horizon="1-Year", survey="person", root_dir=str(acs_mirror / "acs")).get_data(states=["AL"])
    _, label, rac1p = ACSEmployment.df_to_numpy(raw)
    np.testing.assert_array_equal(d.y, label.astype(int))  # ESR == 1
    np.testing.assert_array_equal(d.group, rac1p.astype(int) - 1)
    assert d.n_groups == 9 and d.group_names[0] == "White" and d.group_names[8] == "Two or more races"
    assert d.n_features == 66 and d.feature_names[:2] == ("AGEP", "SCHL")
    assert not any(n.startswith("RAC1P") for n in d.feature_names)
    for col, vocab in acs.VOCAB.items():  # one-hot blocks over the fixed vocabularies
        assert [n for n in d.feature_names if n.startswith(col + "=")] == [f"{col}={v}" for v in vocab]
    train = d.X[d.splits["train"]][:, :2]
    np.testing.assert_allclose(train.mean(0), 0.0, atol=1e-5)
    assert abs(len(d.splits["test"]) - 0.25 * 900) <= 2


def test_acs_options(acs_mirror, tmp_path):
    d = data.load("acs_employment", data_dir=tmp_path, mirror=str(acs_mirror), options={"sensitive_as_feature": True})
    assert d.n_features == 75 and "RAC1P=9" in d.feature_names
    with pytest.raises(ConfigError) as info:
        data.load("acs_employment", data_dir=tmp_path, mirror=str(acs_mirror), options={"horizon": "3-Year"})
    assert str(info.value) == (
        "dataset.options.horizon must be one of 1-Year, 5-Year (got dataset.options.horizon='3-Year'); "
        "the ACS sample (the paper used 5-Year)."
    )
    with pytest.raises(ConfigError, match="dataset.options.states must be a non-empty list"):
        data.load("acs_employment", data_dir=tmp_path, mirror=str(acs_mirror), options={"states": ["XX"]})


def test_acs_missing_file_names_the_fetch_command(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        acs.load(data_dir=tmp_path, mirror=None, allow_download=False)
    assert str(info.value) == (
        f"Missing data file {tmp_path / 'acs' / '2018' / '1-Year' / 'psam_p01.csv'}. "
        "Download it with: make data DATASET=acs_employment"
    )
    with pytest.raises(DataNotFoundError) as info:
        acs.load(data_dir=tmp_path, mirror=None, allow_download=False, year=2018, horizon="5-Year", states=["AL", "GA"])
    assert str(info.value) == (
        f"Missing data file {tmp_path / 'acs' / '2018' / '5-Year' / 'psam_p01.csv'}. Download it with: "
        "raco data fetch acs_employment -o year=2018 -o horizon=5-Year -o states=[AL,GA]"
    )


def test_acs_file_without_needed_column_is_rejected(tmp_path):
    path = fixtures.write_acs(tmp_path, n=50)
    df = pd.read_csv(path, dtype=str).drop(columns=["MIL"])
    df.to_csv(path, index=False)
    with pytest.raises(DataIntegrityError, match=r"is not a valid 'acs_employment' file: missing columns \['MIL'\]"):
        acs.load(data_dir=tmp_path, mirror=None, allow_download=False)


# --- CelebA ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def celeba_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("celeba_mirror")
    fixtures.write_celeba(root, n=60)
    return root


def load_celeba(root, **options):
    opts = {"verify_checksums": False, "image_size": 16, **options}
    return data.load("celeba", data_dir=root / "no-cache", mirror=str(root), options=opts)


def test_celeba_official_splits_labels_groups(celeba_root):
    d = load_celeba(celeba_root)
    lines = (celeba_root / "celeba" / "list_attr_celeba.txt").read_text().splitlines()[2:]
    values = np.array([[int(v) for v in line.split()[1:]] for line in lines])
    np.testing.assert_array_equal(d.y, (values[:, celeba.ATTRIBUTES.index("Smiling")] + 1) // 2)
    np.testing.assert_array_equal(d.group, (values[:, celeba.ATTRIBUTES.index("Male")] + 1) // 2)
    assert d.group_names == ("Female", "Male") and d.class_names == ("not Smiling", "Smiling")
    parts = [int(line.split()[1]) for line in (celeba_root / "celeba" / "list_eval_partition.txt").read_text().splitlines()]
    for code, split in ((0, "train"), (1, "val"), (2, "test")):
        np.testing.assert_array_equal(d.splits[split], np.flatnonzero(np.array(parts) == code))
    swapped = load_celeba(celeba_root, target="Male", sensitive="Smiling")  # the reference code's roles
    np.testing.assert_array_equal(swapped.y, d.group)
    assert swapped.group_names == ("not Smiling", "Smiling")


def test_celeba_store_decodes_lazily(celeba_root):
    d = load_celeba(celeba_root, image_size=16, cache_size=4)
    store = d.X
    assert isinstance(store, celeba.ImageFolderStore) and store.shape == (60, 3, 16, 16) and len(store) == 60
    assert len(store._cache) == 0  # nothing decoded at load
    batch = d.rows(np.array([0, 5, 59]))
    assert batch.shape == (3, 3, 16, 16) and batch.dtype == np.float32
    assert 0.0 <= batch.min() and batch.max() <= 1.0
    assert len(store._cache) == 3
    ref = Image.open(celeba_root / "celeba" / "img_align_celeba" / "000006.jpg").convert("RGB").resize((16, 16), Image.Resampling.BILINEAR)
    np.testing.assert_allclose(batch[1], np.asarray(ref, np.float32).transpose(2, 0, 1) / 255, atol=1e-6)
    store[np.arange(10)]
    assert len(store._cache) == 4  # LRU bound
    np.testing.assert_array_equal(store[2], store[np.array([2])][0])
    assert store[0:4].shape == (4, 3, 16, 16)
    clone = pickle.loads(pickle.dumps(store))  # DataLoader workers get paths, not pixels
    assert len(clone._cache) == 0 and np.array_equal(clone[7], store[7])
    small = d.subset(5)
    assert small.X.shape == (15, 3, 16, 16) and small.rows(np.array([0])).shape == (1, 3, 16, 16)


def test_celeba_default_size_is_128(celeba_root):
    d = load_celeba(celeba_root, image_size=128)
    assert d.input_shape == (3, 128, 128) and d.rows(np.array([0])).shape == (1, 3, 128, 128)
    assert data.get("celeba").loader().load.__kwdefaults__["image_size"] == 128


def test_celeba_checksums_and_bad_files(celeba_root, tmp_path):
    with pytest.raises(DataIntegrityError, match=r"Checksum mismatch for .*list_attr_celeba\.txt: expected md5 75e246fa4810816ffd6ee81facbd244c"):
        data.load("celeba", data_dir=tmp_path, mirror=str(celeba_root), options={"image_size": 16})
    root = tmp_path / "m"
    fixtures.write_celeba(root, n=12)
    attr = root / "celeba" / "list_attr_celeba.txt"
    attr.write_text("\n".join(attr.read_text().splitlines()[:-3]))  # truncated
    with pytest.raises(DataIntegrityError, match="announces 12 images of 40 attributes but has 9 well-formed rows"):
        load_celeba(root)
    fixtures.write_celeba(root, n=12)
    (root / "celeba" / "img_align_celeba" / "000003.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    d = load_celeba(root)
    with pytest.raises(DataIntegrityError, match=r"Cannot decode image .*000003\.jpg"):
        d.rows(np.array([2]))


def test_celeba_missing_files_explain_manual_download(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        data.load("celeba", data_dir=tmp_path, mirror=None)
    assert str(info.value) == f"Missing data file {tmp_path / 'celeba' / 'list_attr_celeba.txt'}. {celeba.MANUAL}"
    assert celeba.MANUAL.startswith("CelebA is distributed through Google Drive")


def test_celeba_bad_options(celeba_root):
    with pytest.raises(ConfigError, match=r"dataset.options.target must be one of 5_o_Clock_Shadow, .* \(got dataset.options.target='Smile'\)"):
        load_celeba(celeba_root, target="Smile")
    with pytest.raises(ConfigError, match=r"dataset.options.image_size must be an integer in \[8, 512\]"):
        load_celeba(celeba_root, image_size=4)
