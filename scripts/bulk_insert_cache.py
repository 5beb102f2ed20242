"""The SQLite page cache of a bulk metric write (raco_cli/tracking/bulk_metrics.py): the time to
insert one 160-run group's evaluation history (37 keys x 81 evaluations per run: 479 520 rows,
as a fig4_adult group at T = 400 writes with its final metrics) into MLflow's ``metrics`` table of a store
that already holds ``--groups`` such groups, with SQLite's default 2 MB cache and with
``SQLITE_CACHE_KIB``, alternating, in one run (ratios, not absolute times).

    python scripts/bulk_insert_cache.py [--groups 4] [--repeats 3]

The schema is MLflow's own (a SqlAlchemyStore creates the database; foreign keys are not
enforced on this plain connection, so the run ids need no runs); the rows are synthetic with a
sweep's shape: random run ids, keys in the order a record logs them, timestamps increasing.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

from raco_cli.tracking.bulk_metrics import SQLITE_CACHE_KIB

KEYS = [f"{split}/metric_{i:02d}" for split in ("train", "val", "test") for i in range(12)] + ["dual/lambda_max"]
RUNS, EVALS = 160, 81
INSERT = 'INSERT INTO metrics ("key", value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)'


def group_rows(start_ms: int) -> list[tuple]:
    rows = []
    for r in range(RUNS):
        run = uuid.uuid4().hex
        for e in range(EVALS):
            rows.extend((key, 0.5 + 1e-3 * e + 1e-7 * r, start_ms + 10 * e, run, 5 * e, 0) for key in KEYS)
    return rows


def insert(db: Path, rows: list[tuple], cache_kib: int | None) -> float:
    con = sqlite3.connect(db, isolation_level=None)
    if cache_kib:
        con.execute(f"PRAGMA cache_size = -{cache_kib}")
    tic = time.perf_counter()
    con.execute("BEGIN")
    con.executemany(INSERT, rows)
    con.execute("COMMIT")
    took = time.perf_counter() - tic
    con.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4, help="groups already in the store")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.db"
        SqlAlchemyStore(f"sqlite:///{base}", str(Path(tmp) / "artifacts")).engine.dispose()
        for g in range(args.groups):
            insert(base, group_rows(10**12 + 10**7 * g), SQLITE_CACHE_KIB)
        rows = group_rows(10**12 + 10**7 * args.groups)
        times: dict[str, list[float]] = {"default 2 MB": [], f"{SQLITE_CACHE_KIB // 1024} MiB": []}
        for _ in range(args.repeats):
            for label, kib in (("default 2 MB", None), (f"{SQLITE_CACHE_KIB // 1024} MiB", SQLITE_CACHE_KIB)):
                db = Path(tmp) / "db.db"
                shutil.copy(base, db)
                times[label].append(insert(db, rows, kib))
        print(f"{len(rows)} rows into a store of {args.groups} groups ({args.groups * len(rows)} rows), min of {args.repeats}:")
        best = {k: min(v) for k, v in times.items()}
        default = best["default 2 MB"]
        for label, t in best.items():
            print(f"  cache {label:>12}: {t:.2f} s  ({t / default:.2f} of the default)")


if __name__ == "__main__":
    main()
