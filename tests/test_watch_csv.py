"""``opdump watch --csv``: the hits table is written whole (opdump/analysis/whole_files.py, as
compare's CSV): a new file renamed onto the target, never the old file truncated and
rewritten in place -- a reader that opened the previous table still reads all of it."""
import json

import pandas as pd

from analysis_fixtures import make_dump
from opdump.cli.main import build_parser


def _run(argv):
    a = build_parser().parse_args(argv)
    return a.func(a)


def test_watch_csv_is_written_whole_and_reads_back(tmp_path, capsys):
    make_dump(tmp_path / "ovf", iterations=(0, 1), overflow_at=1)
    csv = tmp_path / "hits.csv"
    old = "previous,table\n" + "1,2\n" * 1000
    csv.write_text(old)
    with open(csv) as reader:               # a reader of the previous table, opened before the write
        assert _run(["watch", str(tmp_path / "ovf"), "--cond", "nan", "--cond", "inf", "--csv", str(csv), "-q"]) == 1
        assert reader.read() == old          # the old file was replaced, not rewritten in place
    capsys.readouterr()
    assert _run(["watch", str(tmp_path / "ovf"), "--cond", "nan", "--cond", "inf", "--json", "-q"]) == 1
    hits = json.loads(capsys.readouterr().out)
    table = pd.read_csv(csv, dtype=str, keep_default_na=False)
    assert len(table) == len(hits) > 0
    assert list(table["op"]) == [h["op"] for h in hits] and list(table["condition"]) == [h["condition"] for h in hits]
    assert any("exp-op9" in op for op in table["op"])
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".opdump-tmp-")]
