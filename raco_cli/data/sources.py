"""Finding, verifying and downloading raw dataset files.

A file is looked up, in order, in

1. the download cache ``<data_dir>/<dataset>/`` (``datasets/`` of the project by default),
2. the mirror ``$RACO_DATA_MIRROR/<dataset>/`` (a directory laid out like the cache, e.g. an
   offline copy on a cluster),

each time under its upstream name or with ``.gz`` appended. When it is in neither place and
downloads are allowed, it is fetched from its upstream URL into the cache. Every file with
a known checksum is verified (sha256 of the *uncompressed* content) before it is used, so a
truncated or corrupted copy is never read silently.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from raco_cli.errors import CHECKSUM, MISSING_DATA, DataIntegrityError, DataNotFoundError

log = logging.getLogger(__name__)

MIRROR_ENV = "RACO_DATA_MIRROR"
DOWNLOAD_TIMEOUT_S = 60


@dataclass(frozen=True)
class RemoteFile:
    """One upstream file of a dataset.

    Attributes:
        name: upstream file name, also its name in the cache and in mirrors.
        urls: where to download it from, tried in order (empty: manual placement only).
        sha256: sha256 of the uncompressed content, or None when no checksum is known.
        manual_hint: what to tell the user when the file cannot be downloaded automatically.
    """

    name: str
    urls: tuple[str, ...] = ()
    sha256: str | None = None
    manual_hint: str = ""


def fetch_command(dataset: str) -> str:
    """The shell command that downloads a dataset (quoted verbatim in error messages)."""
    return f"make data DATASET={dataset}"


def candidates(dataset: str, name: str, *, data_dir: Path, mirror: str | None) -> list[Path]:
    """Paths where a file may be found, in lookup order."""
    roots = [Path(data_dir) / dataset]
    if mirror:
        roots.append(Path(mirror) / dataset)
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


def locate(
    dataset: str,
    spec: RemoteFile,
    *,
    data_dir: Path,
    mirror: str | None = None,
) -> Path | None:
    """First existing candidate path of a file, or None."""
    for path in candidates(dataset, spec.name, data_dir=data_dir, mirror=mirror):
        if path.is_file():
            return path
    return None


def verify(dataset: str, spec: RemoteFile, path: Path) -> bytes:
    """Read a file and check its content checksum; return the uncompressed content.

    Raises:
        DataIntegrityError: the checksum does not match (truncated, corrupted, wrong file).
    """
    content = read_bytes(path)
    if spec.sha256 is not None:
        actual = sha256(content)
        if actual != spec.sha256:
            raise DataIntegrityError(
                CHECKSUM.format(
                    path=path, expected=spec.sha256, actual=actual, command=fetch_command(dataset)
                )
            )
    return content


def download(dataset: str, spec: RemoteFile, *, data_dir: Path) -> Path:
    """Download a file into the cache, verify it, and move it into place atomically.

    The file is written to a temporary name first, so an interrupted or corrupted
    download never leaves a file that a later run would pick up.

    Raises:
        DataNotFoundError: no URL worked (offline, moved upstream, manual-only file).
        DataIntegrityError: the download does not match the known checksum.
    """
    target_dir = Path(data_dir) / dataset
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
        content = gzip.decompress(payload) if payload[:2] == b"\x1f\x8b" else payload
        if spec.sha256 is not None and sha256(content) != spec.sha256:
            raise DataIntegrityError(
                CHECKSUM.format(
                    path=url,
                    expected=spec.sha256,
                    actual=sha256(content),
                    command=fetch_command(dataset),
                )
            )
        target_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target_dir, delete=False, suffix=".part") as tmp:
            tmp.write(content)
        os.replace(tmp.name, target)
        return target
    hint = spec.manual_hint or (
        f"or place {spec.name} in {target_dir}/ or in $RACO_DATA_MIRROR/{dataset}/"
    )
    detail = "; ".join(errors) if errors else "no download URL"
    raise DataNotFoundError(
        MISSING_DATA.format(path=target, command=fetch_command(dataset))
        + f" ({hint}; download failed: {detail})"
    )


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
    path = locate(dataset, spec, data_dir=data_dir, mirror=mirror)
    if path is None:
        if not allow_download:
            raise DataNotFoundError(
                MISSING_DATA.format(
                    path=Path(data_dir) / dataset / spec.name, command=fetch_command(dataset)
                )
            )
        path = download(dataset, spec, data_dir=data_dir)
    return io.BytesIO(verify(dataset, spec, path)), path


def fetch(
    dataset: str,
    specs: Sequence[RemoteFile],
    *,
    data_dir: Path,
    mirror: str | None = None,
) -> list[Path]:
    """Make every file of a dataset present and verified in the cache.

    Files found in a mirror are copied (decompressed content, verified) into the cache,
    so the cache is self-contained afterwards.
    """
    out = []
    for spec in specs:
        cached = locate(dataset, spec, data_dir=data_dir, mirror=None)
        if cached is not None:
            verify(dataset, spec, cached)
            out.append(cached)
            continue
        mirrored = locate(dataset, spec, data_dir=data_dir, mirror=mirror) if mirror else None
        if mirrored is not None:
            verify(dataset, spec, mirrored)
            target = Path(data_dir) / dataset / mirrored.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(mirrored, target)
            out.append(target)
            continue
        out.append(download(dataset, spec, data_dir=data_dir))
    return out
