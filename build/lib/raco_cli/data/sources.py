"""Finding, verifying and downloading raw dataset files.

A file is looked up, in order, in

1. the download cache ``<data_dir>/<folder>/`` (``datasets/`` of the project by default),
2. the mirror ``$RACO_DATA_MIRROR/<folder>/`` (a directory laid out like the cache, e.g. an
   offline copy on a cluster),

each time under its upstream name or with ``.gz`` appended (``<folder>`` is the dataset name
unless the file says otherwise, e.g. ``acs`` for folktables' own layout).  A file may accept
*alternatives*: other forms of the same content (the CSV conversion of an ``.xls``); the
first form found wins, the cache before the mirror.  When a file is in neither place and
downloads are allowed, it is fetched from its upstream URL into the cache.  Every file is
verified before it is used: sha256 and/or MD5 of the *uncompressed* content when known, and
an optional content check (e.g. a digest of the parsed table, for formats whose bytes are
not pinned), so a truncated or corrupted copy is never read silently.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from raco_cli.errors import (
    CHECKSUM,
    MISSING_DATA,
    MISSING_MANUAL_DATA,
    DataIntegrityError,
    DataNotFoundError,
)

log = logging.getLogger(__name__)

MIRROR_ENV = "RACO_DATA_MIRROR"
DOWNLOAD_TIMEOUT_S = 60


@dataclass(frozen=True)
class RemoteFile:
    """One upstream file (or directory) of a dataset.

    Attributes:
        name: upstream file name, also its name in the cache and in mirrors (may contain
            ``/``, e.g. ``2018/1-Year/psam_p01.csv``).
        urls: where to download it from, tried in order (empty: manual placement only).
        sha256: sha256 of the uncompressed content, or None when no checksum is known.
        md5: MD5 of the uncompressed content (the only checksum some publishers give).
        manual_hint: how to obtain the file by hand; for files without URLs it is the whole
            instruction shown when the file is missing.
        folder: directory under the data root / mirror (default: the dataset name).
        alternatives: other forms of the same content accepted in place of this file.
        check: content check run after the checksums; raises :class:`DataIntegrityError`.
        is_dir: a directory (e.g. a folder of images) that must exist and be non-empty;
            its content is checked by the loader when read.
        archive_md5: MD5 of the file *as published*, a gzip archive (MNIST's idx files are
            only checksummed compressed): checked on the stored bytes, so the copy is kept
            compressed in the cache.
    """

    name: str
    urls: tuple[str, ...] = ()
    sha256: str | None = None
    md5: str | None = None
    manual_hint: str = ""
    folder: str | None = None
    alternatives: tuple[RemoteFile, ...] = ()
    check: Callable[[bytes], None] | None = field(default=None, compare=False, repr=False)
    is_dir: bool = False
    archive_md5: str | None = None

    @property
    def verifiable(self) -> bool:
        """True when the content is checked against a pinned checksum or digest."""
        return bool(self.sha256 or self.md5 or self.check or self.archive_md5)

    def forms(self) -> tuple[RemoteFile, ...]:
        """This file and its alternatives, in preference order."""
        return (self, *self.alternatives)


def fetch_command(dataset: str) -> str:
    """The shell command that downloads a dataset (quoted verbatim in error messages)."""
    return f"make data DATASET={dataset}"


def _folder(dataset: str, spec: RemoteFile) -> str:
    return spec.folder or dataset


def candidates(
    dataset: str, name: str, *, data_dir: Path, mirror: str | None, folder: str | None = None
) -> list[Path]:
    """Paths where a file may be found, in lookup order."""
    roots = [Path(data_dir) / (folder or dataset)]
    if mirror:
        roots.append(Path(mirror) / (folder or dataset))
    return [root / n for root in roots for n in (name, name + ".gz")]


def mirror_from_env() -> str | None:
    """The mirror directory named by ``$RACO_DATA_MIRROR`` (None when unset or empty)."""
    value = os.environ.get(MIRROR_ENV, "").strip()
    return value or None


def read_bytes(path: Path) -> bytes:
    """Read a file, transparently decompressing gzip (by magic number, not by suffix)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataIntegrityError(
                f"Cannot decompress {path}: {exc}. The file is truncated or corrupted; delete it "
                "and fetch it again."
            ) from exc
    return raw


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


def _exists(path: Path, spec: RemoteFile) -> bool:
    return path.is_dir() if spec.is_dir else path.is_file()


def resolve(
    dataset: str,
    spec: RemoteFile,
    *,
    data_dir: Path,
    mirror: str | None = None,
) -> tuple[RemoteFile, Path] | None:
    """The first form of a file found (cache before mirror) and its path, or None."""
    roots: list[str | None] = [None] + ([mirror] if mirror else [])
    for root in roots:
        for form in spec.forms():
            names = (form.name,) if form.is_dir else (form.name, form.name + ".gz")
            base = Path(root) if root else Path(data_dir)
            for n in names:
                path = base / _folder(dataset, form) / n
                if _exists(path, form):
                    return form, path
    return None


def locate(
    dataset: str,
    spec: RemoteFile,
    *,
    data_dir: Path,
    mirror: str | None = None,
) -> Path | None:
    """First existing candidate path of a file (or of one of its alternatives), or None."""
    found = resolve(dataset, spec, data_dir=data_dir, mirror=mirror)
    return None if found is None else found[1]


def verify(dataset: str, spec: RemoteFile, path: Path) -> bytes:
    """Read a file and check its content; return the uncompressed content.

    Directories are only checked for being non-empty (``b""`` is returned).

    Raises:
        DataIntegrityError: a checksum or the content check fails (truncated, corrupted,
            wrong file).
    """
    if spec.is_dir:
        if not any(Path(path).iterdir()):
            raise DataIntegrityError(
                f"{path} is empty; fetch it again with: {fetch_command(dataset)}"
            )
        return b""
    if spec.archive_md5 is not None:
        _verify_archive(dataset, spec, path)
    content = read_bytes(path)
    for algo, expected, fn in (("sha256", spec.sha256, sha256), ("md5", spec.md5, md5)):
        if expected is not None:
            actual = fn(content)
            if actual != expected:
                raise DataIntegrityError(
                    CHECKSUM.format(
                        path=path, expected=expected, actual=actual, command=fetch_command(dataset)
                    ).replace("sha256", algo)
                )
    if spec.check is not None:
        spec.check(content)
    return content


def _verify_archive(dataset: str, spec: RemoteFile, path: Path) -> None:
    """The stored bytes must be the published gzip archive with the published MD5."""
    raw = Path(path).read_bytes()
    if raw[:2] != b"\x1f\x8b":
        raise DataIntegrityError(
            f"{path} is not the published gzip archive (its published MD5 is of the compressed file, so an "
            f"uncompressed copy cannot be verified); keep the .gz as downloaded, or fetch it again with: {fetch_command(dataset)}"
        )
    actual = md5(raw)
    if actual != spec.archive_md5:
        raise DataIntegrityError(
            CHECKSUM.format(path=path, expected=spec.archive_md5, actual=actual, command=fetch_command(dataset)).replace("sha256", "md5")
        )


def missing_error(dataset: str, spec: RemoteFile, *, data_dir: Path) -> DataNotFoundError:
    """The one-line error for a missing file: the fetch command, or the manual steps."""
    path = Path(data_dir) / _folder(dataset, spec) / spec.name
    if not spec.urls and spec.manual_hint:
        return DataNotFoundError(MISSING_MANUAL_DATA.format(path=path, hint=spec.manual_hint))
    return DataNotFoundError(MISSING_DATA.format(path=path, command=fetch_command(dataset)))


def download(dataset: str, spec: RemoteFile, *, data_dir: Path) -> Path:
    """Download a file into the cache, verify it, and move it into place atomically.

    The file is written to a temporary name first, so an interrupted or corrupted
    download never leaves a file that a later run would pick up.

    Raises:
        DataNotFoundError: no URL worked (offline, moved upstream, manual-only file).
        DataIntegrityError: the download does not match the known checksum.
    """
    if not spec.urls:
        raise missing_error(dataset, spec, data_dir=data_dir)
    target_dir = Path(data_dir) / _folder(dataset, spec)
    target = target_dir / spec.name
    errors = []
    for url in spec.urls:
        try:
            log.info("Downloading %s -> %s", url, target)
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                payload = response.read()
        except OSError as exc:  # URLError, timeouts, refused connections
            errors.append(f"{url}: {exc}")
            continue
        keep = spec.archive_md5 is not None  # the published archive is what is checksummed
        content = payload if keep or payload[:2] != b"\x1f\x8b" else gzip.decompress(payload)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".part") as tmp:
            tmp.write(content)
        try:
            verify(dataset, spec, Path(tmp.name))
        except DataIntegrityError as exc:
            os.unlink(tmp.name)
            raise DataIntegrityError(str(exc).replace(tmp.name, url)) from None
        os.chmod(tmp.name, 0o644)  # NamedTemporaryFile creates 0600
        os.replace(tmp.name, target)
        return target
    hint = spec.manual_hint or (
        f"or place {spec.name} in {target_dir}/ or in $RACO_DATA_MIRROR/{_folder(dataset, spec)}/"
    )
    detail = "; ".join(errors)
    raise DataNotFoundError(
        MISSING_DATA.format(path=target, command=fetch_command(dataset))
        + f" ({hint}; download failed: {detail})"
    )


def open_any(
    dataset: str,
    spec: RemoteFile,
    *,
    data_dir: Path,
    mirror: str | None = None,
    allow_download: bool = True,
) -> tuple[RemoteFile, io.BytesIO, Path]:
    """Find (or download) a file or one of its alternatives, verify it, return its content.

    Returns:
        The form found, its uncompressed content as a binary stream, and its path.

    Raises:
        DataNotFoundError: missing and not downloadable; the message names the fetch command
            (or, for files that cannot be downloaded automatically, the manual steps).
        DataIntegrityError: the file fails its checksum or content check.
    """
    found = resolve(dataset, spec, data_dir=data_dir, mirror=mirror)
    if found is None:
        if not allow_download or not any(f.urls for f in spec.forms()):
            raise missing_error(dataset, spec, data_dir=data_dir)
        form = next(f for f in spec.forms() if f.urls)
        found = form, download(dataset, form, data_dir=data_dir)
    form, path = found
    return form, io.BytesIO(verify(dataset, form, path)), path


def open_file(
    dataset: str,
    spec: RemoteFile,
    *,
    data_dir: Path,
    mirror: str | None = None,
    allow_download: bool = True,
) -> tuple[io.BytesIO, Path]:
    """Find (or download) a file, verify its checksum and return its content.

    Returns:
        The uncompressed content as a binary stream, and the path it was read from.

    Raises:
        DataNotFoundError: missing and not downloadable; the message names the fetch command.
        DataIntegrityError: the file fails its checksum.
    """
    _, stream, path = open_any(
        dataset, spec, data_dir=data_dir, mirror=mirror, allow_download=allow_download
    )
    return stream, path


def fetch(
    dataset: str,
    specs: Sequence[RemoteFile],
    *,
    data_dir: Path,
    mirror: str | None = None,
) -> list[Path]:
    """Make every file of a dataset present and verified in the cache.

    Files found in a mirror are copied (decompressed content, verified) into the cache,
    so the cache is self-contained afterwards.  Directories found in a mirror are verified
    and used in place (they can be large, e.g. 200k images).
    """
    out = []
    for spec in specs:
        cached = resolve(dataset, spec, data_dir=data_dir, mirror=None)
        if cached is not None:
            verify(dataset, *cached)
            out.append(cached[1])
            continue
        mirrored = resolve(dataset, spec, data_dir=data_dir, mirror=mirror) if mirror else None
        if mirrored is not None:
            form, path = mirrored
            content = verify(dataset, form, path)
            if form.is_dir:
                out.append(path)
                continue
            if form.archive_md5 is not None:  # keep the verified archive itself
                content = Path(path).read_bytes()
            target = Path(data_dir) / _folder(dataset, form) / form.name
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".part") as tmp:
                tmp.write(content)
            os.chmod(tmp.name, 0o644)  # NamedTemporaryFile creates 0600
            os.replace(tmp.name, target)
            out.append(target)
            continue
        form = next((f for f in spec.forms() if f.urls), spec)
        out.append(download(dataset, form, data_dir=data_dir))
    return out

