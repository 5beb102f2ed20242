"""The messages a new user met with their own tables (issue 57), each one exact line that
names the real problem and the real fix, exit code 2 at the command line."""

from __future__ import annotations

import gzip
import logging
import subprocess
import sys

import pandas as pd
import pytest

from raco_cli.cli.validate import compose_config
from raco_cli.data.table import read_table
from raco_cli.errors import ConfigError, DataIntegrityError, RacoError
from raco_cli.run.prepare import few_steps_advice, prepare_run

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def _raco(*args, cwd):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("pic.csv", PNG, "dataset.options.path: {f} is not a text table: it holds a PNG image; give a CSV file (plain or .gz) or a "
                     "Parquet file."),
    ("book.csv", b"PK\x03\x04" + b"\x00" * 64, "dataset.options.path: {f} is not a text table: it holds a ZIP archive (an Excel "
                                               ".xlsx workbook is one: save its sheet as CSV); give a CSV file (plain or .gz) or "
                                               "a Parquet file."),
    ("blob.csv", b"a,b\n\x00\x01\x02\n", "dataset.options.path: {f} is not a text table: it holds binary data (NUL bytes); give a "
                                         "CSV file (plain or .gz) or a Parquet file."),
    ("latin.csv", "name,city\nJosé,Montréal\n".encode("latin-1"),
     "dataset.options.path: {f} is not UTF-8 text (byte 0xe9 at offset 13); re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8 "
     "{f} > {d}/latin.utf8.csv."),
    ("notes.txt", b"This is a note.\nSecond line of prose, with a comma.\n",
     "dataset.options.path: {f} reads as one column ('This is a note.') its header line has none of the separators , ; TAB | "
     "(a text file, not a table?); a table needs a label and a sensitive column: give a CSV/TSV file, or its field separator "
     "(dataset.options.delimiter, raco data describe --delimiter, e.g. ' ')."),
])
def test_a_file_that_is_no_table_says_what_it_holds(tmp_path, name, content, message):
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(DataIntegrityError) as err:
        read_table(str(f))
    assert str(err.value) == message.format(f=f, d=tmp_path)


def test_gzipped_content_is_judged_after_gunzip_and_a_delimited_txt_is_a_table(tmp_path):
    (tmp_path / "pic.csv.gz").write_bytes(gzip.compress(PNG))
    with pytest.raises(DataIntegrityError, match="is not a text table: it holds a PNG image"):
        read_table(str(tmp_path / "pic.csv.gz"))
    (tmp_path / "t.txt").write_text("a\tb\tc\n1\tx\ty\n2\tz\ty\n")  # a tab-separated export named .txt: read
    assert list(read_table(str(tmp_path / "t.txt")).columns) == ["a", "b", "c"]
    (tmp_path / "s.txt").write_text("age income\n1 2\n3 4\n")  # space-separated: with the separator it names
    assert list(read_table(str(tmp_path / "s.txt"), delimiter=" ").columns) == ["age", "income"]


def _conf(tmp_path, text):
    (tmp_path / "conf" / "dataset").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "conf" / "dataset" / "people.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("", "dataset=people: the dataset config file {f} is empty (a failed `raco data describe ... > FILE` leaves an empty file); "
         "write it again with raco data describe TABLE --label COLUMN --sensitive COLUMN --out {f} (docs/your-own-data.md)."),
    ("# only a comment\n", "dataset=people: the dataset config file {f} holds no keys (only comments); write it again with raco "
                           "data describe TABLE --label COLUMN --sensitive COLUMN --out {f} (docs/your-own-data.md)."),
    ("options: [\n", "dataset=people: {f} is not valid YAML (line 2, column 1: expected the node content, but found '<stream end>'); "
                     "write it again with raco data describe TABLE --label COLUMN --sensitive COLUMN --out {f} (docs/your-own-data.md)."),
    ("- table\n", "dataset=people: the dataset config file {f} holds a list, not a mapping of config keys; write it again with raco "
                  "data describe TABLE --label COLUMN --sensitive COLUMN --out {f} (docs/your-own-data.md)."),
])
def test_an_empty_or_invalid_dataset_file_is_named_instead_of_unknown_dataset_none(tmp_path, text, message):
    f = _conf(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        compose_config(["--config-dir", str(tmp_path / "conf"), "dataset=people", "tracking=none"])
    assert str(err.value) == message.format(f=f)


def test_a_dataset_file_that_names_no_loader_says_how_to_write_one(tmp_path):
    _conf(tmp_path, "options: {path: people.csv}\n")
    with pytest.raises(ConfigError, match=r"^dataset\.name is not set: the dataset config names no loader; a file of your own "
                                          r"table starts with `defaults: \[table, _self_\]`"):
        compose_config(["--config-dir", str(tmp_path / "conf"), "dataset=people", "tracking=none"])


def test_describe_out_writes_only_on_success_and_says_how_to_train(tmp_path):
    pd.DataFrame({"sex": ["F", "M"] * 30, "age": range(60), "y": ["no", "yes", "yes"] * 20}).to_csv(tmp_path / "p.csv", index=False)
    out = tmp_path / "conf" / "dataset" / "p.yaml"
    bad = _raco("data", "describe", "p.csv", "--label", "nosuch", "--sensitive", "sex", "--out", str(out), cwd=tmp_path)
    assert bad.returncode == 2 and not out.exists() and not out.parent.exists()  # nothing left behind
    assert bad.stderr.strip().startswith("error: --label nosuch: p.csv has no such column.")
    good = _raco("data", "describe", "p.csv", "--label", "y", "--sensitive", "sex", "--out", str(out), cwd=tmp_path)
    assert good.returncode == 0 and good.stdout == "" and out.read_text().startswith("# dataset=table config for p.csv")
    assert good.stderr.strip().splitlines()[-1] == (f"raco data describe: wrote {out}; train with raco train --config-dir "
                                                    f"{tmp_path / 'conf'} dataset=p constraint=dp eps=1")
    same = _raco("data", "describe", "p.csv", "--label", "y", "--sensitive", "sex", "--out", "p.csv", cwd=tmp_path)
    assert same.returncode == 2 and same.stderr.strip() == ("error: --out p.csv is the table itself; give the YAML file to write, "
                                                            "e.g. --out myconf/dataset/people.yaml.")


def test_the_few_steps_warning_never_recommends_the_batch_in_use():
    assert few_steps_advice(1024, 3745) == "use method.batch_size=256 (about n/16) or a larger eps"
    advice = few_steps_advice(32, 680)  # auto already picked n/16 = 32 (issue 57: "use method.batch_size=32")
    assert "method.batch_size=32 is already about n/16" in advice and "method.batch_size=16" in advice
    assert advice == ("method.batch_size=32 is already about n/16 or below: use a larger eps or more training rows "
                      "(or method.batch_size=16: more, noisier steps)")


def test_a_run_at_the_auto_batch_with_few_steps_gets_other_advice(caplog):
    with caplog.at_level(logging.WARNING, logger="raco_cli"):
        try:
            prepare_run(compose_config(["dataset=synthetic", "dataset.options.n=400", "eps=0.3", "method=dp_sgd", "constraint=none",
                                        "method.batch_size=auto", "tracking=none", "privacy.secure_rng=false", "seed=0"]))
        except RacoError:
            pytest.skip("this draw of n~ leaves no step at all")
    few = [r.getMessage() for r in caplog.records if "noisy steps fit" in r.getMessage()]
    assert few and "is already about n/16" in few[0] and "use method.batch_size=16 (about n/16)" not in few[0], few
