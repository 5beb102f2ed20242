"""folktables ACSEmployment (Ding, Hardt, Miller & Schmidt 2021): employed, sensitive RAC1P.

Source (facts from the mirror README ``shared/datasets/README.md``, section ACSEmployment, and
folktables 0.0.12): the ACS PUMS person file of each state, read by folktables as
``ACSDataSource(survey_year, horizon, survey='person', root_dir=ROOT).get_data(states)``
from ``ROOT/<year>/<horizon>/psam_p<FIPS>.csv`` (AL = 01; years >= 2017), downloaded by
folktables from ``https://www2.census.gov/programs-surveys/acs/data/pums/<year>/<horizon>/csv_p<st>.zip``
when absent.  ``ROOT`` is ``datasets/acs/`` (the cache) or ``$RACO_DATA_MIRROR/acs/`` (an
offline copy in the same layout; files are read there in place).  folktables reads plain
CSV only (no .gz).  The Census Bureau publishes no checksums (and revises files), so the
files are not checksum-verified; a file lacking a column ACSEmployment needs is rejected.

Options (``dataset.options``): ``year`` (default 2018), ``horizon`` (default ``1-Year``;
the paper's reference config uses ``5-Year``: the 2014-2018 5-Year file is ~5x larger),
``states`` (default ``[AL]``), ``sensitive_as_feature`` (default false).

Definitions (``ACSEmployment.df_to_numpy``): no row filter; label ``ESR == 1`` (civilian
employed, at work); group ``RAC1P`` 1..9 -> 0..8 (9 groups: demographic parity gives 18
one-sided constraints); folktables replaces N/A by 0 (``np.nan_to_num``).  Encoding of the
16 features:

* numeric, standardised on the training part: ``AGEP`` (age) and ``SCHL`` (educational
  attainment 1..24, an ordered scale; one-hot would add 24 sparse columns for no gain in a
  linear model);
* one-hot over fixed vocabularies (codes of the PUMS 2018 data dictionary, 0 = N/A where the
  variable can be N/A): MAR, RELP, DIS, ESP, CIT, MIG, MIL, ANC, NATIVITY, DEAR, DEYE,
  DREM, SEX (codes outside a vocabulary become all-zero rows of that block);
* ``RAC1P`` is the sensitive attribute and, like ``sex`` in Adult, not a feature unless
  ``sensitive_as_feature=true`` (then one-hot, 9 columns).

That is 2 + 64 = 66 features (75 with RAC1P).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from raco_cli.data import sources
from raco_cli.data.tabular import ColumnSpec, build_tabular, require_columns
from raco_cli.data.types import TabularData
from raco_cli.errors import CHOICE, MISSING_DATA, TYPE, ConfigError, DataNotFoundError

log = logging.getLogger(__name__)

FOLDER = "acs"  # datasets/acs/, $RACO_DATA_MIRROR/acs/ (folktables' own layout below it)
DEFAULTS: dict[str, object] = {"year": 2018, "horizon": "1-Year", "states": ("AL",)}
HORIZONS = ("1-Year", "5-Year")
FEATURES = (
    "AGEP", "SCHL", "MAR", "RELP", "DIS", "ESP", "CIT", "MIG", "MIL", "ANC", "NATIVITY",
    "DEAR", "DEYE", "DREM", "SEX", "RAC1P",
)  # fmt: skip  (ACSEmployment.features, in its order)
REQUIRED = (*FEATURES, "ESR")
NUMERIC = ("AGEP", "SCHL")
VOCAB: dict[str, tuple[int, ...]] = {
    "MAR": (1, 2, 3, 4, 5),  # married, widowed, divorced, separated, never married
    "RELP": tuple(range(18)),  # 0 reference person ... 16/17 group quarters
    "DIS": (1, 2),  # with / without a disability
    "ESP": tuple(range(9)),  # 0 = N/A (not own child of householder), 1..8
    "CIT": (1, 2, 3, 4, 5),  # born in US ... not a citizen
    "MIG": (0, 1, 2, 3),  # 0 = N/A (under 1 year), same house, abroad, moved in US
    "MIL": (0, 1, 2, 3, 4),  # 0 = N/A (under 17), active duty ... never served
    "ANC": (1, 2, 3, 4, 8),  # single, multiple, unclassified, not reported, suppressed
    "NATIVITY": (1, 2),  # native, foreign born
    "DEAR": (1, 2),
    "DEYE": (1, 2),
    "DREM": (0, 1, 2),  # 0 = N/A (under 5)
    "SEX": (1, 2),  # male, female
}
RAC1P_GROUPS = (
    "White", "Black", "American Indian", "Alaska Native",
    "AIAN tribes specified", "Asian", "NHPI", "Other race", "Two or more races",
)  # fmt: skip  (RAC1P codes 1..9, README table)


def _options(year: object, horizon: object, states: object) -> tuple[int, str, tuple[str, ...]]:
    from folktables.load_acs import state_list

    if isinstance(year, bool) or not isinstance(year, (int, str)) or not str(year).isdigit() or int(year) < 2017:
        raise ConfigError(
            TYPE.format(key="dataset.options.year", expected="a survey year >= 2017", value=year,
                        meaning="the ACS PUMS survey year (person files psam_p<FIPS>.csv exist from 2017).")
        )
    if horizon not in HORIZONS:
        raise ConfigError(
            CHOICE.format(key="dataset.options.horizon", choices=", ".join(HORIZONS), value=horizon,
                          meaning="the ACS sample (the paper used 5-Year).")
        )
    if isinstance(states, str):
        states = (states,)
    if not isinstance(states, Sequence) or not states or any(s not in state_list for s in states):
        raise ConfigError(
            TYPE.format(key="dataset.options.states", expected=f"a non-empty list of codes from {', '.join(state_list)}",
                        value=states, meaning="the states whose person files are pooled.")
        )
    return int(year), str(horizon), tuple(str(s) for s in states)


def files(*, year: object = 2018, horizon: object = "1-Year", states: object = ("AL",), **_: object) -> tuple[sources.RemoteFile, ...]:
    """The person files an option set needs (names relative to ``datasets/acs/``)."""
    from folktables.load_acs import _STATE_CODES

    y, h, st = _options(year, horizon, states)
    return tuple(
        sources.RemoteFile(
            f"{y}/{h}/psam_p{_STATE_CODES[s]}.csv",
            urls=(f"https://www2.census.gov/programs-surveys/acs/data/pums/{y}/{h}/csv_p{s.lower()}.zip",),
            folder=FOLDER,
        )
        for s in st
    )


FILES = files()


def fetch_command(year: int, horizon: str, states: tuple[str, ...]) -> str:
    """The command that downloads the files of an option set (quoted in error messages)."""
    if (year, horizon, states) == (DEFAULTS["year"], DEFAULTS["horizon"], DEFAULTS["states"]):
        return sources.fetch_command("acs_employment")
    return (
        f"raco data fetch acs_employment -o year={year} -o horizon={horizon} "
        f"-o states=[{','.join(states)}]"
    )


def _root(specs: Sequence[sources.RemoteFile], data_dir: Path, mirror: str | None) -> Path | None:
    """The first root (cache, then mirror) that holds every needed file, or None."""
    roots = [Path(data_dir) / FOLDER] + ([Path(mirror) / FOLDER] if mirror else [])
    for root in roots:
        if all((root / s.name).is_file() for s in specs):
            return root
    return None


def fetch(*, data_dir: Path, mirror: str | None = None, **options: object) -> list[Path]:
    """Make the person files of an option set present: found in the cache or the mirror
    (used in place), else downloaded by folktables into ``datasets/acs/``.

    Raises:
        DataNotFoundError: the download failed (offline, or no such file upstream).
    """
    year, horizon, states = _options(
        options.get("year", DEFAULTS["year"]), options.get("horizon", DEFAULTS["horizon"]),
        options.get("states", DEFAULTS["states"]),
    )
    specs = files(year=year, horizon=horizon, states=states)
    root = _root(specs, data_dir, mirror)
    if root is None:
        from folktables.load_acs import initialize_and_download

        root = Path(data_dir) / FOLDER
        base = root / str(year) / horizon
        base.mkdir(parents=True, exist_ok=True)
        for state, spec in zip(states, specs):
            if not (root / spec.name).is_file():
                log.info("Downloading ACS PUMS %s %s %s via folktables", year, horizon, state)
                initialize_and_download(str(base), state, year, horizon, "person", download=True)
            if not (root / spec.name).is_file():  # folktables prints and returns on failure
                raise DataNotFoundError(
                    MISSING_DATA.format(path=root / spec.name, command=fetch_command(year, horizon, states))
                    + f" (download of {spec.urls[0]} failed; or place the file there or in $RACO_DATA_MIRROR/acs/)"
                )
    return [root / s.name for s in specs]


def load(
    *,
    data_dir: Path,
    mirror: str | None = None,
    allow_download: bool = True,
    split_seed: int = 0, split: str = "stratified",
    year: int = 2018,
    horizon: str = "1-Year",
    states: Sequence[str] = ("AL",),
    sensitive_as_feature: bool = False,
    preprocessing: str = "empirical",
    bounds: Mapping[str, object] | None = None,
) -> TabularData:
    """Load ACSEmployment as :class:`TabularData` (label 1 = ESR == 1, group = RAC1P - 1)."""
    from folktables import ACSDataSource, ACSEmployment

    year, horizon, states = _options(year, horizon, states)
    if not isinstance(sensitive_as_feature, bool):
        raise ConfigError(
            TYPE.format(key="dataset.options.sensitive_as_feature", expected="true or false",
                        value=sensitive_as_feature, meaning="one-hot RAC1P among the features.")
        )
    specs = files(year=year, horizon=horizon, states=states)
    root = _root(specs, data_dir, mirror)
    if root is None:
        if not allow_download:
            missing = next(s for s in specs if not (Path(data_dir) / FOLDER / s.name).is_file())
            raise DataNotFoundError(
                MISSING_DATA.format(path=Path(data_dir) / FOLDER / missing.name,
                                    command=fetch_command(year, horizon, states))
            )
        root = fetch(data_dir=data_dir, mirror=mirror, year=year, horizon=horizon, states=states)[0].parents[2]
    log.info("acs_employment: reading %s %s %s from %s", year, horizon, ",".join(states), root)
    source = ACSDataSource(survey_year=str(year), horizon=horizon, survey="person", root_dir=str(root))
    raw = source.get_data(states=list(states), download=False)
    require_columns(raw, REQUIRED, dataset="acs_employment", path=str(root / specs[0].name))
    X, label, rac1p = ACSEmployment.df_to_numpy(raw)
    df = pd.DataFrame(X, columns=list(ACSEmployment.features))
    group = np.asarray(rac1p, dtype=np.int64) - 1
    if group.min() < 0 or group.max() > 8:
        from raco_cli.errors import DataIntegrityError

        raise DataIntegrityError(f"{root}: RAC1P values must lie in 1..9 (got {group.min() + 1}..{group.max() + 1}).")
    vocab = dict(VOCAB)
    if sensitive_as_feature:
        vocab["RAC1P"] = tuple(range(1, 10))
    return build_tabular(
        "acs_employment",
        df,
        y=np.asarray(label, dtype=np.int64),
        group=group,
        columns=ColumnSpec(numeric=NUMERIC, categorical=vocab),
        class_names=("not employed", "employed"),
        group_names=RAC1P_GROUPS,
        split_seed=split_seed,
        split=split,
        preprocessing=preprocessing,
        bounds=bounds,
        source=", ".join(str(root / s.name) for s in specs),
        meta={"sensitive": "RAC1P", "label": "ESR==1", "year": year, "horizon": horizon, "states": list(states)},
    )
