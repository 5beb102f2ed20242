"""Image datasets on generated files in the exact upstream formats, the -ST constructions,
scikit-learn's digits, and the imbalanced variants."""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest

from raco_cli import data
from raco_cli.data import cifar10, digits, image_fixtures, images, imbalance, mnist, sources
from raco_cli.errors import ConfigError, DataIntegrityError, DataNotFoundError


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("image_mirror")
    image_fixtures.write_mnist(root, n_train=400, n_test=150)
    image_fixtures.write_mnist(root, dataset="fashion_mnist", n_train=300, n_test=100, seed=1)
    image_fixtures.write_cifar10(root, per_batch=60)
    return root


def load(name, mirror, tmp_path, **options):
    return data.load(name, data_dir=tmp_path / "cache", mirror=str(mirror), allow_download=False,
                     options={"verify_checksums": False, **options})


def test_mnist_reads_the_idx_files(mirror, tmp_path):
    d = load("mnist", mirror, tmp_path)
    raw = gzip.decompress((mirror / "mnist" / "train-images-idx3-ubyte.gz").read_bytes())
    pixels = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(400, 28, 28)
    labels = np.frombuffer(gzip.decompress((mirror / "mnist" / "train-labels-idx1-ubyte.gz").read_bytes()), dtype=np.uint8, offset=8)
    assert d.input_shape == (1, 28, 28) and d.n_classes == 10 and d.class_names[3] == "3"
    assert len(d.splits["test"]) == 150 and len(d.splits["train"]) + len(d.splits["val"]) == 400
    assert abs(len(d.splits["val"]) - 60) <= 1  # 15 % of the official training set
    first = d.splits["train"][0]  # rows keep the file order: train rows first
    np.testing.assert_allclose(d.rows(np.array([first]))[0, 0], pixels[first] / 255.0, atol=1e-7)
    assert d.y[first] == labels[first] and d.group[first] == labels[first]
    f = load("fashion_mnist", mirror, tmp_path)
    assert f.class_names[9] == "Ankle boot" and len(f.splits["test"]) == 100


def test_mnist_st_is_imbalanced_with_a_balanced_test(mirror, tmp_path):
    d = load("mnist", mirror, tmp_path, st=True, imratio=0.2)
    pool = np.concatenate([d.splits["train"], d.splits["val"]])
    assert d.class_names == ("0-4", "5-9")
    assert float(d.y[pool].mean()) == pytest.approx(0.2, abs=0.01)
    test = d.y[d.splits["test"]]
    assert test.sum() * 2 == len(test)  # balanced: imratio 0.5
    assert set(np.unique(d.group)) == set(range(10)) and np.all(d.y == (d.group >= 5))


def test_digits_is_real_data_and_digits_st_follows_the_construction():
    d = digits.load()
    assert len(d.y) == 1797 and d.input_shape == (1, 8, 8) and d.rows(np.arange(5)).max() <= 1.0
    st = digits.load(st=True, imratio=0.1)
    pool = np.concatenate([st.splits["train"], st.splits["val"]])
    assert float(st.y[pool].mean()) == pytest.approx(0.1, abs=0.01)
    assert st.y[st.splits["test"]].mean() == 0.5
    np.testing.assert_array_equal(st.y, (st.group >= 5).astype(int))
    again = digits.load(st=True, imratio=0.1)
    np.testing.assert_array_equal(again.splits["train"], st.splits["train"])  # seeded by split_seed


def test_cifar10_batches_and_cifar10_st(mirror, tmp_path, monkeypatch):
    d = load("cifar10", mirror, tmp_path)
    batch = pickle.loads((mirror / "cifar10" / "cifar-10-batches-py" / "data_batch_1").read_bytes(), encoding="bytes")
    assert d.input_shape == (3, 32, 32) and len(d.splits["test"]) == 60 and d.class_names[0] == "airplane"
    np.testing.assert_allclose(d.rows(np.array([0]))[0], batch[b"data"][0].reshape(3, 32, 32) / 255.0, atol=1e-7)
    monkeypatch.setattr(cifar10, "ST_KEEP", 5)  # the fixture has ~30 images per class
    st = load("cifar10", mirror, tmp_path, st=True)
    pool = np.concatenate([st.splits["train"], st.splits["val"]])
    counts = np.bincount(st.y[pool], minlength=10)
    assert all(counts[:5] == 5) and all(counts[5:] == np.bincount(d.y[np.concatenate([d.splits["train"], d.splits["val"]])], minlength=10)[5:])
    assert len(st.splits["test"]) == 60  # test unchanged


def test_published_checksums_are_checked(mirror, tmp_path):
    with pytest.raises(DataIntegrityError, match=r"Checksum mismatch for .*train-images-idx3-ubyte\.gz: expected md5 f68b3c2dcbeaaa9fbdd348bbdeb94873"):
        data.load("mnist", data_dir=tmp_path, mirror=str(mirror), allow_download=False)
    with pytest.raises(DataIntegrityError, match=r"Checksum mismatch for .*data_batch_1: expected md5 c99cafc152244af753f735de768cd75f"):
        data.load("cifar10", data_dir=tmp_path, mirror=str(mirror), allow_download=False)
    spec = sources.RemoteFile("x.gz", archive_md5="0" * 32)  # an uncompressed copy cannot be verified
    (tmp_path / "x.gz").write_bytes(b"plain")
    with pytest.raises(DataIntegrityError, match="is not the published gzip archive"):
        sources.verify("mnist", spec, tmp_path / "x.gz")


def test_bad_files_and_missing_files(tmp_path):
    with pytest.raises(DataIntegrityError, match=r"magic number 0x00000801, expected 0x00000803"):
        mnist.parse_idx(image_fixtures.idx_bytes(np.zeros(30)) + bytes(8), dims=3, path="p", dataset="mnist")
    with pytest.raises(DataIntegrityError, match="header says 4 values, the file has 3"):
        mnist.parse_idx(image_fixtures.idx_bytes(np.zeros((2, 2)))[:-1], dims=2, path="p", dataset="mnist")
    evil = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": pickle.loads}, protocol=2)
    with pytest.raises(DataIntegrityError, match="is not a valid CIFAR-10 python batch"):
        cifar10.parse_batch(evil, path="p")
    with pytest.raises(DataNotFoundError) as info:
        data.load("cifar10", data_dir=tmp_path, mirror=None, allow_download=False)
    assert "curl -L https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz | tar xz -C datasets/cifar10" in str(info.value)
    with pytest.raises(DataNotFoundError, match=r"Missing data file .*mnist/train-images-idx3-ubyte\.gz\. Download it with: make data DATASET=mnist"):
        data.load("mnist", data_dir=tmp_path, mirror=None, allow_download=False)


def test_option_messages():
    with pytest.raises(ConfigError) as info:
        digits.load(st=True, imratio=0.7)
    assert str(info.value) == ("dataset.options.imratio must be in (0, 0.5] (got dataset.options.imratio=0.7); "
                               "the fraction of positives (classes 5-9) kept in the training pool.")
    with pytest.raises(ConfigError, match=r"^dataset.options.st must be true or false"):
        digits.load(st="yes")


def test_imbalanced_variants_keep_the_test_split():
    from raco_cli.data import synthetic

    d = synthetic.load(n=3000, seed=0)
    g = imbalance.imbalanced(d, {"group_ratio": 0.1}, seed=0)
    train = g.splits["train"]
    assert float((g.group[train] == 1).mean()) == pytest.approx(0.1, abs=0.01)
    np.testing.assert_array_equal(g.splits["test"], d.splits["test"])
    assert imbalance.imbalanced(d, {}) is d
    with pytest.raises(ConfigError, match=r"^Unknown key dataset.imbalance.ratio"):
        imbalance.check({"ratio": 0.1})
    with pytest.raises(ConfigError, match=r"^dataset.imbalance.minority_group=5 is not a group"):
        imbalance.imbalanced(d, {"group_ratio": 0.2, "minority_group": 5})


def test_pixel_store_is_lazy_float():
    store = images.PixelStore(np.full((3, 1, 2, 2), 255, np.uint8))
    assert store[np.array([0, 2])].dtype == np.float32 and store[np.array([1])].max() == 1.0 and len(store) == 3
