"""CelebA aligned faces (Liu et al. 2015): a binary attribute, sensitive attribute Male.

Source (facts from the mirror README ``shared/datasets/README.md``, section CelebA; the images
are not mirrored: the CelebA agreement allows non-commercial research use only).  The
official files, in torchvision's layout ``<root>/celeba/``:

* ``img_align_celeba/000001.jpg ... 202599.jpg``: aligned, cropped JPEGs, 178 wide x 218 high;
* ``list_attr_celeba.txt``: line 1 the count, line 2 the 40 attribute names, then one line
  per image, ``000001.jpg`` and 40 values ``-1``/``1`` separated by one or more spaces;
  MD5 ``75e246fa...`` (the value torchvision checks);
* ``list_eval_partition.txt``: ``000001.jpg 0`` lines, 0 = train (162 770), 1 = valid
  (19 867), 2 = test (19 962); MD5 ``d32c9cbf...``.

They are downloaded from Google Drive by hand (see :data:`MANUAL`); the loader looks in
``datasets/celeba/`` and then in ``$RACO_DATA_MIRROR/celeba/``.

Definitions (``dataset.options``):

* ``target`` (default ``Smiling``): label 1 = the attribute is present (value 1);
* ``sensitive`` (default ``Male``): group 1 = present (``Male``), 0 = absent (``Female``).
  The RaCO-DP reference code swaps the two (label Male, sensitive Smiling); set
  ``target=Male sensitive=Smiling`` to reproduce it.
* ``image_size`` (default 128, as the reference): every image is resized to S x S (no crop,
  no aspect-preserving resize, like the reference's ``tf.image.resize``; Pillow's bilinear
  filter), scaled to [0, 1], channels first: one example is a float32 array (3, S, S).
* Splits: the official train/valid/test partition (named train/val/test here).  The
  shared 25 % / 15 % protocol of the tabular datasets does not apply, and
  ``dataset.split_seed`` is ignored.  No preprocessing statistic is fitted (pixels are
  only scaled), so no test image enters a training statistic.

Images are never loaded all at once (202 599 x 3 x 128 x 128 float32 would be 40 GB):
:class:`ImageFolderStore` decodes the JPEGs of the requested rows on demand.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raco_cli.data import sources
from raco_cli.data.types import SPLITS, TabularData
from raco_cli.errors import CHOICE, TYPE, ConfigError, DataIntegrityError

log = logging.getLogger(__name__)

ATTRIBUTES = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs",
    "Big_Lips", "Big_Nose", "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows",
    "Chubby", "Double_Chin", "Eyeglasses", "Goatee", "Gray_Hair", "Heavy_Makeup",
    "High_Cheekbones", "Male", "Mouth_Slightly_Open", "Mustache", "Narrow_Eyes", "No_Beard",
    "Oval_Face", "Pale_Skin", "Pointy_Nose", "Receding_Hairline", "Rosy_Cheeks", "Sideburns",
    "Smiling", "Straight_Hair", "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat",
    "Wearing_Lipstick", "Wearing_Necklace", "Wearing_Necktie", "Young",
)  # fmt: skip
PARTITION = {0: "train", 1: "val", 2: "test"}  # official codes: 0 train, 1 valid, 2 test
MANUAL = (
    "CelebA is distributed through Google Drive under a research-only agreement, so raco "
    "cannot download it: get img_align_celeba.zip, list_attr_celeba.txt and "
    "list_eval_partition.txt from http://mmlab.ie.cuhk.edu.hk/projects/CelebA.html, unzip the "
    "images, and put the three in datasets/celeba/ (or $RACO_DATA_MIRROR/celeba/): "
    "celeba/img_align_celeba/*.jpg, celeba/list_attr_celeba.txt, celeba/list_eval_partition.txt"
)
ATTR_FILE = sources.RemoteFile(
    "list_attr_celeba.txt", md5="75e246fa4810816ffd6ee81facbd244c", manual_hint=MANUAL
)
PARTITION_FILE = sources.RemoteFile(
    "list_eval_partition.txt", md5="d32c9cbf5e040fd4025c592c306e6668", manual_hint=MANUAL
)
IMAGE_DIR = sources.RemoteFile("img_align_celeba", is_dir=True, manual_hint=MANUAL)
FILES = (ATTR_FILE, PARTITION_FILE, IMAGE_DIR)


class ImageFolderStore:
    """Images on disk as a lazy, row-indexable feature store (the ``FeatureStore`` protocol).

    ``store[idx]`` decodes the JPEGs of the rows ``idx`` (an int array, a slice or an int)
    with Pillow, converts them to RGB, resizes them to ``image_size`` x ``image_size``
    (bilinear) and returns float32 values in [0, 1], channels first: shape
    ``(len(idx), 3, S, S)`` (``(3, S, S)`` for an int).  Nothing is decoded before it is
    asked for; the ``cache_size`` most recently decoded images are kept (LRU), which helps
    repeated evaluation of a small split, not Poisson-sampled training.

    The store holds only file paths, so it pickles cheaply (e.g. to DataLoader workers).

    Attributes:
        paths: one image file per row.
        image_size: S.
        shape: ``(n, 3, S, S)``.
    """

    def __init__(self, paths: Sequence[str | Path], image_size: int, cache_size: int = 256) -> None:
        self.paths = np.asarray([str(p) for p in paths])
        self.image_size = int(image_size)
        self.cache_size = int(cache_size)
        self.shape: tuple[int, ...] = (len(self.paths), 3, self.image_size, self.image_size)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int | slice | np.ndarray | Sequence[int]) -> np.ndarray:
        if isinstance(idx, (int, np.integer)):
            return self.image(int(idx))
        rows = np.arange(len(self))[idx] if isinstance(idx, slice) else np.asarray(idx, dtype=np.int64)
        out = np.empty((len(rows), 3, self.image_size, self.image_size), dtype=np.float32)
        for k, i in enumerate(rows.reshape(-1)):
            out[k] = self.image(int(i))
        return out

    def image(self, i: int) -> np.ndarray:
        """One decoded image, (3, S, S) float32 in [0, 1].

        Raises:
            DataIntegrityError: the file is missing, truncated or not an image.
        """
        if i < 0:
            i += len(self)
        cached = self._cache.get(i)
        if cached is not None:
            self._cache.move_to_end(i)
            return cached
        arr = decode(self.paths[i], self.image_size)
        if self.cache_size > 0:
            self._cache[i] = arr
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return arr

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": OrderedDict()}


def decode(path: str | Path, image_size: int) -> np.ndarray:
    """Decode one image file to (3, S, S) float32 in [0, 1] (RGB, bilinear resize)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as raw:
            im = raw.convert("RGB")
            if im.size != (image_size, image_size):
                im = im.resize((image_size, image_size), Image.Resampling.BILINEAR)
            arr = np.asarray(im, dtype=np.float32)
    except FileNotFoundError:
        raise DataIntegrityError(
            f"Missing image {path}; the image folder is incomplete. {MANUAL}"
        ) from None
    except (OSError, UnidentifiedImageError, SyntaxError) as exc:
        raise DataIntegrityError(
            f"Cannot decode image {path}: {exc}. The file is truncated or corrupted; replace it "
            "from img_align_celeba.zip."
        ) from exc
    return np.ascontiguousarray(arr.transpose(2, 0, 1) / 255.0, dtype=np.float32)


def parse_attributes(content: bytes) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    """``list_attr_celeba.txt`` -> (file names, attribute names, values in {0, 1} (n, 40)).

    Raises:
        DataIntegrityError: malformed file (count, header or row width).
    """
    lines = content.decode("ascii", errors="replace").splitlines()
    try:
        count = int(lines[0].strip())
    except (IndexError, ValueError):
        raise DataIntegrityError("list_attr_celeba.txt: line 1 must be the image count.") from None
    names = tuple(lines[1].split())
    rows = [line.split() for line in lines[2:] if line.strip()]
    if len(rows) != count or any(len(r) != len(names) + 1 for r in rows):
        raise DataIntegrityError(
            f"list_attr_celeba.txt announces {count} images of {len(names)} attributes but has "
            f"{len(rows)} well-formed rows; the file is truncated or corrupted."
        )
    files = np.asarray([r[0] for r in rows])
    raw = np.asarray([r[1:] for r in rows], dtype=np.int64)
    if not np.isin(raw, (-1, 1)).all():
        raise DataIntegrityError("list_attr_celeba.txt: attribute values must be -1 or 1.")
    return files, names, (raw + 1) // 2  # torchvision's mapping -1/1 -> 0/1


def parse_partition(content: bytes) -> dict[str, int]:
    """``list_eval_partition.txt`` -> file name -> partition code (0, 1, 2)."""
    out: dict[str, int] = {}
    for line in content.decode("ascii", errors="replace").splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or parts[1] not in ("0", "1", "2"):
            raise DataIntegrityError(f"list_eval_partition.txt: malformed line {line!r}.")
        out[parts[0]] = int(parts[1])
    return out


def fetch(*, data_dir: Path, mirror: str | None = None, verify_checksums: bool = True, **_: object) -> list[Path]:
    """Check that the files are in place (they cannot be downloaded automatically).

    Raises:
        DataNotFoundError: a file is missing; the message says how to obtain it.
        DataIntegrityError: a list file fails its MD5.
    """
    out = []
    for spec in FILES:
        spec = spec if verify_checksums else dataclasses.replace(spec, md5=None)
        path = sources.locate("celeba", spec, data_dir=data_dir, mirror=mirror)
        if path is None:
            raise sources.missing_error("celeba", spec, data_dir=data_dir)
        sources.verify("celeba", spec, path)
        out.append(path)
    return out


def _attribute(value: object, key: str, meaning: str) -> str:
    if value not in ATTRIBUTES:
        raise ConfigError(
            CHOICE.format(key=key, choices=", ".join(ATTRIBUTES), value=value, meaning=meaning)
        )
    return str(value)


def load(
    *,
    data_dir: Path,
    mirror: str | None = None,
    allow_download: bool = True,
    split_seed: int = 0,
    target: str = "Smiling",
    sensitive: str = "Male",
    image_size: int = 128,
    cache_size: int = 256,
    verify_checksums: bool = True,
) -> TabularData:
    """Load CelebA as :class:`TabularData` whose ``X`` is an :class:`ImageFolderStore`.

    ``verify_checksums=false`` skips the MD5 check of the two list files (for a re-packaged
    or generated copy in the same layout, e.g. tests); the layout is still checked.
    """
    del split_seed  # official splits
    target = _attribute(target, "dataset.options.target", "the attribute to predict.")
    sensitive = _attribute(sensitive, "dataset.options.sensitive", "the attribute defining the groups.")
    if target == sensitive:
        raise ConfigError(
            f"dataset.options.target and dataset.options.sensitive must differ (both {target})."
        )
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not 8 <= image_size <= 512:
        raise ConfigError(
            TYPE.format(key="dataset.options.image_size", expected="an integer in [8, 512]",
                        value=image_size, meaning="images are resized to image_size x image_size.")
        )
    if not isinstance(verify_checksums, bool):
        raise ConfigError(
            TYPE.format(key="dataset.options.verify_checksums", expected="true or false",
                        value=verify_checksums, meaning="check the MD5s of the list files.")
        )
    files: tuple[sources.RemoteFile, ...] = FILES
    if not verify_checksums:
        log.warning("celeba: MD5 checks of the list files are off (dataset.options.verify_checksums=false)")
        files = tuple(dataclasses.replace(f, md5=None) for f in FILES)
    attr_spec, part_spec, dir_spec = files
    kw = dict(data_dir=data_dir, mirror=mirror, allow_download=allow_download)
    attr_stream, attr_path = sources.open_file("celeba", attr_spec, **kw)  # type: ignore[arg-type]
    part_stream, _ = sources.open_file("celeba", part_spec, **kw)  # type: ignore[arg-type]
    image_dir = sources.locate("celeba", dir_spec, data_dir=data_dir, mirror=mirror)
    if image_dir is None:
        raise sources.missing_error("celeba", dir_spec, data_dir=data_dir)
    sources.verify("celeba", dir_spec, image_dir)

    names_, attr_names, values = parse_attributes(attr_stream.getvalue())
    if attr_names != ATTRIBUTES:
        raise DataIntegrityError(f"{attr_path}: unexpected attribute names {attr_names[:3]}...")
    partition = parse_partition(part_stream.getvalue())
    try:
        codes = np.asarray([partition[f] for f in names_])
    except KeyError as exc:
        raise DataIntegrityError(
            f"list_eval_partition.txt has no entry for {exc.args[0]} (it lists {len(partition)} "
            f"images, list_attr_celeba.txt {len(names_)}); the files do not belong together."
        ) from None
    splits = {PARTITION[c]: np.flatnonzero(codes == c).astype(np.int64) for c in PARTITION}
    y = values[:, ATTRIBUTES.index(target)]
    group = values[:, ATTRIBUTES.index(sensitive)]
    store = ImageFolderStore([image_dir / f for f in names_], image_size, cache_size=cache_size)
    group_names = ("Female", "Male") if sensitive == "Male" else (f"not {sensitive}", sensitive)
    return TabularData(
        name="celeba",
        X=store,
        y=y,
        group=group,
        feature_names=(f"image[3x{image_size}x{image_size}]",),
        class_names=(f"not {target}", target),
        group_names=group_names,
        splits={s: splits[s] for s in SPLITS},
        source=f"{image_dir.parent}",
        meta={"target": target, "sensitive": sensitive, "image_size": image_size, "splits": "official"},
    )
