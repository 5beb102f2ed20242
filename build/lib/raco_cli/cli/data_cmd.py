"""``raco data list|fetch|info``: what is present, download and verify, split statistics.

A loader module may define, besides ``load`` and ``FILES``:

* ``files(**options)``: the files an option set needs (e.g. ACS year/horizon/states);
* ``fetch(data_dir=, mirror=, **options)``: its own download (folktables for ACS, manual
  instructions for CelebA); otherwise :func:`raco_cli.data.sources.fetch` is used.

``-o/--option key=value`` passes ``dataset.options`` to ``fetch`` and ``info``.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

from raco_cli.cli.args import OneLineParser
from raco_cli.cli.paths import PROJECT_ROOT
from raco_cli.errors import ConfigError, RacoError


class _Parser(OneLineParser):
    command = "raco data"


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raco data", description="Datasets: list, fetch (download + verify), info (split statistics), "
                                             "describe (a starting config for your own table).")
    p.add_argument("--data-dir", default=str(PROJECT_ROOT / "datasets"), help="download cache (default: <project>/datasets)")
    sub = p.add_subparsers(dest="what", required=True, parser_class=_Parser)
    sub.add_parser("list", help="every dataset, whether it is present, its size and origin")
    f = sub.add_parser("fetch", help="download a dataset into the cache and verify its checksums")
    f.add_argument("name")
    i = sub.add_parser("info", help="rows, features, label balance and group sizes of each split")
    i.add_argument("name")
    i.add_argument("--split-seed", type=int, default=0)
    for sp in (f, i):
        sp.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a dataset option (as dataset.options.KEY), e.g. -o sensitive=Age -o states=[AL,GA]")
    d = sub.add_parser("describe", help="a starting dataset=table config (YAML) for your CSV/Parquet file, on stdout or --out FILE")
    d.add_argument("file", help="CSV (plain or .gz) or Parquet")
    d.add_argument("--label", required=True, help="the label column")
    d.add_argument("--sensitive", action="append", required=True, metavar="COLUMN",
                   help="a sensitive column (repeat for intersectional groups)")
    d.add_argument("--na-value", action="append", default=[], metavar="TEXT", help="a cell value meaning missing (e.g. ?)")
    d.add_argument("--delimiter", default=None, metavar="CHAR", help="the CSV field separator (default: read from the header line)")
    d.add_argument("--out", default=None, metavar="FILE",
                   help="write the YAML to FILE instead of stdout, only when describe succeeds (atomically; folders created), "
                        "e.g. --out myconf/dataset/people.yaml")
    d.add_argument("--values", default="private", choices=("private", "data"),
                   help="private (default): bounds, levels and missing indicators estimated inside each run's eps, the file's "
                        "values in comments; data: the file's values, marked source: data (privacy.scope=paper)")
    return p


def parse_options(items: list[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> options; values are Python/YAML-like literals, else strings.

    >>> parse_options(["year=2018", "states=[AL,GA]", "horizon=5-Year", "flag=false"])
    {'year': 2018, 'states': ['AL', 'GA'], 'horizon': '5-Year', 'flag': False}
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"raco data: --option must be KEY=VALUE (got {item!r}).")
        out[key] = _literal(raw)
    return out


def _literal(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    if raw.startswith("[") and raw.endswith("]"):
        return [_literal(x.strip()) for x in raw[1:-1].split(",") if x.strip()]
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw
    return value if isinstance(value, (int, float)) else raw


def _files(mod: Any, options: dict[str, Any] | None = None) -> tuple:
    if options and hasattr(mod, "files"):
        return tuple(mod.files(**options))
    return tuple(getattr(mod, "FILES", ()))


def _status(entry, data_dir: Path, mirror: str | None) -> tuple[str, str, str]:
    from raco_cli.data import sources

    if entry.user_file:
        return "your own file", "-", entry.origin
    if not entry.needs_files:
        return "generated", "-", entry.origin
    files = _files(entry.loader())
    found, size, where, verified = 0, 0, set(), True
    for spec in files:
        hit = sources.resolve(entry.name, spec, data_dir=data_dir, mirror=mirror)
        if hit is None:
            continue
        form, path = hit
        try:
            sources.verify(entry.name, form, path)
        except RacoError:
            return "CORRUPT", f"{path}", entry.origin
        found += 1
        size += _size(path)
        verified = verified and (form.verifiable or form.is_dir)
        where.add("cache" if str(path).startswith(str(data_dir)) else "mirror")
    check = "verified" if verified else "unverified"
    if found == len(files) and files:
        return f"present ({'+'.join(sorted(where))}, {check})", f"{size / 2**20:.1f} MiB", entry.origin
    if found:
        return f"partial ({found}/{len(files)} files)", f"{size / 2**20:.1f} MiB", entry.origin
    return "missing", "-", entry.origin


def _size(path: Path) -> int:
    if path.is_dir():  # image folders (200k files) are not walked; their size is not shown
        return 0
    return path.stat().st_size


def write_config(out: Path, text: str) -> None:
    """``describe``'s YAML into ``out``, atomically (a failed describe or a full disk leaves no
    empty or half-written file, unlike the shell's ``> FILE``), and how to train with it."""
    import sys

    from raco_cli.errors import OutputError
    from raco_cli.tracking.files import atomic_write

    try:
        atomic_write(out, lambda fh: fh.write(text))
    except OSError as exc:
        raise OutputError(f"--out {out}: cannot write it ({exc.strerror or exc}); give a writable path, e.g. "
                          "--out myconf/dataset/people.yaml.") from None
    train = (f"; train with raco train --config-dir {out.parent.parent} dataset={out.stem} constraint=dp eps=1"
             if out.parent.name == "dataset" else f"; keep it as <dir>/dataset/{out.name} for raco train --config-dir <dir>")
    print(f"raco data describe: wrote {out}{train}", file=sys.stderr)


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
    if args.what == "describe":
        import sys

        from raco_cli.data.describe import NOTE, NOTE_DATA, describe

        out = None if args.out is None else Path(args.out).expanduser()
        if out is not None and (out.is_dir() or (out.exists() and out.resolve() == Path(args.file).expanduser().resolve())):
            raise ConfigError(f"--out {args.out} is {'a directory' if out.is_dir() else 'the table itself'}; give the YAML file to "
                              "write, e.g. --out myconf/dataset/people.yaml.")
        text, review = describe(args.file, label=args.label, sensitive=args.sensitive, na_values=args.na_value, values=args.values,
                                delimiter=args.delimiter)
        print(NOTE if args.values == "private" else NOTE_DATA, file=sys.stderr)
        for line in review:
            print(line, file=sys.stderr)
        if out is None:
            print(text, end="")
            return 0
        write_config(out, text)
        return 0
    entry = data.get(args.name)
    options = parse_options(args.option)
    if args.what == "fetch":
        if entry.user_file:
            print(f"{args.name} reads your own file (dataset.options.path); nothing to fetch.")
            return 0
        if not entry.needs_files:
            print(f"{args.name} is generated; nothing to fetch.")
            return 0
        mod = entry.loader()
        if hasattr(mod, "fetch"):
            paths = mod.fetch(data_dir=data_dir, mirror=mirror, **options)
        else:
            paths = sources.fetch(args.name, _files(mod, options), data_dir=data_dir, mirror=mirror)
        for p in paths:
            print(f"ok  {p}")
        print(f"{args.name}: {len(paths)} file(s) present, checksums verified where known")
        return 0
    loaded = data.load(args.name, data_dir=data_dir, mirror=mirror, allow_download=True,
                       split_seed=args.split_seed, options=options)
    shape = "x".join(str(s) for s in loaded.input_shape)
    features = f"{loaded.n_features} features" if len(loaded.input_shape) == 1 else f"inputs {shape}"
    print(f"{loaded.name}: {len(loaded.y)} rows, {features}, {loaded.n_classes} classes, "
          f"{loaded.n_groups} groups  (source: {loaded.source})")
    for split in ("train", "val", "test"):
        idx = loaded.splits[split]
        labels = ", ".join(f"{k}={v}" for k, v in loaded.label_counts(split).items())
        groups = ", ".join(f"{k}={v}" for k, v in loaded.group_sizes(split).items())
        print(f"  {split:<5} {len(idx):>7} rows | labels: {labels} | groups: {groups}")
    if "schema" in loaded.meta:  # dataset=table: what its rules did (your own terminal: every count)
        from raco_cli.data.table import report_lines

        for line in report_lines(loaded, exact=True):
            print(f"  {line}")
    return 0
