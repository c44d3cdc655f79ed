"""Output paths that are not a report's to take: a golden data set's files, a symbolic
link (dangling or not), stdout where an option cannot use it, and a user's file that
appears at the path while the command runs. Each is refused with one line, and what
was there is left as it was."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sdpa_probe.cli import app
from sdpa_probe.errors import ProbeError
from sdpa_probe.outputs import check_writable, write_json, write_text

runner = CliRunner()
CHECK = ["check", "--suite", "smoke", "-b", "torch", "-k", "decode"]


def _refused(argv: list[str], msg: str) -> None:
    res = runner.invoke(app, argv)
    assert res.exit_code == 2, res.output
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and msg in err[0], res.stderr


@pytest.fixture
def golden_set(tmp_path):
    g = tmp_path / "golden"
    g.mkdir()
    manifest = {"schema": "sdpa_probe.golden/1", "cases": []}
    (g / "manifest.json").write_text(json.dumps(manifest))
    return g


@pytest.mark.parametrize("name", ["manifest.json", "new.json"])
def test_a_golden_sets_files_are_never_reports(golden_set, name):
    before = (golden_set / "manifest.json").read_text()
    _refused(CHECK + ["--json", str(golden_set / name)], "in a golden data directory")
    assert (golden_set / "manifest.json").read_text() == before
    assert not (golden_set / "new.json").exists()


@pytest.mark.parametrize("target_exists", [False, True])
def test_a_symbolic_link_is_not_written_through(tmp_path, target_exists):
    target = tmp_path / "elsewhere.json"
    if target_exists:
        target.write_text("")
    link = tmp_path / "out.json"
    link.symlink_to(target)
    _refused(CHECK + ["--json", str(link)], "is a symbolic link")
    assert link.is_symlink() and target.exists() == target_exists


def test_stdout_is_refused_where_an_option_cannot_use_it(tmp_path):
    _refused(CHECK + ["--junit", "-"], "cannot write --junit to stdout")
    assert not (tmp_path / "-").exists()


def test_a_file_that_appears_during_the_run_is_not_overwritten(tmp_path):
    out = tmp_path / "r.json"
    check_writable(str(out), "--json")  # (before the work: a new file)
    out.write_text("the user's notes\n")  # (made while the command ran)
    with pytest.raises(ProbeError, match="changed during the run"):
        write_json(str(out), {"schema": "sdpa_probe.check/1"})
    assert out.read_text() == "the user's notes\n"


def test_a_report_is_written_whole_by_a_rename(tmp_path):
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"schema": "sdpa_probe.check/1", "old": True}))
    write_text(str(out), json.dumps({"schema": "sdpa_probe.check/1"}))
    assert json.loads(out.read_text()) == {"schema": "sdpa_probe.check/1"}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # (no temporary left)


@pytest.mark.parametrize("argv,msg", [
    (["bench", "--min-time", "1e12", "--shape", "quick"], "--min-time must be at most 60"),
    (["profile", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["golden", "verify", "--dir", "/nonexistent"], "no golden directory /nonexistent"),
    (["golden", "regen", "--dir", "README.md", "--dry-run"], "is not a directory"),
    (["golden", "verify", "--dir", "README.md"], "is not a directory"),
    (["check", "--kernel", ""], "--kernel is empty"),
])
def test_bad_values_are_one_line_and_exit_2(argv, msg):
    """Each was accepted (bench ran until killed, a dry run reported 238 new cases), or
    exited 1 as if the data were wrong, or named the working directory."""
    _refused(argv, msg)
