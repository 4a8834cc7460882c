"""The analysis commands' selections and ``opdump run``'s script, checked against README's
"Command line" section (helper F, session 12): a ``--rank``/``--graph``/``--iteration(s)`` the dump
does not hold, a listing that selects nothing and a malformed iteration value are errors (exit
2) naming what was asked and what the dump holds -- never a clean 0, an operator of another rank
or a Python traceback; ``opdump run`` with a script or module that does not exist says what
Python would, with Python's status, before any dump folder is made."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "data", "mindspore_cpu_mlp")       # rank 0, graph 0, iterations 0 and 1; tensors


def _opdump(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "opdump", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.fixture
def cli(capsys):
    """The ``opdump`` command's main() in this process (its statuses and messages are main()'s;
    the process exit itself is tests/test_cli_exit.py's): a result like subprocess.run's."""
    import warnings
    from opdump.cli.main import main

    def run(*args):
        shown = warnings.formatwarning
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:           # argparse's refusal of an option value
            code = exc.code
        finally:
            warnings.formatwarning = shown
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)
    return run


def _refused(r, *words):
    """Exit 2, one error line naming each of ``words``, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout[-800:], r.stderr[-800:])
    assert "Traceback" not in r.stderr, r.stderr[-1500:]
    for w in words:
        assert w in r.stderr, (w, r.stderr)


@pytest.mark.parametrize("args, words", [
    (["--rank", "3"], ["no rank 3", "its ranks: 0"]),
    (["--ops", "--rank", "3"], ["no rank 3", "its ranks: 0"]),
    (["--graph", "5"], ["no graph 5", "its graphs: 0"]),
    (["--tensors", "--iteration", "7|9"], ["no iterations 7, 9", "its iterations: 0, 1"]),
    (["--stats"], ["no statistics rows"]),               # a tensor-only dump: nothing to list
    (["--iteration", "x"], ["'x' is not an iteration number"]),
    (["--iteration", "0:1"], ["only compare"]),           # a pair is compare's (was a TypeError)
    (["--stats", "--paths"], ["--paths", "with --tensors"]),   # was ignored
])
def test_ls_selecting_nothing_is_an_error_naming_it(cli, args, words):
    """Before: "no tensors and no statistics" or an "Empty DataFrame" listing, exit 0; "invalid
    literal for int()"."""
    _refused(cli("ls", SAMPLE, *args), *words)


def test_ls_selection_that_holds_rows_still_lists_them(cli):
    r = cli("ls", SAMPLE, "--tensors", "--iteration", "1|9", "--limit", "2")
    assert r.returncode == 0, r.stderr
    assert "MatMul" in r.stdout and "more rows" in r.stdout


def test_locate_by_name_keeps_to_the_asked_rank():
    """The records fallback of locate_op (an operator name no op listing holds for that rank)
    ignored ``rank``: rank 3 of a rank-0 dump listed rank 0's operators."""
    from opdump.analysis import locate
    from opdump.analysis.reader import open_dump
    d = open_dump(SAMPLE)
    assert locate(d, "MatMul", rank=0)
    assert locate(d, "MatMul", rank=3) == []


@pytest.mark.parametrize("command", [["locate", SAMPLE, "MatMul"], ["overflow", SAMPLE], ["watch", SAMPLE, "--cond", "nan"]])
def test_analysis_commands_refuse_a_rank_the_dump_does_not_hold(cli, command):
    """Before: locate printed rank 0's operators (exit 0); overflow/watch said "nothing to
    analyse: no floating tensors (rank 3)" without the ranks the dump holds."""
    _refused(cli(*command, "--rank", "3"), "no rank 3", "its ranks: 0")


@pytest.mark.parametrize("command", [["overflow", SAMPLE], ["watch", SAMPLE, "--cond", "nan"]])
def test_overflow_and_watch_name_the_iterations_the_dump_holds(cli, command):
    _refused(cli(*command, "--iterations", "5-6"), "no iterations 5, 6", "its iterations: 0, 1")
    _refused(cli(*command, "--iterations", "0:1"), "only compare")


def test_compare_still_takes_iteration_pairs(cli, tmp_path):
    r = cli("compare", SAMPLE, SAMPLE, "--iterations", "0:1", "--csv", tmp_path / "c.csv", "-q")
    assert r.returncode in (0, 1), r.stderr        # iteration 0 of A against 1 of B: compared
    assert "Traceback" not in r.stderr and "matched:" in r.stdout


def test_parse_iterations_grammar():
    from opdump.cli.analysis_commands import parse_iterations
    assert parse_iterations("0|5-7,9") == [0, 5, 6, 7, 9]
    assert parse_iterations("3:4", pairs=True) == [(3, 4)]
    assert parse_iterations(" all ") is None
    for bad, word in (("1-a", "'1-a'"), ("3:y", "'3:y'"), ("two", "'two'")):
        with pytest.raises(ValueError, match=word):
            parse_iterations(bad, pairs=True)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"common_dump_settings": {"path": "%s", "iteration": "0", "saved_data": "statistic"}}'
                    % (tmp_path / "dump"))
    return path


@pytest.mark.parametrize("target, status, words", [
    (["nosuch.py"], 2, ["can't open file", "nosuch.py", "no such file"]),
    (["-m", "nosuchmodule_f12"], 1, ["No module named nosuchmodule_f12"]),
    (["-m", "nosuchmodule_f12.sub"], 1, ["No module named nosuchmodule_f12"]),
    (["."], 1, ["can't find '__main__' module"]),
])
def test_run_a_script_that_does_not_exist(tmp_path, config, target, status, words):
    """Before: opdump's own traceback (runpy's FileNotFoundError / ImportError), exit 1, and an
    empty dump folder made; now Python's message and status (``python nosuch.py``: 2)."""
    r = _opdump("run", "--config", config, *target, cwd=tmp_path)
    assert r.returncode == status, (r.returncode, r.stderr[-1500:])
    assert "Traceback" not in r.stderr, r.stderr[-1500:]
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not (tmp_path / "dump").exists()


def test_run_a_module_of_the_current_folder(tmp_path, config):
    """The existence check looks where python -m does: the current folder first (the console
    script's sys.path[0] is the venv's bin)."""
    (tmp_path / "pk_f12").mkdir()
    (tmp_path / "pk_f12" / "__init__.py").write_text("")
    (tmp_path / "pk_f12" / "__main__.py").write_text("print('main of pk_f12')\n")
    opdump = os.path.join(os.path.dirname(sys.executable), "opdump")
    for command in ([sys.executable, "-m", "opdump"], [opdump]):
        r = subprocess.run([*command, "run", "--config", str(config), "-m", "pk_f12"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr[-1500:]
        assert "main of pk_f12" in r.stdout


def test_triage_of_a_script_that_does_not_exist(cli, tmp_path):
    """Before: run 1 ran (a subprocess), left opdump's traceback in run1.log and a triage folder;
    now refused before run 1."""
    r = cli("triage", "--out", tmp_path / "tri", "-q", "--", tmp_path / "nosuch.py")
    _refused(r, "can't open file", "nosuch.py")
    assert not (tmp_path / "tri").exists()


@pytest.mark.parametrize("args, words", [
    (["ls", SAMPLE, "--limit", "-1"], ["--limit", "-1 is below 0"]),      # printed all rows but one, "… 3 more"
    (["watch", SAMPLE, "--cond", "nan", "--limit", "0"], ["--limit", "0 is below 1"]),   # "no hit (0 checked)", 0
    (["compare", SAMPLE, SAMPLE, "--workers", "-3"], ["--workers", "-3 is below 1"]),
    (["compare", SAMPLE, SAMPLE, "--show", "x"], ["--show", "'x' is not a whole number"]),
    (["overflow", SAMPLE, "--max-affected", "-2"], ["--max-affected"]),
    (["triage", "--max-suspects", "0", "--", "t.py"], ["--max-suspects"]),
    (["compare", SAMPLE, SAMPLE, "--ranks", SAMPLE], ["leave A and B out"]),          # A and B were ignored
    (["compare", "--ranks", SAMPLE, "--rank", "0", "--io", "output"], ["not --rank, --io"]),   # so were these
])
def test_counts_out_of_range_and_ignored_operands_are_refused(cli, args, words):
    _refused(cli(*args), *words)


def test_demo_keeps_a_folder_it_did_not_write(cli, tmp_path):
    """``opdump demo --out DIR`` removed DIR wholesale before writing (``--out .`` took the
    current folder with it); now a folder holding anything but the demo's data_dump.json and
    dump/ is refused, untouched."""
    (tmp_path / "keep.txt").write_text("mine")
    _refused(cli("demo", "--out", tmp_path, "--steps", "1"), "keep.txt", "new or empty folder")
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("command, option", [
    (["ls", SAMPLE], "--csv"), (["overflow", SAMPLE], "--html"), (["watch", SAMPLE, "--cond", "nan"], "--csv"),
    (["watch", SAMPLE, "--cond", "nan"], "--html"), (["compare", SAMPLE, SAMPLE, "-q"], "--csv"),
    (["compare", SAMPLE, SAMPLE, "-q"], "--html"),
])
def test_an_output_file_in_a_missing_folder_is_refused_first(cli, tmp_path, command, option):
    """Before: the analysis ran, then writing the file raised: a traceback and exit 1, which
    these commands use for "found" (a divergence, a hit)."""
    target = tmp_path / "no_such_folder" / "out.file"
    _refused(cli(*command, option, target), option, "no folder")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc (a folder no file can be made in)")
def test_an_output_file_that_cannot_be_made_is_an_error(cli):
    """A write that fails past the up-front check (here /proc, where no file can be created)
    is "opdump ls: error: …", exit 2 (main's OSError net), not a traceback's 1."""
    _refused(cli("ls", SAMPLE, "--csv", "/proc/opdump_f12.csv"), "opdump ls: error:", "opdump_f12")


@pytest.mark.parametrize("option, words", [
    (["--iteration", "x"], ["opdump demo: invalid config", "iteration", "'x'"]),
    (["--backend", "nosuch_f12"], ["--backend nosuch_f12", "Invalid backend"]),
])
def test_demo_options_torch_or_the_config_refuse_are_one_line(cli, tmp_path, option, words):
    """Before: ConfigError's traceback (exit 1) for --iteration x; torch's backend error after
    the first step for --backend."""
    _refused(cli("demo", "--out", tmp_path / "d", "--steps", "1", *option), *words)


def test_watch_op_that_is_not_a_regular_expression(cli):
    """Before: re.error's traceback, exit 1 -- which watch uses for "hits"."""
    _refused(cli("watch", SAMPLE, "--cond", "nan", "--op", "["), "--op '['", "not a regular expression")


def test_watcher_of_a_path_that_does_not_exist(cli, tmp_path):
    """Before: "no watcher.json below …", as if the folder were there."""
    _refused(cli("watcher", tmp_path / "nothing_here"), "nothing_here", "no such file or directory")
