"""File lookup and verification: alternatives, MD5, content checks, folders, manual-only files."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from raco_cli.data import sources
from raco_cli.errors import DataIntegrityError, DataNotFoundError

CONTENT = b"a,b\n1,2\n"
SHA = hashlib.sha256(CONTENT).hexdigest()
MD5 = hashlib.md5(CONTENT).hexdigest()


def write(path: Path, content: bytes = CONTENT, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        content = gzip.compress(content)
    path.write_bytes(content)
    return path


def test_cache_before_mirror_and_gzip_accepted(tmp_path):
    spec = sources.RemoteFile("f.csv", sha256=SHA)
    write(tmp_path / "mirror" / "ds" / "f.csv", gz=True)
    form, stream, path = sources.open_any("ds", spec, data_dir=tmp_path / "cache", mirror=str(tmp_path / "mirror"), allow_download=False)
    assert path == tmp_path / "mirror" / "ds" / "f.csv.gz" and stream.read() == CONTENT and form is spec
    write(tmp_path / "cache" / "ds" / "f.csv")
    _, _, path = sources.open_any("ds", spec, data_dir=tmp_path / "cache", mirror=str(tmp_path / "mirror"), allow_download=False)
    assert path == tmp_path / "cache" / "ds" / "f.csv"


def test_alternative_form_is_used_and_verified(tmp_path):
    alt = sources.RemoteFile("f.csv", sha256=SHA)
    spec = sources.RemoteFile("f.xls", urls=("http://invalid.example/f.xls",), alternatives=(alt,))
    write(tmp_path / "ds" / "f.csv")
    form, stream, _ = sources.open_any("ds", spec, data_dir=tmp_path, allow_download=False)
    assert form is alt and stream.read() == CONTENT
    write(tmp_path / "ds" / "f.csv", CONTENT[:-2])
    with pytest.raises(DataIntegrityError, match="Checksum mismatch .*f.csv: expected sha256"):
        sources.open_any("ds", spec, data_dir=tmp_path, allow_download=False)


def test_md5_and_content_check(tmp_path):
    path = write(tmp_path / "ds" / "f.txt")
    assert sources.verify("ds", sources.RemoteFile("f.txt", md5=MD5), path) == CONTENT
    with pytest.raises(DataIntegrityError) as info:
        sources.verify("ds", sources.RemoteFile("f.txt", md5="0" * 32), path)
    assert str(info.value) == (
        f"Checksum mismatch for {path}: expected md5 {'0' * 32}, got {MD5}. The file is corrupted "
        "or truncated; delete it and fetch it again with: make data DATASET=ds"
    )

    def check(content: bytes) -> None:
        raise DataIntegrityError("bad table")

    with pytest.raises(DataIntegrityError, match="bad table"):
        sources.verify("ds", sources.RemoteFile("f.txt", check=check), path)


def test_folder_and_nested_names(tmp_path):
    spec = sources.RemoteFile("2018/1-Year/p.csv", folder="acs")
    write(tmp_path / "acs" / "2018" / "1-Year" / "p.csv")
    assert sources.locate("acs_employment", spec, data_dir=tmp_path) == tmp_path / "acs" / "2018" / "1-Year" / "p.csv"


def test_missing_messages(tmp_path):
    spec = sources.RemoteFile("f.csv", urls=("http://invalid.example/f.csv",))
    with pytest.raises(DataNotFoundError) as info:
        sources.open_any("ds", spec, data_dir=tmp_path, allow_download=False)
    assert str(info.value) == f"Missing data file {tmp_path / 'ds' / 'f.csv'}. Download it with: make data DATASET=ds"
    manual = sources.RemoteFile("f.csv", manual_hint="Place it by hand.")
    for allow in (True, False):  # nothing to download: the manual steps, never a network call
        with pytest.raises(DataNotFoundError) as info:
            sources.open_any("ds", manual, data_dir=tmp_path, allow_download=allow)
        assert str(info.value) == f"Missing data file {tmp_path / 'ds' / 'f.csv'}. Place it by hand."


def test_directories(tmp_path):
    spec = sources.RemoteFile("imgs", is_dir=True)
    assert sources.locate("ds", spec, data_dir=tmp_path) is None
    (tmp_path / "ds" / "imgs").mkdir(parents=True)
    path = sources.locate("ds", spec, data_dir=tmp_path)
    with pytest.raises(DataIntegrityError, match="is empty"):
        sources.verify("ds", spec, path)
    (path / "1.jpg").write_bytes(b"x")
    assert sources.verify("ds", spec, path) == b""


def test_fetch_copies_decompressed_from_mirror(tmp_path):
    spec = sources.RemoteFile("f.csv", sha256=SHA)
    write(tmp_path / "mirror" / "ds" / "f.csv", gz=True)
    (out,) = sources.fetch("ds", [spec], data_dir=tmp_path / "cache", mirror=str(tmp_path / "mirror"))
    assert out == tmp_path / "cache" / "ds" / "f.csv" and out.read_bytes() == CONTENT
