"""``raco data list|fetch|info``: what is present, download and verify, split statistics."""

from __future__ import annotations

import argparse
from pathlib import Path

from raco_cli.cli.paths import PROJECT_ROOT
from raco_cli.errors import ConfigError, RacoError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise ConfigError(f"raco data: {message} (see raco data --help)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raco data", description="Datasets: list, fetch (download + verify), info (split statistics).")
    p.add_argument("--data-dir", default=str(PROJECT_ROOT / "datasets"), help="download cache (default: <project>/datasets)")
    sub = p.add_subparsers(dest="what", required=True, parser_class=_Parser)
    sub.add_parser("list", help="every dataset, whether it is present, its size and origin")
    f = sub.add_parser("fetch", help="download a dataset into the cache and verify its checksums")
    f.add_argument("name")
    i = sub.add_parser("info", help="rows, features, label balance and group sizes of each split")
    i.add_argument("name")
    i.add_argument("--split-seed", type=int, default=0)
    return p


def _status(entry, data_dir: Path, mirror: str | None) -> tuple[str, str, str]:
    from raco_cli.data import sources

    if not entry.needs_files:
        return "generated", "-", entry.origin
    mod = entry.loader()
    files = getattr(mod, "FILES", ())
    found, size, where = 0, 0, set()
    for spec in files:
        path = sources.locate(entry.name, spec, data_dir=data_dir, mirror=mirror)
        if path is None:
            continue
        try:
            sources.verify(entry.name, spec, path)
        except RacoError:
            return "CORRUPT", f"{path}", entry.origin
        found += 1
        size += path.stat().st_size
        where.add("cache" if str(path).startswith(str(data_dir)) else "mirror")
    if found == len(files) and files:
        return f"present ({'+'.join(sorted(where))}, verified)", f"{size / 2**20:.1f} MiB", entry.origin
    if found:
        return f"partial ({found}/{len(files)} files)", f"{size / 2**20:.1f} MiB", entry.origin
    return "missing", "-", entry.origin


def main(argv: list[str]) -> int:
    from raco_cli import data
    from raco_cli.data import sources

    args = parser().parse_args(argv)
    data_dir = Path(args.data_dir)
    mirror = sources.mirror_from_env()
    if args.what == "list":
        rows = [(name, *_status(entry, data_dir, mirror), entry.description) for name, entry in sorted(data.DATASETS.items())]
        width = max(len(r[0]) for r in rows)
        for name, status, size, origin, desc in rows:
            print(f"{name:<{width}}  {status:<32} {size:>9}  {desc}\n{'':<{width}}  source: {origin}")
        return 0
    entry = data.get(args.name)
    if args.what == "fetch":
        if not entry.needs_files:
            print(f"{args.name} is generated; nothing to fetch.")
            return 0
        paths = sources.fetch(args.name, entry.loader().FILES, data_dir=data_dir, mirror=mirror)
        for p in paths:
            print(f"ok  {p}")
        print(f"{args.name}: {len(paths)} file(s) present and verified in {data_dir / args.name}")
        return 0
    loaded = data.load(args.name, data_dir=data_dir, mirror=mirror, allow_download=True, split_seed=args.split_seed)
    print(f"{loaded.name}: {len(loaded.y)} rows, {loaded.n_features} features, {loaded.n_classes} classes, "
          f"{loaded.n_groups} groups  (source: {loaded.source})")
    for split in ("train", "val", "test"):
        idx = loaded.splits[split]
        labels = ", ".join(f"{k}={v}" for k, v in loaded.label_counts(split).items())
        groups = ", ".join(f"{k}={v}" for k, v in loaded.group_sizes(split).items())
        print(f"  {split:<5} {len(idx):>7} rows | labels: {labels} | groups: {groups}")
    return 0
