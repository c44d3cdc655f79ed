"""`probe check` as a command: its reports (JSON, JUnit, console), exit codes, usage errors,
--repro, --list, --skip, --last-failed and the random suite."""

import json
import xml.etree.ElementTree as ET

import pytest
from conftest import EXAMPLE_KERNEL, needs_cxx
from kernels_for_tests import BUGS, SRC, write_variant
from typer.testing import CliRunner

from sdpa_probe.backends import NativeBackend
from sdpa_probe.cases import Case, suite
from sdpa_probe.check import pool
from sdpa_probe.check.calls import run_one
from sdpa_probe.cli import app
from sdpa_probe.native import load_user_kernel
from sdpa_probe.oracle import prepare_case

runner = CliRunner()


def test_check_smoke_passes_and_writes_reports(tmp_path):
    j, x = tmp_path / "r.json", tmp_path / "r.xml"
    res = runner.invoke(app, ["check", "--suite", "smoke", "-b", "flash,torch", "--json", str(j),
                              "--junit", str(x)])
    assert res.exit_code == 0, res.output
    doc = json.loads(j.read_text())
    assert doc["schema"] == "sdpa_probe.check/1"
    n_cases = len(suite("smoke"))
    assert doc["summary"]["total"] == len(doc["records"]) == 2 * n_cases
    rec = doc["records"][0]
    for key in ("backend", "case", "status", "reason", "max_abs_err", "nmse", "seconds"):
        assert key in rec
    assert doc["summary"]["fail"] == 0
    root = ET.parse(x).getroot()
    assert root.tag == "testsuites"
    assert sum(int(s.get("tests")) for s in root) == 2 * n_cases


def test_check_json_to_stdout_and_failure_exit_code(tmp_path):
    bad = write_variant(tmp_path, "bad", "if (a->is_causal) return SDPA_OK;")
    res = runner.invoke(app, ["check", "--kernel", str(bad), "--suite", "smoke", "--json", "-"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    statuses = {r["status"] for r in doc["records"]}
    assert "fail" in statuses and "pass" in statuses
    failing = [r for r in doc["records"] if r["status"] == "fail"]
    assert all("never written" in r["reason"] for r in failing)
    assert all(r["repro"].startswith("probe check --kernel") for r in failing)
    assert doc["run"] == {"isolate": False, "leak_check": True,
                          "heap_guard": pool.malloc_debug_library() is not None}


def test_check_example_kernel_via_cli():
    res = runner.invoke(app, ["check", "--kernel", str(EXAMPLE_KERNEL), "--suite", "smoke"])
    assert res.exit_code == 0, res.output


@needs_cxx
def test_check_cxx_example_kernel_via_cli():
    cxx = EXAMPLE_KERNEL.with_name("minimal_sdpa.cpp")
    res = runner.invoke(app, ["check", "--kernel", str(cxx), "--suite", "smoke", "--jobs", "1"])
    assert res.exit_code == 0, res.output


def test_prebuilt_shared_library_kernel(tmp_path):
    """--kernel also takes a .so exporting sdpa_forward (linked through an API-mode shim)."""
    import subprocess

    from sdpa_probe.build import INCLUDE_DIR

    so = tmp_path / "libminimal.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", f"-I{INCLUDE_DIR}", str(EXAMPLE_KERNEL),
                    "-o", str(so), "-lm"], check=True)
    backend = NativeBackend("so", load_user_kernel(so))
    case = Case("so", q_len=3, kv_len=70, causal=True, start_pos=67)
    assert run_one(backend, case, prepare_case(case))["status"] == "pass"


@pytest.mark.parametrize("argv,msg", [
    (["check", "-b", "nosuch"], "unknown backend"),
    (["check", "--suite", "nosuch"], "unknown suite"),
    (["check", "-k", "no-case-has-this-id"], "no case matches"),
    (["check", "--dtype", "f64"], "unknown dtype"),
    (["check", "--kernel", "/nonexistent.c"], "not found"),
    (["check", "--repro", "nosuch-case"], "unknown case id"),
    (["check", "--save", "/"], "--save / is not empty"),
])
def test_check_usage_errors(argv, msg):
    res = runner.invoke(app, argv)
    assert res.exit_code == 2
    assert msg in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("columns,table", [("80", False), ("400", True)])
def test_failures_list_on_a_narrow_console_table_on_a_wide_one(tmp_path, monkeypatch,
                                                                columns, table):
    """At 80 columns (a CI log) each failure is a line, its whole reason and its repro
    below it; a table's reason column would be a word wide there."""
    monkeypatch.setenv("COLUMNS", columns)
    path = tmp_path / "gqa_modulo.c"
    path.write_text(SRC.replace(*BUGS["gqa-modulo"]))
    res = runner.invoke(app, ["check", "--kernel", str(path), "-k", "gqa-h8gqa4-q1"])
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    head = [ln for ln in lines if ln.startswith("fail") and "gqa-h8gqa4-q1-kv129-d64-f32" in ln]
    assert bool(head) is not table, res.output
    if not table:
        at = lines.index(head[0])
        # (the long backend path on a line of its own, indented, not wrapped to the
        # margin; the reason after it, indented)
        assert lines[at + 1].startswith(f"        {tmp_path}"[:40]), res.output
        assert any(ln.startswith("        error above tolerance at")
                   for ln in lines[at + 2:at + 5]), res.output
        below = "\n".join(lines[at + 2:at + 16])  # (the case in words, the diagnosis, repro)
        assert "probe check --kernel" in below and "diagnosis: your output equals" in below
    else:
        assert "reason / reproduce" in res.output


def test_skip_leaves_cases_out(tmp_path):
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["check", "-b", "flash", "-k", "threads", "--skip", "-c2",
                              "--skip", "stack", "--json", str(out)])
    assert res.exit_code == 0, res.output
    ids = {r["case"] for r in json.loads(out.read_text())["records"]}
    assert ids and all("threads" in i and "-c2" not in i and "stack" not in i for i in ids)
    res = runner.invoke(app, ["check", "-b", "flash", "-k", "threads", "--skip", "threads"])
    assert res.exit_code == 2 and "no case matches" in res.output


def test_list_shows_the_selected_cases_without_running_them(tmp_path):
    res = runner.invoke(app, ["check", "--list", "-k", "far", "--skip", "rows"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    ids = [ln.split()[0] for ln in lines[1:-1]]
    assert ids and all(i.endswith("-far") for i in ids) and lines[-1] == f"{len(ids)} cases"
    res = runner.invoke(app, ["check", "--list", "-k", "far", "--skip", "rows", "--json", "-"])
    doc = json.loads(res.stdout)
    assert [c["id"] for c in doc["cases"]] == ids
    assert doc["cases"][0]["params"]["layout"] == "far" and doc["cases"][0]["atol"] > 0
    res = runner.invoke(app, ["check", "--list", "--suite", "cache-sizing"])
    assert res.exit_code == 2 and "not a case list" in res.output


def test_repro_shows_map_and_saves(tmp_path):
    bad = write_variant(tmp_path, "rowbug", "")
    bad.write_text(bad.read_text().replace("if (mx != -INFINITY) {", "{"))
    case_id = "masked-rows-h4gqa2-q5-kv140-d64-f32-rowsmiddle"
    save = tmp_path / "repro"
    res = runner.invoke(app, ["check", "--kernel", str(bad), "--repro", case_id,
                              "--save", str(save)])
    assert res.exit_code == 1, res.output
    assert "fully masked rows" in res.output
    assert "q    2 |NNNN|" in res.output          # the NaN row, every head
    files = sorted(p.name for p in save.iterdir())
    assert files == sorted([f"{case_id}.npz", f"{case_id}.py", "Makefile", "case.h", "case.json",
                            "driver.c", "k.bin", "mask.bin", "q.bin", "reference.bin",
                            "sdpa_probe.h", "v.bin"])
    assert "diagnosis: " in res.output and "case: batch 1, 4 query heads" in res.output
    # the snippet reproduces the oracle with torch alone
    import runpy
    import sys
    from io import StringIO
    old, sys.stdout = sys.stdout, StringIO()
    try:
        runpy.run_path(str(save / f"{case_id}.py"))
        printed = sys.stdout.getvalue()
    finally:
        sys.stdout = old
    err = float(printed.split(":")[-1].strip().replace("tensor(", "").split(",")[0].rstrip(")"))
    assert err < 1e-12
    # refuses to overwrite without --force
    res = runner.invoke(app, ["check", "--kernel", str(bad), "--repro", case_id, "--save",
                              str(save)])
    assert res.exit_code == 2 and "--force" in res.output


def test_repro_json_carries_the_verdict_the_worst_element_and_the_map(tmp_path):
    bad = write_variant(tmp_path, "rowbug", "")
    bad.write_text(bad.read_text().replace("if (mx != -INFINITY) {", "{"))
    case_id = "masked-rows-h4gqa2-q5-kv140-d64-f32-rowsmiddle"
    res = runner.invoke(app, ["check", "--kernel", str(bad), "-b", "flash", "--repro", case_id,
                              "--json", "-"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "sdpa_probe.repro/1" and doc["case"] == case_id
    status = {r["backend"]: r["status"] for r in doc["records"]}
    user = str(bad)
    assert status == {"flash": "pass", user: "fail"}
    emap = doc["detail"][user]["error_map"]  # query rows x heads, null = NaN output
    assert len(emap) == 5 and all(len(row) == 4 for row in emap)
    assert emap[2] == [None] * 4 and all(v is not None for v in emap[0])
    assert doc["detail"]["flash"]["max_abs_err"] <= doc["detail"]["flash"]["atol"]


def test_last_failed_reruns_what_failed_until_it_passes(tmp_path, monkeypatch):
    """--last-failed: the failing cases of the last run for this kernel, kept until a
    run sees them pass; with none recorded, the whole selection and a note."""
    monkeypatch.setenv("SDPA_PROBE_LAST_CHECK", str(tmp_path / "state" / "last.json"))
    kernel, out = tmp_path / "k.c", tmp_path / "r.json"

    def run(*args):
        res = runner.invoke(app, ["check", "--kernel", str(kernel), "-k", "gqa-",
                                  "--json", str(out), *args])
        return res, {r["case"]: r["status"] for r in json.loads(out.read_text())["records"]}

    kernel.write_text(SRC.replace(*BUGS["gqa-shift"]))
    res, first = run()
    failed = {c for c, st in first.items() if st != "pass"}
    assert res.exit_code == 1 and len(failed) == 5 and len(first) > 5, first
    res, again = run("--lf")
    assert res.exit_code == 1 and set(again) == failed, again
    kernel.write_text(SRC)  # fixed
    res, fixed = run("--last-failed")
    assert res.exit_code == 0 and set(fixed) == failed, fixed
    res, everything = run("--lf")
    assert res.exit_code == 0 and set(everything) == set(first), everything
    assert "no failure recorded" in res.output


def test_last_failed_state_unreadable_or_unwritable(tmp_path, monkeypatch):
    state = tmp_path / "last.json"
    state.write_text("{not json")
    monkeypatch.setenv("SDPA_PROBE_LAST_CHECK", str(state))
    res = runner.invoke(app, ["check", "-b", "flash", "-k", "gqa-h8gqa4", "--lf"])
    assert res.exit_code == 0 and "no failure recorded" in res.output, res.output
    assert json.loads(state.read_text())["schema"] == 1  # rewritten whole
    monkeypatch.setenv("SDPA_PROBE_LAST_CHECK", str(tmp_path / "a-file" / "last.json"))
    (tmp_path / "a-file").write_text("")
    res = runner.invoke(app, ["check", "-b", "flash", "-k", "gqa-h8gqa4"])
    assert res.exit_code == 0 and "could not keep this run's failures" in res.output, res.output


def test_check_runs_a_random_slice_and_reproduces_its_cases(tmp_path):
    from sdpa_probe.cases import random_cases

    out = tmp_path / "r.json"
    res = runner.invoke(app, ["check", "-b", "flash", "--suite", "random", "--seed", "3",
                              "--json", str(out)])
    assert res.exit_code == 0, res.output
    recs = json.loads(out.read_text())["records"]
    assert [r["case"] for r in recs] == [c.id for c in random_cases(3)]
    case = next(r["case"] for r in recs if r["status"] == "pass")
    res = runner.invoke(app, ["check", "-b", "flash", "--repro", case])
    assert res.exit_code == 0 and ": pass" in res.output, res.output
    res = runner.invoke(app, ["check", "--suite", "random", "--golden"])
    assert res.exit_code == 2 and "no golden data" in res.output
    # a bug the fixed matrix was written for is found by random draws too
    bad = tmp_path / "gqa_mod.c"
    bad.write_text(SRC.replace(*BUGS["gqa-modulo"]))
    res = runner.invoke(app, ["check", "--kernel", str(bad), "--suite", "random", "--json",
                              str(out), "--maxfail", "5"])
    assert res.exit_code == 1
    assert sum(r["status"] == "fail" for r in json.loads(out.read_text())["records"]) >= 5


@pytest.mark.slow
def test_full_suite_passes_for_native_kernels_and_torch(tmp_path):
    j = tmp_path / "full.json"
    res = runner.invoke(app, ["check", "--suite", "full", "--json", str(j)])
    assert res.exit_code == 0, res.output
    doc = json.loads(j.read_text())
    assert doc["summary"]["fail"] == doc["summary"]["crash"] == doc["summary"]["timeout"] == 0
