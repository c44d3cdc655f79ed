"""`probe profile` on tiny shapes: the JSON / CSV / trace contracts, the decode graphs'
agreement, bad input. No assertion depends on how fast anything ran."""

import csv
import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sdpa_probe.cli import app
from sdpa_probe.profile import decode, models, runner, stats

cli = CliRunner()
TINY = ["--custom", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
        "--head-dim", "16", "--ffn", "96", "--vocab", "200"]
FAST = ["--steps", "3", "--warmup", "1", "--threads", "1", "--no-roofline"]
DECOMPOSED_OPS = {"kv_read_cast", "rope_window", "gqa_broadcast", "pack_k", "qk_matmul",
                  "softmax", "pv_matmul", "rope_q"}
COMMON_OPS = {"embed", "attn_norm", "q_proj", "k_proj", "v_proj", "kv_write", "o_proj",
              "attn_residual", "ffn_norm", "gate_proj", "up_proj", "silu_gate", "down_proj",
              "ffn_residual", "final_norm", "lm_head", "argmax"}


def run(*args):
    return cli.invoke(app, ["profile", *args])


def json_run(*args):
    res = run(*TINY, *FAST, "--json", "-", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


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


def test_csv_and_trace(tmp_path):
    c, t = tmp_path / "p.csv", tmp_path / "t.json"
    res = run(*TINY, *FAST, "--attention", "decomposed", "--context", "12", "--csv", str(c),
              "--trace", str(t))
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(c.read_text())))
    assert {r["op"] for r in rows} == COMMON_OPS | DECOMPOSED_OPS | {"(unattributed)"}
    assert all(r["attention"] == "decomposed" and r["context"] == "12" for r in rows)
    float(rows[0]["median_ms"]), float(rows[0]["gb_s"])
    trace = json.loads(t.read_text())
    ev = trace["traceEvents"]
    ops = [e for e in ev if e.get("ph") == "X" and e["cat"] != "step"]
    steps = [e for e in ev if e.get("ph") == "X" and e["cat"] == "step"]
    assert len(steps) == 3
    n_ops = 1 + 2 * 21 + 3  # embed, 21 ops per decomposed layer, final norm / lm head / argmax
    assert len(ops) == 3 * n_ops
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ops)
    assert any(e["name"] == "process_name" for e in ev if e["ph"] == "M")


def test_pp_tg_and_kernel_slot():
    doc = json_run("--attention", "flash_maskskip", "--context", "10", "--pp", "4", "--tg", "3")
    assert doc["kernels"]["flash_maskskip"] == "flash_maskskip"
    assert doc["pp"][0]["tokens"] == 4 and doc["pp"][0]["tokens_per_s"] > 0
    assert doc["tg"][0]["start"] == 10 and doc["tg"][0]["tokens"] == 3
    assert doc["capacity"] >= 13


@pytest.mark.parametrize("cache", ["f32", "f16", "i8"])
@pytest.mark.parametrize("weights", ["f32", "f16"])
def test_decomposed_and_fused_agree(cache, weights):
    shape = models.ModelShape("t", 2, 64, 6, 2, 16, 96, 150)
    model = decode.DecodeModel(shape, weights, seed=3, threads=1)
    fused = runner.resolve_attention("fused", cache)
    states = [decode.DecodeState(model, decode.GRAPH_DECOMPOSED, -1, cache, 64, 1),
              decode.DecodeState(model, fused.graph, fused.kernel_index, cache, 64, 1)]
    for st in states:
        st.fill_history(0, 64, 11)
    outs = []
    for st in states:
        tok = 5
        for pos in (40, 41, 42):  # a few greedy steps: each graph extends its own cache
            st.step(tok, pos, timed=False, logits=True)
            tok = 7
        outs.append(st.last_logits.copy())
    rms = np.sqrt(np.mean(outs[1].astype(np.float64) ** 2))
    assert np.isfinite(outs[0]).all() and rms > 0
    assert np.max(np.abs(outs[0] - outs[1])) / rms < runner.CHECK_TOL[cache]
    # same seed, same model: a second step reproduces the logits exactly
    st = states[1]
    st.fill_history(40, 43, 11)
    for pos in (40, 41, 42):
        st.step(5 if pos == 40 else 7, pos, timed=False, logits=True)
    np.testing.assert_array_equal(st.last_logits, outs[1])
    for st in states:
        st.close()
    model.close()


def test_step_records_cover_the_step():
    shape = models.ModelShape("t", 3, 32, 4, 1, 8, 64, 50)
    model = decode.DecodeModel(shape, "f32", threads=1)
    st = decode.DecodeState(model, decode.GRAPH_DECOMPOSED, -1, "f16", 16, 1)
    assert len(st.ops) == 1 + 3 * 21 + 3
    assert [o.layer for o in st.ops[:2]] == [-1, 0] and st.ops[-1].name == "argmax"
    wall, native_ns, rec, nxt = st.step(1, 5)
    assert rec.shape == (len(st.ops), 4) and 0 <= nxt < 50
    starts, durs = rec[:, 0], rec[:, 1]
    assert (durs >= 0).all() and (np.diff(starts) >= 0).all()
    assert durs.sum() <= native_ns <= wall
    st.close()
    model.close()


@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt-17"], "unknown model preset"),
    (["--custom", "--layers", "2", "--hidden", "64", "--heads", "6", "--kv-heads", "4",
      "--head-dim", "16", "--ffn", "64"], "not a multiple of kv heads"),
    (["--custom", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
      "--head-dim", "15", "--ffn", "64"], "even head_dim"),
    (["--custom", "--layers", "2"], "--custom needs"),
    (TINY + ["--context", "100", "--cache-size", "64"], "larger than the cache"),
    (TINY + ["--context", "10,x"], "comma-separated integers"),
    (TINY + ["--attention", "nope"], "unknown attention"),
    (TINY + ["--cache", "i8", "--attention", "flash"], "does not read a i8 cache"),
    (TINY + ["--ab", "fused"], "two attention graphs"),
    (TINY + ["--ab", "decomposed,fused", "--attention", "fused"], "drop --attention"),
    (TINY + ["--weights", "bf16"], "--weights"),
    (["--custom", "--layers", "200", "--hidden", "16384", "--heads", "128", "--kv-heads", "8",
      "--head-dim", "128", "--ffn", "65536"], "out of memory"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    res = run(*args, "--no-roofline")
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith("error:")


def test_presets_match_the_issue():
    p = models.PRESETS
    assert (p["smollm2-135m"].layers, p["smollm2-135m"].hidden, p["smollm2-135m"].heads,
            p["smollm2-135m"].kv_heads, p["smollm2-135m"].head_dim,
            p["smollm2-135m"].ffn) == (30, 576, 9, 3, 64, 1536)
    q = p["qwen2.5-0.5b"]
    assert (q.layers, q.hidden, q.heads, q.kv_heads, q.head_dim, q.ffn) == (24, 896, 14, 2, 64,
                                                                             4864)
    ll = p["llama-3.2-1b"]
    assert (ll.layers, ll.hidden, ll.heads, ll.kv_heads, ll.head_dim, ll.ffn) == (16, 2048, 32, 8,
                                                                                64, 8192)
    assert "openelm-270m" in p
    assert 1.0e9 < ll.params() < 1.5e9  # ~1.24B with the tied 128k-vocab head


def test_stats_verdicts():
    rng = np.random.default_rng(0)
    a = 2.0 + 0.01 * rng.standard_normal(30)
    b = 1.0 + 0.01 * rng.standard_normal(30)
    ratio, lo, hi = stats.bootstrap_ratio_ci(a, b)
    assert lo <= ratio <= hi and stats.verdict(lo, hi) == "faster"
    ratio, lo, hi = stats.bootstrap_ratio_ci(b, a)
    assert stats.verdict(lo, hi) == "slower"
    ratio, lo, hi = stats.bootstrap_ratio_ci(a, a[::-1].copy())
    assert stats.verdict(lo, hi) == "no significant difference"
    assert stats.slope_per_1000([100, 1000, 2000], [1.0, 10.0, 20.0]) == pytest.approx(10.0)


def test_live_view_then_final_table():
    res = run(*TINY, *FAST, "--attention", "decomposed", "--context", "9", "--live")
    assert res.exit_code == 0, res.output
    assert "sum of ops" in res.stdout and "unattributed" in res.stdout


# ---- context grammar, charts, user kernels, builds, metadata, interactive ---------------

def test_context_lists_and_ranges():
    p = runner.parse_contexts
    assert p("100,1000,2000") == (100, 1000, 2000)
    assert p("500:4000:500") == (500, 1000, 1500, 2000, 2500, 3000, 3500, 4000)  # stop included
    assert p("0:10:3") == (0, 3, 6, 9)  # stop only when on the grid
    assert p("2000, 100:300:100,100") == (100, 200, 300, 2000)  # mixed, sorted, deduplicated
    assert p("1_000") == (1000,)


@pytest.mark.parametrize("text,needle", [
    ("10:5:1", "STOP is below START"), ("0:10:0", "STEP must be positive"),
    ("1:2", "START:STOP:STEP"), ("0:100000:1", "more than 256"), (",", "empty"),
])
def test_context_range_errors(text, needle):
    res = run(*TINY, "--no-roofline", "--context", text)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1


def _svg_panels(path):
    import xml.etree.ElementTree as ET

    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(path).getroot()  # raises on malformed XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    panels = {}
    for g in root.findall("s:g[@class='panel']", ns):
        lines = g.findall(".//s:polyline[@class='series']", ns)
        legend = [e.get("data-op") for e in g.findall("s:g[@class='legend-entry']", ns)]
        names = [pl.get("data-op") for pl in lines]
        assert names == legend and len(set(names)) == len(names)  # one series per op shown
        for pl in lines:
            pts = [tuple(map(float, xy.split(","))) for xy in pl.get("points").split()]
            assert all(np.isfinite(v) for xy in pts for v in xy)
            assert [x for x, _ in pts] == sorted(x for x, _ in pts)
        panels[g.get("data-attention")] = {n: len(pl.get("points").split())
                                           for n, pl in zip(names, lines, strict=True)}
    return root, panels


def test_range_sweep_draws_and_saves_a_chart(tmp_path):
    svg, js = tmp_path / "sweep.svg", tmp_path / "sweep.json"
    res = run(*TINY, *FAST, "--ab", "decomposed,fused", "--context", "8:24:8", "--chart",
              str(svg), "--chart-top", "4", "--json", str(js))
    assert res.exit_code == 0, res.output
    assert "median ms per step of the top 4 ops by context" in res.stdout
    assert "context (tokens)" in res.stdout
    doc = json.loads(js.read_text())
    assert doc["contexts"] == [8, 16, 24]
    root, panels = _svg_panels(svg)
    assert set(panels) == {"decomposed", "fused"}
    for label, series in panels.items():
        assert len(series) == 4 and all(n == 3 for n in series.values())
        last = {o["name"]: o["median_ms"] for o in doc["sweep"][-1]["runs"][label]["ops"]}
        # the top ops at the largest context; equal medians (timer ticks) may go either way
        shown, rest = [last[n] for n in series], [last[n] for n in last if n not in series]
        assert set(series) <= set(last) and min(shown) >= max(rest)
    text = "".join(root.itertext())
    assert "machine:" in text and "build:" in text


def test_chart_by_kind(tmp_path):
    svg = tmp_path / "k.svg"
    res = run(*TINY, *FAST, "--attention", "decomposed", "--context", "8,16", "--chart",
              str(svg), "--chart-by", "kind", "--chart-top", "20")
    assert res.exit_code == 0, res.output
    _, panels = _svg_panels(svg)
    assert set(panels["decomposed"]) == {"gemv", "broadcast", "pack", "matmul", "cast",
                                         "softmax", "rope", "elementwise", "norm", "cache",
                                         "sample", "embed"}


@pytest.mark.parametrize("args,needle", [
    (["--context", "10", "--chart", "c.svg"], "two or more contexts"),
    (["--context", "10,20", "--chart", "c.png"], "give a .svg path"),
    (["--context", "10,20", "--chart-by", "layer"], "--chart-by"),
    (["--kernel", "nope.c"], "kernel file not found"),
    (["--kernel", "k.txt"], ".c, .cpp or .so"),
    (["--attention", "user"], "--kernel PATH"),
    (["--attention", "fused@"], "no compiler flags after @"),
    (["--interactive"], "needs a terminal on stdin"),
    (["--interactive", "--script", "--ab", "decomposed,fused"], "drop --ab"),
    (["--script"], "only goes with --interactive"),
])
def test_more_bad_input(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.txt").write_text("")
    res = run(*TINY, *FAST, *args)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith("error:")


def test_user_kernel_in_the_attention_slot(tmp_path):
    from conftest import EXAMPLE_KERNEL

    doc = json_run("--kernel", str(EXAMPLE_KERNEL), "--context", "12")
    assert doc["graph"] == "user" and doc["kernels"] == {"user": "user:minimal_sdpa.c"}
    assert "sdpa" in {o["name"] for o in doc["ops"]}
    uk = doc["user_kernels"]["user:minimal_sdpa.c"]
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
    from conftest import EXAMPLE_KERNEL

    from sdpa_probe import caller_state

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


@pytest.mark.parametrize("value,status,needle", [
    ("0.0f", "SDPA_OK", "user (user:wrong.c) disagrees with decomposed at context 12"),
    ("0.0f", "SDPA_UNSUPPORTED", "attention user (user:wrong.c) failed at context 12"),
])
def test_a_wrong_user_kernel_stops_the_run(tmp_path, value, status, needle):
    src = tmp_path / "wrong.c"
    src.write_text(WRONG_KERNEL % (value, status))
    res = run(*TINY, *FAST, "--kernel", str(src), "--context", "12", "--cache", "f32")
    assert res.exit_code == 2, res.output
    err = res.stderr.strip().splitlines()
    assert err[-1].startswith("error:") and needle in err[-1]
    assert "sum of ops" not in res.stdout


def test_ab_of_two_builds(monkeypatch, tmp_path):
    """--ab GRAPH@CFLAGS,GRAPH@CFLAGS: one native build per side (compiling is faked here
    with the default library; docs/profile.md has a real -O3 vs -O1 run)."""
    from sdpa_probe import native
    from sdpa_probe.profile import builds

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


def test_machine_and_build_context_everywhere(tmp_path):
    c, t, j = tmp_path / "p.csv", tmp_path / "t.json", tmp_path / "p.json"
    res = run(*TINY, *FAST, "--attention", "fused", "--context", "12", "--csv", str(c),
              "--trace", str(t), "--json", str(j))
    assert res.exit_code == 0, res.output
    doc = json.loads(j.read_text())
    m = doc["machine"]
    assert m["cpu"] and m["logical_cores"] >= 1 and m["threads"] == 1 == doc["threads"]
    assert m["abi_version"] == 1 and "sdpa_probe" in m
    b = doc["builds"]["default"]
    assert b["module"].startswith("_sdpa_probe_native_") and b["cc_version"] and b["flags"]
    assert doc["attention_builds"] == {"fused": "default", "decomposed": "default"}
    # the table header
    assert f"machine: {m['cpu']}" in res.stdout and "build: " in res.stdout
    assert b["module"] in res.stdout
    # CSV: every row carries the machine and build
    rows = list(csv.DictReader(io.StringIO(c.read_text())))
    assert all(r["cpu"] == m["cpu"] and r["module"] == b["module"] and r["threads"] == "1"
               and r["cflags"] == " ".join(b["flags"]) and r["build"] == "default"
               for r in rows)
    # Chrome trace: valid structure plus otherData and per-process labels
    trace = json.loads(t.read_text())
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] == "ms"
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int)
            assert e["name"] and e["cat"]
    assert {"process_name", "process_labels"} <= {e["name"] for e in trace["traceEvents"]
                                                  if e["ph"] == "M"}
    other = trace["otherData"]
    assert other["cpu"] == m["cpu"] and b["module"] in other["build[default]"]
    assert all(isinstance(v, str) for v in other.values())


def test_interactive_session_with_deltas_and_save(tmp_path):
    saved, final = tmp_path / "explored.json", tmp_path / "final.json"
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's notes")
    commands = "\n".join([
        "context 30",                         # run 2: the context changes
        "attention=decomposed, cache=f32",    # run 3: two settings on one line
        "bogus 1",                            # an error, and the loop goes on
        "model",                              # an odd number of words
        "threads 0",                          # run 4
        "",                                   # run 5: rerun as is
        f"save {saved}",
        f"save {notes}",                      # refused: not a report; the loop goes on
        "history",
        "quit",
        "context 99",                         # never read
    ]) + "\n"
    res = cli.invoke(app, ["profile", *TINY, *FAST, "--context", "20", "--interactive",
                           "--script", "--json", str(final)], input=commands)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.count("sum of ops") == 5
    for n in (1, 2, 3, 4):
        assert f"Δ ms vs #{n}" in out
    assert "new" in out  # decomposed ops the fused run did not have
    assert "after context 20 -> 30" in out and "attention fused -> decomposed" in out
    assert "runs so far" in out
    assert "error: unknown setting 'bogus'" in res.stderr
    assert "settings come in pairs" in res.stderr
    said = "".join(res.stderr.split())  # (wrapped to the terminal, paths too)
    assert "".join(f"cannot write the session to {notes}: it exists and is not one of "
                   "probe's reports".split()) in said
    assert notes.read_text() == "the user's notes"
    doc = json.loads(saved.read_text())
    assert doc["interactive"] is True and len(doc["runs"]) == 5
    r = doc["runs"]
    assert r[0]["changed"] == {} and r[0]["delta_step_ms"] is None
    assert r[1]["changed"] == {"context": ["20", "30"]} and r[1]["settings"]["context"] == "30"
    assert r[2]["changed"] == {"attention": ["fused", "decomposed"], "cache": ["f16", "f32"]}
    assert r[3]["settings"]["threads"] == 0 and r[4]["changed"] == {}
    assert all(isinstance(x["delta_step_ms"], float) for x in r[1:])
    assert r[2]["result"]["graph"] == "decomposed" and r[2]["result"]["cache"] == "f32"
    assert len(json.loads(final.read_text())["runs"]) == 5  # --json: written at the end


def test_interactive_ends_at_end_of_input():
    res = cli.invoke(app, ["profile", *TINY, *FAST, "--context", "9", "-i", "--script"],
                     input="attention nope\n")
    assert res.exit_code == 0, res.output
    assert res.stdout.count("sum of ops") == 1 and "unknown attention 'nope'" in res.stderr


def test_prebuilt_so_user_kernel(tmp_path):
    import subprocess

    from conftest import EXAMPLE_KERNEL

    from sdpa_probe import build

    so = tmp_path / "mk.so"
    subprocess.run(build.compiler_command(None) + [
        "-shared", "-fPIC", "-O2", f"-I{build.INCLUDE_DIR}", str(EXAMPLE_KERNEL), "-o", str(so),
        "-lm"], check=True)
    doc = json_run("--kernel", str(so), "--context", "9", "--cache", "i8")
    u = doc["user_kernels"]["user:mk.so"]
    assert u["prebuilt"] is True and u["module"].startswith("_sdpa_probe_user_so")
    assert doc["checks"][0]["b"] == "user" and doc["checks"][0]["ok"]
