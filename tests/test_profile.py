"""`probe profile` runs on tiny shapes: the JSON contract, A/B and sweeps, token rates,
the live view, user kernels and native builds in the attention slot. No assertion
depends on how fast anything ran."""

import csv
import io
import json
import subprocess

import pytest
from conftest import EXAMPLE_KERNEL
from profile_cli import COMMON_OPS, DECOMPOSED_OPS, FAST, TINY, json_run, run

from sdpa_probe import build, caller_state, native
from sdpa_probe.profile import builds


def test_json_contract_decomposed():
    doc = json_run("--attention", "decomposed", "--context", "24")
    assert doc["graph"] == "decomposed" and doc["context"] == 24
    assert set(doc["step_ms"]) >= {"median", "iqr"}
    names = {o["name"] for o in doc["ops"]}
    assert names == COMMON_OPS | DECOMPOSED_OPS
    for o in doc["ops"]:
        assert {"name", "kind", "median_ms", "share", "gb_s", "allocs_per_step"} <= set(o)
        assert o["median_ms"] >= 0 and o["calls"] in (1, 2)
        assert o["bytes"] > 0
    assert [o["median_ms"] for o in doc["ops"]] == sorted(
        (o["median_ms"] for o in doc["ops"]), reverse=True)
    by = {o["name"]: o for o in doc["ops"]}
    assert by["q_proj"]["calls"] == 2 and by["lm_head"]["calls"] == 1
    assert by["q_proj"]["flops"] == 2 * 2 * 64 * 64  # two layers of a 64x64 GEMV
    # the decomposed graph preallocates: no heap allocation inside a step
    assert all(o["allocs_per_step"] == 0 for o in doc["ops"])
    assert isinstance(doc["unattributed_ms"], float) and isinstance(doc["overhead_ms"], float)
    assert doc["overhead_ms"] > 0
    assert {k["kind"] for k in doc["kinds"]} >= {"gemv", "broadcast", "pack", "matmul", "cast"}
    assert doc["checks"][0]["ok"] and doc["checks"][0]["b"] == "fused"
    assert "sweep" not in doc and "ab" not in doc


def test_json_fused_counts_kernel_allocations():
    doc = json_run("--attention", "fused", "--context", "40")
    by = {o["name"]: o for o in doc["ops"]}
    assert set(by) == COMMON_OPS | {"rope_qk", "sdpa"}
    assert doc["kernels"]["fused"] == "flash"
    assert by["sdpa"]["allocs_per_step"] >= 2  # flash allocates its scratch per call
    assert by["sdpa"]["alloc_bytes_per_step"] > 0


def test_ab_sweep_json_and_tables(tmp_path):
    path = tmp_path / "p.json"
    res = run(*TINY, *FAST, "--ab", "decomposed,fused", "--context", "8,16,32",
              "--json", str(path))
    assert res.exit_code == 0, res.output
    for text in ("sum of ops", "unattributed", "A/B (interleaved)", "ms / 1k tokens",
                 "gqa_broadcast", "sdpa"):
        assert text in res.stdout
    doc = json.loads(path.read_text())
    assert [s["context"] for s in doc["sweep"]] == [8, 16, 32]
    for s in doc["sweep"]:
        assert set(s["runs"]) == {"decomposed", "fused"}
        assert s["ab"]["context"] == s["context"]
    ab = doc["ab"]
    assert ab["a"] == "decomposed" and ab["b"] == "fused" and ab["context"] == 32
    assert ab["ci"][0] <= ab["ratio"] <= ab["ci"][1]
    assert ab["verdict"] in ("faster", "slower", "no significant difference")
    assert len(ab["by_context"]) == 3
    growth = doc["growth"]["decomposed"]
    assert growth[0]["name"] == "step"
    assert set(growth[0]["ms_by_context"]) == {"8", "16", "32"}
    assert all(len(c["a"]) for c in doc["checks"]) and all(c["ok"] for c in doc["checks"])
    assert len(doc["runs"]) == 6


def test_pp_tg_and_kernel_slot():
    doc = json_run("--attention", "flash_maskskip", "--context", "10", "--pp", "4", "--tg", "3")
    assert doc["kernels"]["flash_maskskip"] == "flash_maskskip"
    assert doc["pp"][0]["tokens"] == 4 and doc["pp"][0]["tokens_per_s"] > 0
    assert doc["tg"][0]["start"] == 10 and doc["tg"][0]["tokens"] == 3
    assert doc["capacity"] >= 13


def test_live_view_then_final_table():
    res = run(*TINY, *FAST, "--attention", "decomposed", "--context", "9", "--live")
    assert res.exit_code == 0, res.output
    assert "sum of ops" in res.stdout and "unattributed" in res.stdout


def test_user_kernel_in_the_attention_slot(tmp_path):
    doc = json_run("--kernel", str(EXAMPLE_KERNEL), "--context", "12")
    assert doc["graph"] == "user" and doc["kernels"] == {"user": "minimal_sdpa.c"}
    assert "sdpa" in {o["name"] for o in doc["ops"]}
    uk = doc["user_kernels"]["minimal_sdpa.c"]
    assert uk["path"].endswith("minimal_sdpa.c") and len(uk["sha256"]) == 16
    assert uk["module"].startswith("_sdpa_probe_user")
    chk = doc["checks"][0]
    assert (chk["a"], chk["b"], chk["ok"]) == ("decomposed", "user", True)
    # A/B against the built-in fused graph; both checked against the decomposed one
    doc = json_run("--kernel", str(EXAMPLE_KERNEL), "--ab", "fused,user", "--context", "12")
    assert {(c["a"], c["b"]) for c in doc["checks"]} == {("decomposed", "fused"),
                                                         ("decomposed", "user")}
    assert doc["ab"]["b"] == "user"


def test_a_user_kernel_that_leaves_its_caller_changed_is_put_back_and_said(tmp_path):
    """It sets an environment variable on every call: the fused graph timed after it
    would run so; each of its steps is followed by the caller put back, and a warning."""
    entry = "int st = sdpa_validate_args(a);"
    k = tmp_path / "env.c"
    k.write_text("#include <stdlib.h>\n" + EXAMPLE_KERNEL.read_text().replace(
        entry, 'setenv("SDPA_PROBE_PROFILE_LEFT", "1", 1);\n  ' + entry))
    before = caller_state.read()
    doc = json_run("--kernel", str(k), "--ab", "fused,user", "--context", "12")
    assert doc["caller_changed"] == {
        "user": ["the environment variable SDPA_PROBE_PROFILE_LEFT set to '1'"]}
    assert caller_state.changes(before, caller_state.read()) == []
    res = run(*TINY, *FAST, "--kernel", str(k), "--context", "12")
    assert res.exit_code == 0 and "attention user left its caller changed" in res.stderr
    assert json_run("--context", "12")["caller_changed"] == {}


WRONG_KERNEL = """
#include "sdpa_probe.h"
int sdpa_forward(const sdpa_args *a) {  /* plausible-looking but wrong: all zeros */
  float *o = (float *)a->out.data;
  for (int64_t i = 0; i < a->n_heads * a->head_dim; i++) o[i] = %s;
  return %s;
}
"""


@pytest.mark.parametrize("value,status,needle,code", [
    # wrong output is a problem found (1); a kernel that does not take the call, usage (2)
    ("0.0f", "SDPA_OK", "user (wrong.c) disagrees with decomposed at context 12", 1),
    ("0.0f", "SDPA_INVALID", "attention user (wrong.c) failed at context 12", 1),
    ("0.0f", "SDPA_UNSUPPORTED", "attention user (wrong.c) failed at context 12", 2),
])
def test_a_wrong_user_kernel_stops_the_run(tmp_path, value, status, needle, code):
    src = tmp_path / "wrong.c"
    src.write_text(WRONG_KERNEL % (value, status))
    res = run(*TINY, *FAST, "--kernel", str(src), "--context", "12", "--cache", "f32")
    assert res.exit_code == code, res.output
    err = res.stderr.strip().splitlines()
    assert err[-1].startswith("error:") and needle in err[-1]
    assert "sum of ops" not in res.stdout


def test_ab_of_two_builds(monkeypatch, tmp_path):
    """--ab GRAPH@CFLAGS,GRAPH@CFLAGS: one native build per side (compiling is faked here
    with the default library; docs/profile.md has a real -O3 vs -O1 run)."""
    asked = []

    def fake_compile(cflags):
        asked.append(cflags)
        return native.native_lib()

    monkeypatch.setattr(builds, "_compile", fake_compile)
    builds._with_flags.cache_clear()
    try:
        c, t = tmp_path / "p.csv", tmp_path / "t.json"
        res = run(*TINY, *FAST, "--ab", "fused@-O3,fused@-O1  -funroll-loops", "--context",
                  "10", "--json", "-", "--csv", str(c), "--trace", str(t))
    finally:
        builds._with_flags.cache_clear()
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert asked == ["-O3", "-O1 -funroll-loops"]
    assert doc["attention"] == ["fused@-O3", "fused@-O1 -funroll-loops"]
    assert set(doc["builds"]) == {"-O3", "-O1 -funroll-loops"}
    assert doc["attention_builds"]["fused@-O3"] == "-O3"
    assert doc["memory"]["builds"] == 2
    assert {(x["a"], x["b"]) for x in doc["checks"]} == {
        ("decomposed@-O3", "fused@-O3"),
        ("decomposed@-O1 -funroll-loops", "fused@-O1 -funroll-loops")}
    assert {r["build"] for r in doc["runs"]} == {"-O3", "-O1 -funroll-loops"}
    rows = list(csv.DictReader(io.StringIO(c.read_text())))
    assert {r["build"] for r in rows} == {"-O3", "-O1 -funroll-loops"}
    other = json.loads(t.read_text())["otherData"]
    assert "build[-O3]" in other and "attention[fused@-O3]" in other


def test_prebuilt_so_user_kernel(tmp_path):
    so = tmp_path / "mk.so"
    subprocess.run(build.compiler_command(None) + [
        "-shared", "-fPIC", "-O2", f"-I{build.INCLUDE_DIR}", str(EXAMPLE_KERNEL), "-o", str(so),
        "-lm"], check=True)
    doc = json_run("--kernel", str(so), "--context", "9", "--cache", "i8")
    u = doc["user_kernels"]["mk.so"]
    assert u["prebuilt"] is True and u["module"].startswith("_sdpa_probe_user_so")
    assert doc["checks"][0]["b"] == "user" and doc["checks"][0]["ok"]
