"""`probe bench`: shape names, byte and FLOP counts, the JSON contract, and
regression guards on speed *ratios* measured side by side (never absolute
times): interleaved rounds, medians, generous margins, best of three attempts
so that a burst of other work on a shared machine does not fail the suite."""

import json

import numpy as np
import pytest
import torch
from conftest import needs_cxx
from typer.testing import CliRunner

from sdpa_probe import bench, native
from sdpa_probe.backends import is_kernel_file
from sdpa_probe.backends.executorch import _timed_inputs
from sdpa_probe.bench import host, timing
from sdpa_probe.bench.figures import roofline_figures
from sdpa_probe.cli import app, bench_cmd
from sdpa_probe.errors import ProbeError
from sdpa_probe.party import NativeParty

FAKE_ROOF = {"read_bw_gbs_1t": 10.0, "read_bw_gbs_all": 20.0, "l2_read_bw_gbs": 50.0,
             "fma_gflops_1t": 40.0, "fma_gflops_all": 80.0, "measured_at": "test"}


# ---- shapes ------------------------------------------------------------------------

def test_presets_cover_the_stated_shapes_and_names_round_trip():
    names = set(bench.PRESETS)
    assert len(names) == 30  # (4 decode kv + 1 prefill) x 2 head shapes x 3 dtypes
    for must in ("decode-h32kv8d64-kv8192-f32", "decode-h16kv16d128-kv32768-i8",
                 "decode-h32kv8d64-kv512-f16", "prefill-h32kv8d64-q512-kv512-causal-f32",
                 "prefill-h16kv16d128-q512-kv512-causal-i8"):
        assert must in names
    for name, shape in bench.PRESETS.items():
        assert shape.name == name
        assert bench.parse_shape(name) == shape


def test_custom_shapes_parse_and_bad_ones_are_refused():
    s = bench.parse_shape("decode-h8kv2d128-kv1000-bf16-b2")
    assert (s.n_heads, s.n_kv_heads, s.head_dim, s.q_len, s.kv_len, s.dtype, s.batch) == \
        (8, 2, 128, 1, 1000, "bf16", 2)
    assert not s.causal
    p = bench.parse_shape("prefill-h4kv4d64-kv300-f16")  # prefill: q_len = kv_len, causal
    assert p.q_len == 300 and p.causal and p.start_pos == 0
    c = bench.parse_shape("prefill-h4kv1d64-q16-kv300-causal-f32")  # a chunk on a cache
    assert c.q_len == 16 and c.start_pos == 284
    for bad in ("decode-h8kv3d64-kv10-f32", "decode-h8kv2d64-kv10-f64", "nonsense", ""):
        with pytest.raises(ProbeError):
            bench.select_shapes(bad)


def test_groups_select_presets():
    targets = {s.name for s in bench.select_shapes("targets")}
    assert {"decode-h32kv8d64-kv512-f32", "decode-h32kv8d64-kv2048-f32",
            "decode-h32kv8d64-kv8192-f32", "decode-h32kv8d64-kv8192-f16",
            "decode-h32kv8d64-kv8192-i8", "prefill-h32kv8d64-q512-kv512-causal-f32",
            "decode-h16kv16d128-kv8192-f32", "decode-h16kv16d128-kv8192-f16",
            "decode-h16kv16d128-kv8192-i8"} <= targets
    only16 = bench.select_shapes("decode", dtypes=["f16"])
    assert only16 and all(s.dtype == "f16" and s.kind == "decode" for s in only16)


def test_bytes_and_flops():
    s = bench.PRESETS["decode-h32kv8d64-kv8192-f32"]
    assert s.kv_bytes == 2 * 8192 * 8 * 64 * 4 == 33_554_432
    assert s.flops == 4 * 32 * 8192 * 64
    i8 = bench.PRESETS["decode-h32kv8d64-kv8192-i8"]
    assert i8.kv_bytes == 2 * 8192 * 8 * (64 + 5)  # + per-token scale and zero point
    p = bench.PRESETS["prefill-h32kv8d64-q512-kv512-causal-f32"]
    assert p.flops == 4 * 32 * 64 * (512 * 513 // 2)  # causal: only visible pairs


# ---- the measurement and its JSON ---------------------------------------------------

def test_bench_measures_the_real_computation():
    """The buffers the C timing loop runs on hold a correct result."""
    shape = bench.parse_shape("decode-h8kv2d64-kv300-f32")
    sets = bench.make_inputs(shape, n_sets=3)
    party = NativeParty(native.get_kernel("flash"), shape, sets, threads=2)
    assert len(party.run(7)) == 7  # rotates through the three sets
    for s in sets:
        q, k, v = (torch.from_numpy(x).permute(0, 2, 1, 3) for x in (s.q32, s.k32, s.v32))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        np.testing.assert_allclose(s.out, ref.permute(0, 2, 1, 3).numpy(), atol=1e-5)


def test_roofline_bound_counts_the_conversion_of_k_and_v():
    s = bench.PRESETS["decode-h16kv16d128-kv8192-i8"]
    assert s.kv_elements == 2 * 8192 * 16 * 128
    t_cvt = s.kv_elements / 1e9  # at 1 G elements/s: far slower than memory or FMA
    stats = {"median_us": 2 * t_cvt * 1e6}
    f = roofline_figures(s, stats, FAKE_ROOF | {"cvt_i8_gelems_all": 1.0}, threads=2)
    assert f["bound"] == "conversion" and f["roofline_pct"] == pytest.approx(50.0, abs=0.1)
    f = roofline_figures(s, stats, FAKE_ROOF, threads=2)  # a roofline without the rates
    assert f["bound"] in ("memory", "compute") and f["roofline_pct"] < 50.0
    f32 = bench.PRESETS["decode-h16kv16d128-kv8192-f32"]  # F32 converts nothing
    f = roofline_figures(f32, stats, FAKE_ROOF | {"cvt_f32_gelems_all": 1e-9}, threads=2)
    assert f["bound"] == "memory"


def test_json_contract():
    shapes = [bench.parse_shape("decode-h8kv2d64-kv512-f32"),
              bench.parse_shape("decode-h8kv2d64-kv512-i8")]
    doc = bench.run(shapes, peers=("torch",), threads=2, rounds=2, min_time=0.002,
                    roofline=FAKE_ROOF)
    json.dumps(doc)  # serialisable as is
    assert doc["mode"] == "warm" and doc["threads"] == 2
    assert [r["shape"] for r in doc["results"]] == [s.name for s in shapes]
    assert [r["kernel"] for r in doc["results"]] == ["flash", "quant_int8"]
    for r in doc["results"]:
        for key in ("kernel", "shape", "median_us", "iqr_us", "gb_s", "roofline_pct", "ratio"):
            assert key in r, key
        assert r["median_us"] > 0 and r["iqr_us"] >= 0 and r["gb_s"] > 0
        assert isinstance(r["roofline_pct"], float) and r["roofline_pct"] > 0
        # int8 (and F16, BF16): flash on the F32 twin shape timed in the same rounds
        assert set(r["ratio"]) == ({"torch"} if r["dtype"] == "f32" else {"torch", "flash@f32"})
        for peer in r["ratio"]:
            peer_us = r["peers"][peer]["median_us"]
            assert r["ratio"][peer] == pytest.approx(peer_us / r["median_us"], rel=1e-2)
    assert bench.ratio_columns(doc) == ["torch", "flash@f32"]
    for r in doc["results"]:  # the core's FMA rate of the same rounds, against the roofline's
        assert r["fma_gflops_same_run"] > 0
        assert r["fma_pct_same_run"] == pytest.approx(
            100 * r["fma_gflops_same_run"] / FAKE_ROOF["fma_gflops_all"], rel=0.01)
    for r in doc["results"]:  # decode: the DRAM read bandwidth of the same rounds
        assert r["read_gb_s_same_run"] > 0
        assert r["dram_pct_same_run"] == pytest.approx(
            100 * r["gb_s"] / r["read_gb_s_same_run"], rel=0.02)


def test_noisy_medians_are_marked_and_named_in_a_note(monkeypatch):
    assert bench.is_noisy({"median_us": 100.0, "iqr_us": 10.5})
    assert not bench.is_noisy({"median_us": 100.0, "iqr_us": 9.5})
    shape = bench.parse_shape("decode-h8kv2d64-kv512-f32")
    real = bench.summarize

    def spread(seconds):  # every party's rounds disagree by a third
        st = real(seconds)
        return st | {"iqr_us": st["median_us"] / 3}

    monkeypatch.setattr(timing, "summarize", spread)
    doc = bench.run([shape], peers=("torch",), threads=1, rounds=2, min_time=0.001,
                    roofline=FAKE_ROOF)
    (r,) = doc["results"]
    assert r["noisy"] and r["peers"]["torch"]["noisy"]
    (note,) = [n for n in doc["notes"] if n.startswith("noisy")]
    assert f"{shape.name} flash" in note and f"{shape.name} torch" in note
    assert set(doc["load"]) == {"other_cpu_fraction", "steal_fraction", "round_spread", "busy"}
    table = bench_cmd._table(doc)  # the noisy figures are drawn in yellow
    cells = list(zip(*table.rows, strict=True))
    assert cells[3][0].startswith("[yellow]") and cells[10][0].startswith("[yellow]")


def test_a_core_slower_than_the_roofline_says_is_noted():
    """The same-run FMA rate far under probe info's (as if the core had slowed): a note."""
    shape = bench.parse_shape("decode-h8kv2d64-kv512-f16")
    fast = FAKE_ROOF | {"fma_gflops_all": 1e6}
    doc = bench.run([shape], peers=(), threads=2, rounds=2, min_time=0.002, roofline=fast)
    (r,) = doc["results"]
    assert r["fma_pct_same_run"] < 100 * bench.SLOW_CORE
    (note,) = [n for n in doc["notes"] if n.startswith("the core ran slower")]
    assert shape.name in note
    doc = bench.run([shape], peers=(), threads=2, rounds=2, min_time=0.002, roofline=FAKE_ROOF)
    assert not any(n.startswith("the core ran slower") for n in doc["notes"])


def test_core_limit_extrapolates_the_l2_resident_time():
    core_us, limit = bench.core_limit(100.0, 1000, (100, 500), 10.0, 50.0)
    assert core_us == pytest.approx(100.0) and limit == "core"
    assert bench.core_limit(200.0, 1000, (100, 500), 10.0, 50.0)[1] == "memory"
    f32 = bench.parse_shape("decode-h8kv2d64-kv2048-f32")  # 1 KiB of K and V a key
    assert bench.core_lengths(f32, 512 << 10) == (64, 256)
    assert bench.core_lengths(f32, 64 << 20) is None       # the whole shape fits
    wide = bench.parse_shape("decode-h16kv16d128-kv8192-f32")  # 16 KiB of K and V a key
    assert bench.core_lengths(wide, 4 << 20) == (64, 128)
    assert bench.core_lengths(wide, 2 << 20) is None        # one L2-resident length only
    assert bench.core_lengths(f32, None) is None
    assert bench.core_lengths(bench.parse_shape("prefill-h8kv2d64-q128-kv2048-causal-f32"),
                              512 << 10) is None


def test_json_reports_the_measured_limit_of_a_decode(monkeypatch):
    monkeypatch.setattr(host, "l2_bytes_for", lambda threads: 512 << 10)
    doc = bench.run([bench.parse_shape("decode-h8kv2d64-kv2048-f32")], peers=(), threads=2,
                    rounds=2, min_time=0.002, roofline=FAKE_ROOF)
    (r,) = doc["results"]
    assert r["core_kv"] == [64, 256] and r["core_us"] > 0
    assert r["limit"] in ("core", "memory")
    assert (r["limit"] == "core") == (r["median_us"] <= bench.CORE_LIMIT_SLACK * r["core_us"])
    assert set(r["ratio"]) == set()  # the short runs are not peers


def test_cli_json_to_stdout_and_cold_mode():
    res = CliRunner().invoke(app, ["bench", "--shape", "decode-h4kv2d64-kv256-f16", "--vs",
                                   "torch", "--rounds", "2", "--min-time", "0.001", "--cold",
                                   "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["mode"] == "cold"
    (r,) = doc["results"]
    assert r["shape"] == "decode-h4kv2d64-kv256-f16" and r["kernel"] == "flash"
    assert "torch" in r["ratio"]


def test_a_cold_rotation_spans_the_llc_for_small_shapes_too():
    llc = 300 << 20  # the Xeon's L3: a cap of 64 sets would leave kv 512 rotating in it
    for name in ("decode-h32kv8d64-kv512-f32", "decode-h32kv8d64-kv8192-i8",
                 "decode-h32kv8d64-kv8192-f32"):
        s = bench.PRESETS[name]
        n = bench.cold_sets(s, llc)
        assert n * s.bytes >= bench.COLD_FACTOR * llc, name
        assert bench.rotation_note(s, n, llc) is None
    s = bench.PRESETS["decode-h32kv8d64-kv8192-i8"]
    n = bench.cold_sets(s, llc, avail_bytes=2 << 30)  # short of memory: fewer, and said
    assert 2 <= n and n * s.bytes <= (2 << 30) // bench.COLD_MEM_SHARE
    note = bench.rotation_note(s, n, llc)
    assert note and s.name in note and f"not {bench.COLD_FACTOR}x" in note


@pytest.mark.parametrize("dtype", ["f32", "f16", "i8"])
def test_every_input_set_is_its_own_memory_for_the_peers(dtype):
    """A cold rotation reads a new buffer each call, torch's and ExecuTorch's too (F32
    sets share one float32 array: handed over as is, every ExecuTorch call would read it)."""
    shape = bench.parse_shape(f"decode-h8kv2d64-kv300-{dtype}")
    sets = bench.make_inputs(shape, n_sets=3)
    torch_sets = [f.__defaults__ for f in bench.make_party("torch", shape, sets, 1)._fns]
    et_sets = [_timed_inputs(shape, s) for s in sets]  # (kept alive while compared)
    for tensors in (torch_sets, et_sets):
        ptrs = [t.data_ptr() for qkv in tensors for t in qkv[:3]]
        assert len(set(ptrs)) == len(ptrs) == 9


def test_cli_refuses_unknown_peer_and_shape():
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "--shape", "decode-h4kv2d64-kv64-f32", "--vs", "tvm"])
    assert res.exit_code == 2 and "unknown peer" in res.output
    res = runner.invoke(app, ["bench", "--shape", "decode-h4kv3d64-kv64-f32"])
    assert res.exit_code == 2 and "bad shape" in res.output


# ---- your own kernels: .c / .cpp / .so files, as kernels and as peers ------------------------

REFUSER = '#include "sdpa_probe.h"\nint sdpa_forward(const sdpa_args *a) { (void)a; return 1; }\n'


def test_a_user_kernel_is_timed_against_flash_in_the_same_rounds():
    from conftest import EXAMPLE_KERNEL

    shape = bench.parse_shape("decode-h4kv2d64-kv256-f32")
    doc = bench.run([shape], kernels=[str(EXAMPLE_KERNEL)], peers=["flash"], threads=2,
                    rounds=2, min_time=0.002, roofline=FAKE_ROOF)
    (r,) = doc["results"]
    assert r["kernel"] == "minimal_sdpa.c" and doc["peers"] == ["flash"]
    assert r["ratio"]["flash"] == pytest.approx(  # (ratios are rounded to 3 decimals)
        r["peers"]["flash"]["median_us"] / r["median_us"], rel=1e-2, abs=1e-3)


def test_a_kernel_that_leaves_its_caller_changed_is_put_back_and_said(tmp_path):
    """FTZ / DAZ on and an environment variable set on every call: every party after it
    would run so; each of its batches is followed by the caller put back, and a note."""
    from conftest import EXAMPLE_KERNEL

    from sdpa_probe import caller_state

    entry = "int st = sdpa_validate_args(a);"
    k = tmp_path / "ftz.c"
    k.write_text("#include <stdlib.h>\n#include <xmmintrin.h>\n" + EXAMPLE_KERNEL.read_text()
                 .replace(entry, "_mm_setcsr(_mm_getcsr() | 0x8040);"
                          ' setenv("SDPA_PROBE_BENCH_LEFT", "1", 1);\n  ' + entry))
    native.load_user_kernel(k)  # (built first: the build sets PLAT in the environment)
    before, fp = caller_state.read(), native.fp_control()
    doc = bench.run([bench.parse_shape("decode-h4kv2d64-kv64-f32")], kernels=[str(k)],
                    peers=["flash"], threads=1, rounds=2, min_time=0.002, roofline=FAKE_ROOF)
    assert native.fp_control() == fp and caller_state.changes(before, caller_state.read()) == []
    (note,) = [n for n in doc["notes"] if "left its caller changed" in n]
    assert note.startswith("ftz.c left its caller changed (")
    assert "SDPA_PROBE_BENCH_LEFT set to '1'" in note and "flush-to-zero on" in note


@needs_cxx
def test_a_cxx_kernel_against_its_c_twin():
    """The C++ port of the minimal kernel as a kernel, the C one as its peer."""
    from conftest import EXAMPLE_KERNEL

    cxx = str(EXAMPLE_KERNEL.with_name("minimal_sdpa.cpp"))
    assert is_kernel_file("k.cpp") and is_kernel_file("k.cc")
    doc = bench.run([bench.parse_shape("decode-h4kv2d64-kv128-f32")], kernels=[cxx],
                    peers=[str(EXAMPLE_KERNEL)], threads=1, rounds=2, min_time=0.002,
                    roofline=FAKE_ROOF)
    (r,) = doc["results"]
    assert r["kernel"] == "minimal_sdpa.cpp"
    assert list(r["ratio"]) == ["minimal_sdpa.c"] and r["ratio"]["minimal_sdpa.c"] > 0


def test_two_versions_of_a_kernel_file_are_told_apart(tmp_path):
    from conftest import EXAMPLE_KERNEL

    for d in ("old", "new"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "k.c").write_text(EXAMPLE_KERNEL.read_text())
    new, old = str(tmp_path / "new" / "k.c"), str(tmp_path / "old" / "k.c")
    doc = bench.run([bench.parse_shape("decode-h4kv2d64-kv128-f32")], kernels=[new],
                    peers=[old], threads=1, rounds=2, min_time=0.002, roofline=FAKE_ROOF)
    (r,) = doc["results"]
    assert r["kernel"] == "k.c" and list(r["ratio"]) == [old]
    with pytest.raises(ProbeError, match="given twice"):
        bench.resolve_kernels(["flash", "flash"])


def test_a_kernel_that_refuses_a_shape_is_left_out_with_the_reason(tmp_path):
    refuser = tmp_path / "refuser.c"
    refuser.write_text(REFUSER)
    shape = bench.parse_shape("decode-h4kv2d64-kv128-f16")
    doc = bench.run([shape], kernels=[str(refuser)], peers=[], threads=1, rounds=1,
                    min_time=0.0, roofline=FAKE_ROOF)
    assert doc["results"] == [] and doc["untimed"] == ["refuser.c"]
    assert any("refuser.c returned SDPA_UNSUPPORTED" in n for n in doc["notes"])
    # the command: nothing timed for a kernel asked for is a usage error, not a result
    res = CliRunner().invoke(app, ["bench", "--kernel", str(refuser), "--vs", "flash",
                                   "--shape", "decode-h4kv2d64-kv128-f32", "--rounds", "1",
                                   "--min-time", "0"])
    assert res.exit_code == 2, res.output
    assert "refuser.c took none of the shapes" in res.output
    doc = bench.run([shape], peers=[str(refuser), "quant_int8"], threads=1, rounds=1,
                    min_time=0.0, roofline=FAKE_ROOF)
    (r,) = doc["results"]
    assert r["peer_skipped"] == {"refuser.c": "returned SDPA_UNSUPPORTED",
                                 "quant_int8": "no f16 path"}


def test_cli_times_a_kernel_file_and_refuses_a_missing_one(tmp_path):
    from conftest import EXAMPLE_KERNEL

    runner = CliRunner()
    res = runner.invoke(app, ["bench", "--shape", "decode-h4kv2d64-kv64-f32", "--kernel",
                              str(EXAMPLE_KERNEL), "--vs", "flash", "--rounds", "1",
                              "--min-time", "0", "--json", "-"])
    assert res.exit_code == 0, res.output
    (r,) = json.loads(res.stdout)["results"]
    assert r["kernel"] == "minimal_sdpa.c" and "flash" in r["ratio"]
    res = runner.invoke(app, ["bench", "--shape", "decode-h4kv2d64-kv64-f32", "--kernel",
                              str(tmp_path / "missing.c")])
    assert res.exit_code == 2 and "not found" in res.output
    assert "Traceback" not in res.output


# ---- regression guards: ratios only --------------------------------------------------

def test_cross_dtype_targets_use_the_ratio_measured_in_the_same_rounds():
    d8 = "decode-h32kv8d64-kv8192"

    def res(shape, kernel, us, ratio):
        return {"shape": shape, "kernel": kernel, "median_us": us, "ratio": ratio,
                "kv_gb_s": 10.0}

    doc = {"threads": 2, "roofline": FAKE_ROOF, "results": [
        res(f"{d8}-f32", "flash", 4000.0, {"torch": 3.0}),  # a disturbed F32 run
        res(f"{d8}-f16", "flash", 2000.0, {"torch": 20.0, "flash@f32": 1.2}),
        res(f"{d8}-i8", "quant_int8", 2000.0, {"torch": 2.0})]}  # no same-run reference
    got = {t["target"]: t for t in bench.check_targets(doc)}
    f16 = got["flash f16 decode kv8192 vs flash f32"]
    assert f16["value"] == 1.2 and f16["met"] is False  # not 4000 / 2000 = 2.0
    i8 = got["quant_int8 decode kv8192 vs flash f32"]
    assert i8["value"] == 2.0  # falls back to the medians of the two runs
    assert got["quant_int8 decode kv8192 vs flash f32 (16, 16, 128)"]["met"] is None


def test_cli_reports_the_targets_it_measured_only_with_goals(tmp_path):
    """With --goals, the JSON's "targets": the kernel-speed targets of the shapes this run
    timed, printed as a last table; none (and no table) for shapes no target names.
    Without --goals: no table, no key, no word of them."""
    out = tmp_path / "b.json"
    base = ["bench", "--vs", "torch", "--rounds", "1", "--min-time", "0", "--no-allocs",
            "--json", str(out)]
    res = CliRunner().invoke(app, [*base, "--goals", "--shape", "decode-h32kv8d64-kv512-f32"])
    assert res.exit_code == 0, res.output
    (t,) = json.loads(out.read_text())["targets"]
    assert t["target"] == "flash f32 decode kv512 vs torch" and t["goal"] == 1.0
    assert t["unit"] == "x" and t["met"] == (t["value"] >= 1.0)
    assert "kernel-speed targets measured in this run (warm" in res.output
    res = CliRunner().invoke(app, [*base, "--goals", "--shape", "decode-h32kv8d64-kv1024-f32"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["targets"] == []
    assert "kernel-speed targets" not in res.output
    res = CliRunner().invoke(app, [*base, "--shape", "decode-h32kv8d64-kv512-f32"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "targets" not in json.loads(text) and "goal" not in text
    assert "target" not in res.output and "goal" not in res.output


@pytest.mark.parametrize("command", ["bench", "profile", "run", "repro"])
def test_a_kernel_that_prints_leaves_the_json_on_stdout_whole(tmp_path, command):
    """A user kernel's printf (here without a newline, so it sits in the C buffer) goes
    to stderr: with --json - stdout is one JSON document."""
    import subprocess
    import sys

    from conftest import EXAMPLE_KERNEL

    src = EXAMPLE_KERNEL.read_text().replace("#include <math.h>",
                                             "#include <math.h>\n#include <stdio.h>", 1)
    entry = "int sdpa_forward(const sdpa_args *a) {"
    assert src.count(entry) == 1
    chatty = tmp_path / "chatty.c"
    chatty.write_text(src.replace(entry, entry + '\n  printf("chatty kernel");'))
    args = {"bench": ["bench", "--kernel", str(chatty), "-s", "decode-h4kv2d64-kv256-f32", "--vs",
                      "flash", "--rounds", "2", "--min-time", "0.001", "--no-allocs"],
            "profile": ["profile", "-m", "smollm2-135m", "--layers", "1", "--kernel",
                        str(chatty), "-c", "32", "-n", "2", "--warmup", "1", "--json", "-"],
            "run": ["run", "--kernel", str(chatty), "--heads", "4", "--kv-heads", "2",
                    "--kv-len", "64", "--json"],
            "repro": ["check", "--kernel", str(chatty), "--repro",
                      "decode-h8gqa4-q1-kv129-d64-f32", "--json", "-"]}[command]
    if command == "bench":
        args += ["--json", "-"]
    r = subprocess.run([sys.executable, "-c", "from sdpa_probe.cli import main; main()",
                        *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    json.loads(r.stdout)
    assert "chatty kernel" in r.stderr and "chatty kernel" not in r.stdout
