"""`probe backends` (every backend, whether it runs here and its version) and the
conformance report of `probe check --report`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sdpa_probe import conformance
from sdpa_probe.backends import registry
from sdpa_probe.cli import app

runner = CliRunner()


def test_backends_lists_every_backend_with_why_or_version():
    res = runner.invoke(app, ["backends", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["backends"]}
    assert set(registry.REGISTERED) <= set(rows) and "flash" in rows
    assert rows["torch"]["available"] and rows["torch"]["version"].startswith("torch ")
    assert rows["flash"]["kind"] == "native"
    for r in rows.values():  # either it runs here with a version, or it says why not
        assert (r["available"] and r["version"]) or (not r["available"] and r["why"]), r


def test_backends_table_fits_80_columns():
    res = runner.invoke(app, ["backends"], env={"COLUMNS": "80"})
    assert res.exit_code == 0
    assert "torch" in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80


def _doc(records: list[dict]) -> dict:
    return {"tool": {"name": "sdpa_probe", "version": "0"}, "suite": "default", "seed": 0,
            "seconds": 1.0, "environment": {}, "backends": ["rt", "torch"],
            "backend_versions": {"rt": "rt 1.2"}, "records": records}


def _rec(backend, case, family, status, reason=""):
    return {"backend": backend, "case": case, "family": family, "status": status,
            "reason": reason, "repro": f"probe check --repro {case} --backend {backend}"}


def test_the_report_gives_counts_the_first_failure_and_why_unsupported():
    doc = _doc([_rec("rt", "m-1", "masked-rows", "pass"),
                _rec("rt", "m-2", "masked-rows", "fail", "NaN in 4 of 20 rows | fully masked"),
                _rec("rt", "m-3", "masked-rows", "crash", "SIGSEGV"),
                _rec("rt", "b-1", "dtype", "unsupported", "no bf16 kernel"),
                _rec("torch", "m-1", "masked-rows", "pass")])
    md = conformance.markdown(doc)
    assert md.startswith(conformance.TITLE)
    assert "| masked-rows | 1/3 **✗** | 1/1 |" in md
    assert "| dtype | unsupported |  |" in md
    # the first failing case, its reason (a table-safe line) and its repro command
    assert "`m-2` (fail): NaN in 4 of 20 rows \\| fully masked" in md
    assert "`probe check --repro m-2 --backend rt`" in md
    assert "- 1 case(s): no bf16 kernel" in md
    assert "## rt (rt 1.2)" in md


def test_check_writes_the_report_and_refuses_a_file_that_is_not_one(tmp_path):
    path = tmp_path / "conformance.md"
    args = ["check", "-b", "flash,torch", "-k", "masked-rows-h4gqa2-q5-kv140-d64-f32",
            "--report", str(path)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    md = path.read_text()
    assert "| masked-rows | 3/3 | 3/3 |" in md and "## torch (torch " in md
    assert runner.invoke(app, args).exit_code == 0  # its own report is rewritten
    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\n")
    res = runner.invoke(app, [*args[:-1], str(notes)])
    assert res.exit_code == 2 and "not one of probe's reports" in res.stderr
    assert notes.read_text() == "# my notes\n"


def test_passes_under_a_convention_are_counted_apart():
    conv = {**_rec("rt", "d-1", "dtype", "pass"), "convention": "Q rounded to F16"}
    md = conformance.markdown(_doc([conv, _rec("rt", "d-2", "dtype", "pass")]))
    assert "| dtype | 2 (1 by convention) | 0 |" in md
    assert "| dtype | 2/2 |" in md
