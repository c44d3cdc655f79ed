"""`probe info`: machine description, measured roofline, its cache.

No timed assertions: the machine is shared and noisy. Only sanity ranges and
one generous ratio (all threads vs one thread of FMA).
"""

from __future__ import annotations

import json
import shutil

import pytest
from test_roofline_load import QuietMonitor
from typer.testing import CliRunner

from sdpa_probe import machine, native
from sdpa_probe.cli import app

runner = CliRunner()


def _info(*args: str) -> dict:
    res = runner.invoke(app, ["info", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One measured `probe info --json` into an empty private cache (once per module:
    the native build cache stays where it is)."""
    d = tmp_path_factory.mktemp("roofline")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(machine, "roofline_dir", lambda: d)
        mp.setattr(machine, "LoadMonitor", QuietMonitor)  # (the test host's load aside)
        doc = _info()
    return d, doc


@pytest.fixture
def roof_dir(tmp_path, monkeypatch, measured):
    """A private roofline cache holding the module's measurement; the host counts as
    quiet (tests/test_roofline_load.py injects a busy one)."""
    d = tmp_path / "roofline"
    shutil.copytree(measured[0], d)
    monkeypatch.setattr(machine, "roofline_dir", lambda: d)
    monkeypatch.setattr(machine, "LoadMonitor", QuietMonitor)
    monkeypatch.setattr(machine, "BELOW_BEST_FRACTION", 0.0)  # (nor its memory's contention)
    return d


@pytest.fixture
def first(roof_dir, measured):
    return measured[1]


def test_json_structure(first):
    assert set(first) == {"machine", "roofline"}
    m, r = first["machine"], first["roofline"]
    for key in ("cpu_model", "arch", "isa", "logical_cores", "caches", "os", "compiler",
                "numpy", "torch", "default_threads"):
        assert key in m, key
    assert m["logical_cores"] >= 1 and m["default_threads"] >= 1
    assert set(m["caches"]) >= {"l1d_bytes", "l2_bytes", "l3_bytes"}
    assert all(isinstance(v, bool) for v in m["isa"].values())
    assert m["compiler"]["flags"] and m["compiler"]["version"]
    assert m["numpy"]
    for key in machine.ROOFLINE_KEYS:
        assert isinstance(r[key], (int, float)), key
    assert r["cached"] is False
    assert r["threads_all"] == m["default_threads"]


def test_sane_ranges(first):
    r = first["roofline"]
    assert 0.1 < r["read_bw_gbs_1t"] < 5000
    assert 0.1 < r["read_bw_gbs_all"] < 5000
    assert 0.1 < r["l2_read_bw_gbs"] < 50000
    assert 0.1 < r["fma_gflops_1t"] < 100000
    # all threads should not be slower than one, give or take a noisy neighbour; on a
    # machine the run itself found busy, others take the threads' CPUs (no comparison)
    quiet = not r["load"]["busy"]
    assert r["fma_gflops_all"] >= 0.6 * r["fma_gflops_1t"] or not quiet
    assert r["ridge_flops_per_byte_all"] > 0
    for dt in machine.CONVERT_DTYPES:  # elements converted per second: above 10 M, below FMA
        assert 0.01 < r[f"cvt_{dt}_gelems_1t"] < r["fma_gflops_1t"]
        assert r[f"cvt_{dt}_gelems_all"] >= 0.6 * r[f"cvt_{dt}_gelems_1t"] or not quiet
    d = r["details"]
    assert set(d) == set(machine.ROOFLINE_KEYS)
    for key, item in d.items():
        assert item["best"] >= item["median"] >= item["worst"] > 0, key
        assert item["reps"] >= 1
        assert len(item["round_bests"]) == r["plan"]["rounds"]
        assert max(item["round_bests"]) == item["best"]
    load = r["load"]
    assert isinstance(load["busy"], bool)
    if load["other_cpu_fraction"] is not None:
        assert 0 <= load["other_cpu_fraction"] <= 1.5
    assert d["read_bw_gbs_1t"]["threads"] == 1
    assert d["fma_gflops_all"]["threads"] == r["threads_all"]
    # the DRAM buffer is much larger than the L3, the L2 one fits the L2
    l3 = first["machine"]["caches"]["l3_bytes"]
    if l3:
        assert r["plan"]["dram_buffer_bytes"] >= 4 * l3 or r["plan"]["dram_buffer_bytes"] >= 2**28
    l2 = first["machine"]["caches"]["l2_bytes"]
    if l2:
        assert r["plan"]["l2_buffer_bytes"] <= l2


def test_second_call_is_cached(first, roof_dir, monkeypatch):
    def no_measure(*a, **kw):
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(machine, "measure", no_measure)
    second = _info()
    r1, r2 = first["roofline"], second["roofline"]
    assert r2["cached"] is True
    for key in (*machine.ROOFLINE_KEYS, "measured_at", "module"):
        assert r2[key] == r1[key], key
    assert list(roof_dir.glob("roofline_*.json")) != []
    # the module API other commands use sees the same numbers
    api = machine.roofline()
    assert api["cached"] is True and api["fma_gflops_1t"] == r1["fma_gflops_1t"]


def test_refresh_measures_again(first, monkeypatch):
    calls = []
    real = machine.measure

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(machine, "measure", counting)
    again = _info("--refresh")
    assert calls == [1]
    assert again["roofline"]["cached"] is False
    # the refreshed values replace the cache
    after = _info()
    assert after["roofline"]["cached"] is True
    assert after["roofline"]["measured_at"] == again["roofline"]["measured_at"]
    assert calls == [1]


def test_corrupt_cache_is_remeasured(first, roof_dir):
    (path,) = roof_dir.glob("roofline_*.json")
    path.write_text("{not json")
    again = _info()
    assert again["roofline"]["cached"] is False
    assert json.loads(path.read_text())["fma_gflops_1t"] == again["roofline"]["fma_gflops_1t"]


def test_human_output(first):
    res = runner.invoke(app, ["info"])
    assert res.exit_code == 0, res.output
    text = res.stdout
    for word in ("machine", "roofline", "DRAM read", "L2 read", "F32 FMA", "GB/s", "GFLOP/s",
                 first["machine"]["cpu_model"]):
        assert word in text, word
    assert "cached" in text


def test_parsers():
    assert machine._parse_size("32K") == 32768
    assert machine._parse_size("8192K") == 8 << 20
    assert machine._parse_size("1M") == 1 << 20
    assert machine._parse_size("bogus") is None
    assert machine._count_cpu_list("0-1") == 2
    assert machine._count_cpu_list("0,2,4-7\n") == 6


def test_a_busy_figure_in_the_cache_is_measured_again(first, roof_dir):
    (path,) = roof_dir.glob("roofline_*.json")
    data = json.loads(path.read_text())
    data["load"] = {"other_cpu_fraction": 0.5, "steal_fraction": 0.0, "busy": True}
    path.write_text(json.dumps(data))
    res = runner.invoke(app, ["info", "--json"])
    assert res.exit_code == 0, res.output
    roof = json.loads(res.stdout)["roofline"]
    assert roof["cached"] is False and roof["load"]["busy"] is False


def test_micro_benchmarks_refuse_bad_arguments_with_a_status():
    ffi, lib, _ = native.native_lib()
    r = ffi.new("sdpa_probe_mb_result *")
    einval = lib.SDPA_PROBE_MB_EINVAL
    assert lib.sdpa_probe_mb_fma(1, 1 << 12, 0, r) == einval  # no repetition
    assert lib.sdpa_probe_mb_fma(1, 1, 1, r) == einval  # fewer steps than tasks
    assert lib.sdpa_probe_mb_convert(native.F32, 1, 1 << 12, 1, r) == einval  # nothing to convert
    assert lib.sdpa_probe_mb_convert(native.I8, 1, 1 << 12, 1, ffi.NULL) == einval
    lanes = ffi.new("int32_t *")
    lib.sdpa_probe_mb_fma_config(ffi.NULL, lanes, ffi.NULL)  # the kernels' vector width
    for dt in (native.F16, native.BF16, native.I8):
        assert lib.sdpa_probe_mb_convert(dt, 1, 1 << 12, 2, r) == lib.SDPA_PROBE_MB_OK
        # a step converts 8 vectors: of 16 elements in an AVX-512 build, 8 otherwise
        per_step = 8 * (16 if lanes[0] == 16 else 8)
        assert r.best > 0 and r.reps == 2 and r.work == (1 << 12) // 8 * 8 * per_step


def test_a_ceiling_well_below_this_machines_best_counts_as_busy():
    first = {"read_bw_gbs_1t": 13.0, "read_bw_gbs_all": 24.0, "fma_gflops_1t": 40.0,
             "fma_gflops_all": 80.0, "load": {"busy": False}}
    best = {k: first[k] for k in machine.BEST_KEYS}
    r = machine.compare_with_best(dict(first), best)
    assert r["load"]["busy"] is False and r["load"]["below_best"] == {}
    # a contended host: DRAM at 75 % of the best, FMA unchanged; no CPU counter saw it
    r = machine.compare_with_best(first | {"read_bw_gbs_all": 18.0, "load": {}}, best)
    assert r["load"]["busy"] is True
    assert set(r["load"]["below_best"]) == {"read_bw_gbs_all"}
    assert r["load"]["below_best"]["read_bw_gbs_all"]["fraction"] == 0.75
    assert machine.compare_with_best(dict(first), {})["load"]["busy"] is False  # nothing yet


@pytest.mark.slow  # (two real roofline measurements)
def test_info_warns_when_the_host_is_below_its_best(roof_dir, monkeypatch):
    monkeypatch.setattr(machine, "BELOW_BEST_FRACTION", 0.85)
    # another build's roofline, measured on a quiet host, is in the cache
    quiet = json.loads(next(roof_dir.glob("roofline_*.json")).read_text())
    (roof_dir / "roofline_otherbuild.json").write_text(json.dumps(
        quiet | {"read_bw_gbs_all": 4 * quiet["read_bw_gbs_all"]}))
    assert machine.best_ceilings()["read_bw_gbs_all"] == 4 * quiet["read_bw_gbs_all"]
    assert quiet["build_flags"] == list(native.native_lib()[2].flags)
    res = runner.invoke(app, ["info", "--refresh"])
    assert res.exit_code == 0, res.output
    assert "read_bw_gbs_all" in res.stderr and "best" in res.stderr
    # the measurement below the best is not kept: the quiet one stays this machine's
    assert machine.load_cached()["measured_at"] == quiet["measured_at"]
    r = machine.roofline(refresh=True)
    assert "read_bw_gbs_all" in r["busy_measurement"]["below_best"]


def test_compute_ceilings_are_compared_only_with_the_same_builds(roof_dir):
    # an AVX2 build's FMA loop runs half as wide as an AVX-512 build's on the same
    # CPU: that is no sign of a busy host; DRAM bandwidth is the machine's
    quiet = json.loads(next(roof_dir.glob("roofline_*.json")).read_text())
    flags = quiet["build_flags"]
    (roof_dir / "roofline_wider.json").write_text(json.dumps(
        quiet | {"build_flags": flags + ["-mavx512f"],
                 "fma_gflops_all": 2 * quiet["fma_gflops_all"],
                 "read_bw_gbs_all": 2 * quiet["read_bw_gbs_all"]}))
    best = machine.best_ceilings(flags)
    assert best["fma_gflops_all"] == quiet["fma_gflops_all"]
    assert best["read_bw_gbs_all"] == 2 * quiet["read_bw_gbs_all"]
    wider = machine.best_ceilings(flags + ["-mavx512f"])
    assert wider["fma_gflops_all"] == 2 * quiet["fma_gflops_all"]
    # a roofline cached before build_flags was recorded counts for the bandwidths only
    old = {k: v for k, v in quiet.items() if k != "build_flags"}
    (roof_dir / "roofline_old.json").write_text(json.dumps(old | {"fma_gflops_1t": 9e9}))
    assert machine.best_ceilings(flags)["fma_gflops_1t"] == quiet["fma_gflops_1t"]
