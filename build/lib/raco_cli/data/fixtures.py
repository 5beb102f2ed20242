"""Small synthetic files in the exact upstream layouts of datasets that have no offline copy.

Used by the tests (ACSEmployment and CelebA loaders, ``raco train`` end to end) and handy
for trying the pipeline without the real data::

    python -m raco_cli.data.fixtures acs /tmp/mirror      # /tmp/mirror/acs/2018/1-Year/psam_p01.csv
    python -m raco_cli.data.fixtures celeba /tmp/mirror   # /tmp/mirror/celeba/...
    RACO_DATA_MIRROR=/tmp/mirror raco train dataset=acs_employment
    python -m raco_cli.data.fixtures people demo          # demo/people.csv, demo/new_people.csv

The values are random (with a learnable signal), never real survey data or real faces.
``people`` is the made-up table of the worked example of ``dataset=table``
(docs/your-own-data.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Leading columns of the real 2018 person file, in upstream order (the file has ~286; the
# others are not read by ACSEmployment).  Then the columns ACSEmployment reads.
ACS_COLUMNS = (
    "RT", "SERIALNO", "DIVISION", "SPORDER", "PUMA", "REGION", "ST", "ADJINC", "PWGTP",
    "AGEP", "CIT", "MAR", "MIG", "MIL", "SCHL", "SEX", "DEAR", "DEYE", "DREM", "DIS", "ESP",
    "ESR", "RELP", "ANC", "NATIVITY", "RAC1P", "PINCP",
)  # fmt: skip


def write_acs(
    root: str | Path,
    *,
    year: int = 2018,
    horizon: str = "1-Year",
    state_fips: str = "01",
    n: int = 900,
    seed: int = 0,
) -> Path:
    """Write ``<root>/acs/<year>/<horizon>/psam_p<fips>.csv`` with ``n`` synthetic persons.

    Upstream format: CSV, header row, no quoting, empty field for N/A (ESR for persons under
    16, ESP for persons who are not an own child, MIG under 1 year, MIL under 17, DREM under
    5).  All nine RAC1P values occur (the first nine rows cover them), so every group of the
    18 demographic-parity constraints is present.  ESR depends on age, schooling and
    disability, with a race-dependent shift, so a classifier has something to learn.
    """
    rng = np.random.default_rng(seed)
    rac1p = np.concatenate([np.arange(1, 10), rng.choice(9, size=n - 9, p=_race_shares()) + 1])
    age = rng.integers(0, 95, size=n)
    age[:9] = rng.integers(20, 70, size=9)
    schl = np.clip((age / 4).astype(int) + rng.integers(-2, 6, size=n), 1, 24)
    dis = rng.choice([1, 2], size=n, p=[0.15, 0.85])
    sex = rng.choice([1, 2], size=n)
    logit = -1.0 + 0.15 * (schl - 16) - 1.5 * (dis == 1) - 0.4 * (rac1p == 2) - 0.3 * (rac1p > 2) - 0.04 * np.abs(age - 42) + 2.0
    employed = rng.random(n) < 1 / (1 + np.exp(-logit))
    esr = np.where(employed, 1, rng.choice([3, 6], size=n, p=[0.2, 0.8]))
    esr[rng.random(n) < 0.02] = 2
    lines = [",".join(ACS_COLUMNS)]
    for i in range(n):
        a = int(age[i])
        row = {
            "RT": "P",
            "SERIALNO": f"{year}{'GQ' if i % 50 == 0 else 'HU'}{i:07d}",
            "DIVISION": "6", "SPORDER": "1", "PUMA": f"{(i % 20) + 100:05d}", "REGION": "3",
            "ST": str(int(state_fips)), "ADJINC": "1013097", "PWGTP": str(int(rng.integers(5, 200))),
            "AGEP": str(a),
            "CIT": str(int(rng.choice([1, 2, 3, 4, 5], p=[0.9, 0.01, 0.01, 0.04, 0.04]))),
            "MAR": str(int(rng.integers(1, 6))) if a >= 15 else "5",
            "MIG": "" if a < 1 else str(int(rng.choice([1, 2, 3], p=[0.85, 0.01, 0.14]))),
            "MIL": "" if a < 17 else str(int(rng.choice([1, 2, 3, 4], p=[0.01, 0.08, 0.02, 0.89]))),
            "SCHL": str(int(schl[i])) if a >= 3 else "",
            "SEX": str(int(sex[i])),
            "DEAR": str(int(rng.choice([1, 2], p=[0.05, 0.95]))),
            "DEYE": str(int(rng.choice([1, 2], p=[0.03, 0.97]))),
            "DREM": "" if a < 5 else str(int(rng.choice([1, 2], p=[0.06, 0.94]))),
            "DIS": str(int(dis[i])),
            "ESP": str(int(rng.integers(1, 9))) if a < 16 else "",
            "ESR": "" if a < 16 else str(int(esr[i])),
            "RELP": str(int(rng.integers(0, 18))),
            "ANC": str(int(rng.choice([1, 2, 3, 4, 8]))),
            "NATIVITY": str(int(rng.choice([1, 2], p=[0.95, 0.05]))),
            "RAC1P": str(int(rac1p[i])),
            "PINCP": "" if a < 15 else str(int(rng.integers(0, 90000))),
        }
        lines.append(",".join(row[c] for c in ACS_COLUMNS))
    path = Path(root) / "acs" / str(year) / horizon / f"psam_p{state_fips}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _race_shares() -> np.ndarray:
    w = np.array([60, 25, 2, 1, 1, 3, 1, 3, 4], dtype=float)
    return w / w.sum()


CELEBA_ATTRIBUTES_MALE = 20  # 0-based index of Male in list_attr_celeba.txt
CELEBA_ATTRIBUTES_SMILING = 31


def write_celeba(
    root: str | Path,
    *,
    n: int = 60,
    seed: int = 0,
    width: int = 22,
    height: int = 27,
) -> Path:
    """Write ``<root>/celeba/`` with ``n`` tiny JPEGs and the two list files.

    Layout and formats as the official files: ``img_align_celeba/000001.jpg ...``;
    ``list_attr_celeba.txt`` (count, 40 names, rows of -1/1 separated by spaces, the first
    value padded like upstream); ``list_eval_partition.txt`` (60 % train, 20 % valid,
    20 % test, each holding every (Smiling, Male) combination).  Images are 22 x 27 by
    default (upstream 178 x 218, same aspect ratio), brighter when Smiling and redder when
    Male, so a linear model can learn something.
    """
    from PIL import Image

    from raco_cli.data.celeba import ATTRIBUTES

    rng = np.random.default_rng(seed)
    base = Path(root) / "celeba"
    images = base / "img_align_celeba"
    images.mkdir(parents=True, exist_ok=True)
    attrs = rng.choice([-1, 1], size=(n, len(ATTRIBUTES)))
    combos = np.array([(s, m) for s in (-1, 1) for m in (-1, 1)])
    attrs[:, CELEBA_ATTRIBUTES_SMILING] = combos[np.arange(n) % 4, 0]
    attrs[:, CELEBA_ATTRIBUTES_MALE] = combos[np.arange(n) % 4, 1]
    n_train, n_val = int(0.6 * n), int(0.2 * n)
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    for i, name in enumerate(names):
        pixels = rng.integers(0, 120, size=(height, width, 3))
        pixels += 100 * (attrs[i, CELEBA_ATTRIBUTES_SMILING] == 1)
        pixels[..., 0] += 35 * (attrs[i, CELEBA_ATTRIBUTES_MALE] == 1)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(images / name, quality=90)
    lines = [str(n), " ".join(ATTRIBUTES) + " "]
    for name, row in zip(names, attrs):
        lines.append(name + " " + " ".join(f"{v:2d}" for v in row))
    (base / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    part = [0 if i < n_train else 1 if i < n_train + n_val else 2 for i in range(n)]
    (base / "list_eval_partition.txt").write_text("".join(f"{nm} {p}\n" for nm, p in zip(names, part)))
    return base


PEOPLE_CITIES = ("Paris", "Lyon", "Nice", "Lille")


def people_frame(n: int, *, seed: int = 0, label: bool = True):
    """``n`` made-up people: ``id``, ``age`` (18-90), ``income`` (euros a year, right-skewed,
    about 3 % missing), ``city`` (4 levels), ``smoker`` (no/yes), ``sex`` (F/M) and the label
    ``approved`` (no/yes), which depends on age, income and smoking and is shifted by sex
    (a disparity for a fairness constraint to remove)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    sex = rng.choice(["F", "M"], size=n, p=[0.45, 0.55])
    age = rng.integers(18, 91, size=n)
    income = np.round(np.exp(rng.normal(10.4, 0.6, size=n)) * np.where(sex == "M", 1.15, 1.0), -2)
    city = rng.choice(PEOPLE_CITIES, size=n, p=[0.4, 0.25, 0.2, 0.15])
    smoker = rng.choice(["no", "yes"], size=n, p=[0.75, 0.25])
    logit = 2.5 * (np.log(income) - 10.4) / 0.6 - 0.04 * (age - 50) - 1.2 * (smoker == "yes") + 0.8 * (sex == "M") + 0.2
    approved = np.where(rng.random(n) < 1.0 / (1.0 + np.exp(-logit)), "yes", "no")
    df = pd.DataFrame({"id": [f"p{seed}-{i:05d}" for i in range(n)], "age": age, "income": pd.array(income.astype(np.int64), dtype="Int64"),
                       "city": city, "smoker": smoker, "sex": sex})
    df.loc[rng.random(n) < 0.03, "income"] = None
    if label:
        df["approved"] = approved
    return df


def write_people(root: str | Path, *, n: int = 4000, seed: int = 0) -> Path:
    """Write ``<root>/people.csv`` (``n`` labelled rows) and ``<root>/new_people.csv`` (5
    unlabelled rows, one with an unknown city, one with no income and one above any
    plausible income bound), the worked example of ``dataset=table``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    people_frame(n, seed=seed).to_csv(root / "people.csv", index=False)
    new = people_frame(5, seed=seed + 1, label=False)
    new.loc[1, "city"] = "Brest"
    new.loc[2, "income"] = None
    new.loc[3, "income"] = 950000
    new.to_csv(root / "new_people.csv", index=False)
    return root / "people.csv"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m raco_cli.data.fixtures", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["acs", "celeba", "people"])
    p.add_argument("root", help="mirror root to write into (then: RACO_DATA_MIRROR=<root>); people: the directory")
    p.add_argument("-n", type=int, default=None, help="rows / images")
    args = p.parse_args(argv)
    kw = {} if args.n is None else {"n": args.n}
    writers: dict[str, Callable[..., Path]] = {"acs": write_acs, "celeba": write_celeba, "people": write_people}
    print(writers[args.what](args.root, **kw))


if __name__ == "__main__":
    main()
