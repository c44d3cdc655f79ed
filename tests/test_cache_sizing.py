"""KV-cache sizing: the ring / sink simulation, the closed form, policies, `probe sizing`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sdpa_probe import sizing
from sdpa_probe.cli import app
from sdpa_probe.sizing import suite

runner = CliRunner()


# ---- the simulation's own correctness ---------------------------------------------

GRID = [(w, s, c) for w in (1, 2, 5, 8) for s in (0, 3) for c in (1, 3, 7)]


@pytest.mark.parametrize("w,s,c", GRID)
def test_closed_form_equals_simulated_minimum(w, s, c):
    for n in (None, s + w + 2):
        wl = sizing.CacheWorkload(w, c, sink=s, context=n)
        sim = sizing.Simulator(wl)
        m = sim.minimum()
        assert m == sizing.closed_form_minimum(w, s, c, n), wl
        at = sim.run(m)
        assert at.exact and at.agree and at.complete
        assert at.max_err < 1e-5
        if m > 1:
            below = sim.run(m - 1)
            assert not below.exact, wl
            assert below.agree  # the wrong query is exactly the one missing a key
            assert below.position == below.missing_position
            assert below.max_err > 10 * sizing.ATOL


@pytest.mark.parametrize("wl", [sizing.CacheWorkload(5, 7),
                                sizing.CacheWorkload(6, 4, sink=2),
                                sizing.CacheWorkload(6, 9, sink=3, context=15),
                                sizing.CacheWorkload(16, 24, context=30)])
def test_full_size_cache_is_always_exact(wl):
    sim = sizing.Simulator(wl, seed=3)
    full = wl.context if wl.context is not None else wl.horizon
    for size in (full, full + 1, 3 * full):
        r = sim.run(size)
        assert r.exact and r.agree and r.max_err < 1e-5, (wl, size)


def test_one_slot_below_minimum_is_wrong_under_some_schedule():
    wl = sizing.CacheWorkload(16, 24, sink=4)
    sim = sizing.Simulator(wl, seed=1)
    m = sizing.closed_form_minimum(16, 4, 24, None)
    r = sim.run(m - 1)
    assert not r.exact
    assert r.schedule is not None and r.schedule_description
    # the failing schedule alone reproduces it
    sched = [sc for sc in sim.schedules if sc.name == r.schedule]
    again = sim.run(m - 1, schedules=sched)
    assert again.position == r.position
    assert sim.run(m).exact


def test_random_schedules_never_break_the_closed_form():
    """Schedules outside the adversarial set (random chunk lengths <= C): the closed-form size
    is exact for every one, and below it outputs and slot map always agree."""
    rng = np.random.default_rng(7)
    for _ in range(6):
        w, s, c = int(rng.integers(1, 9)), int(rng.integers(0, 4)), int(rng.integers(1, 9))
        wl = sizing.CacheWorkload(w, c, sink=s)
        sim = sizing.Simulator(wl, seed=int(rng.integers(100)))
        scheds = []
        for i in range(12):
            chunks, left = [], wl.horizon
            while left:
                chunks.append(min(left, int(rng.integers(1, c + 1))))
                left -= chunks[-1]
            scheds.append(sizing.Schedule(f"random{i}", "random", tuple(chunks)))
        m = sizing.closed_form_minimum(w, s, c, None)
        assert sim.run(m, schedules=scheds).exact, wl
        for size in range(max(1, m - 3), m):
            assert sim.run(size, schedules=scheds).agree


def test_cache_write_semantics():
    wl = sizing.CacheWorkload(4, 10, sink=2)
    sim = sizing.Simulator(wl)
    cache = sizing.RingCache(sim, 8)  # 2 sink slots + a ring of 6
    cache.write(0, 10)         # longer than the ring: only the last 6 non-sinks stay
    assert list(cache.slot_pos[:2]) == [0, 1]
    assert sorted(cache.slot_pos[2:]) == [4, 5, 6, 7, 8, 9]
    for slot in range(2, 8):
        p = cache.slot_pos[slot]
        assert slot == 2 + (p - 2) % 6
        np.testing.assert_array_equal(cache.k[0, slot], sim.k[0, p])
    cache.write(10, 1)
    assert 10 in cache.slot_pos and 4 not in cache.slot_pos
    tiny = sizing.RingCache(sim, 1)   # smaller than the sinks: keeps what fits
    tiny.write(0, 5)
    assert list(tiny.slot_pos) == [0]


def test_visibility_semantics():
    wl = sizing.CacheWorkload(3, 1, sink=2)
    q = np.array([0, 4, 10])
    k = np.arange(11)
    vis = wl.visible(q, k)
    assert list(np.flatnonzero(vis[0])) == [0]
    assert list(np.flatnonzero(vis[1])) == [0, 1, 2, 3, 4]  # window (1, 4] plus sinks
    assert list(np.flatnonzero(vis[2])) == [0, 1, 8, 9, 10]
    assert list(wl.needed(q)) == [1, 5, 5]
    assert not wl.visible(np.array([5]), np.array([-1]))[0, 0]  # empty slot


def test_fast_mask_equals_the_definition():
    rng = np.random.default_rng(5)
    for _ in range(20):
        w, s, c = int(rng.integers(1, 9)), int(rng.integers(0, 4)), int(rng.integers(1, 9))
        wl = sizing.CacheWorkload(w, c, sink=s)
        sim = sizing.Simulator(wl)
        cache = sizing.RingCache(sim, int(rng.integers(1, wl.horizon + 1)))
        pos = 0
        while pos < wl.horizon:
            n = min(int(rng.integers(1, c + 1)), wl.horizon - pos)
            cache.write(pos, n)
            np.testing.assert_array_equal(cache.visible(pos, n),
                                          wl.visible(np.arange(pos, pos + n), cache.slot_pos))
            pos += n


def test_adversarial_schedules_cover_the_brief():
    wl = sizing.CacheWorkload(8, 6, sink=2)
    scheds = sizing.adversarial_schedules(wl)
    lengths = {c for sc in scheds for c in sc.chunks}
    assert lengths >= set(range(1, 7)) and max(lengths) == 6
    for sc in scheds:
        assert sum(sc.chunks) <= wl.horizon and all(1 <= c <= 6 for c in sc.chunks)
    names = {sc.name for sc in scheds}
    assert {"fill9-c6", "fill10-c6", "uniform-c1"} <= names          # window fills, decode
    assert any(n.endswith("-decode") for n in names)                  # decode after prefill
    assert {f"offset{o}-c6" for o in range(6)} <= names               # every start mod C
    assert len({sc.chunks for sc in scheds}) == len(scheds)
    # past EXHAUSTIVE_UP_TO, offsets and lengths are sampled unless asked for every one
    big = sizing.CacheWorkload(8, 200)
    sampled = sizing.adversarial_schedules(big)
    every = sizing.adversarial_schedules(big, exhaustive=True)
    assert len(sampled) < len(every)
    assert {c for sc in every for c in sc.chunks} == set(range(1, 201))
    names = {sc.name for sc in sampled}
    assert {"uniform-c1", "uniform-c199", "offset0-c200", "offset7-c200"} <= names


@pytest.mark.parametrize("kernel", ["decomposed", "flash_maskskip", "quant_int8"])
def test_other_kernels_find_the_same_minimum(kernel):
    wl = sizing.CacheWorkload(6, 5, sink=1)
    sim = sizing.Simulator(wl, kernel)
    assert sim.int8 == (kernel == "quant_int8")
    assert sim.minimum() == sizing.closed_form_minimum(6, 1, 5, None)


# ---- policies and verdicts ---------------------------------------------------------

def test_policy_sizes():
    def size(name, w, s, c, n):
        wl = sizing.CacheWorkload(w, c, sink=s, context=n)
        return sizing.policy_size(sizing.POLICIES[name], wl)
    assert size("2x-window", 64, 0, 128, None) == 128
    assert size("2x-window", 64, 4, 128, None) == 132
    assert size("window+chunk", 64, 0, 128, 100) == 192
    assert size("window+chunk-capped", 64, 0, 128, 100) == 100
    assert size("sink+window+chunk", 64, 4, 128, 160) == 196
    assert size("sink+window+chunk-capped", 64, 4, 128, 160) == 160
    assert size("closed-form", 64, 4, 128, None) == 195


def test_register_a_policy():
    sizing.register_policy("test-plus-3", lambda w, s, c, n: s + w + c + 2, "test")
    try:
        rep = sizing.evaluate(sizing.CacheWorkload(4, 3), ["test-plus-3", "closed-form"])
        by = {p.name: p for p in rep.policies}
        assert by["test-plus-3"].verdict == "oversized" and by["test-plus-3"].slots_over == 3
        assert by["closed-form"].verdict == "exact"
    finally:
        del sizing.POLICIES["test-plus-3"]


def test_sink_verdicts_and_memory():
    shape = sizing.KVShape(layers=2, kv_heads=2, head_dim=8, dtype="f32")
    assert shape.bytes_per_slot == 2 * 2 * 2 * 8 * 4
    rep = sizing.evaluate(sizing.CacheWorkload(16, 24, sink=4), kv_shape=shape)
    by = {p.name: p for p in rep.policies}
    assert rep.minimum == rep.closed_form == 43
    assert by["2x-window"].verdict == "undersized"
    assert by["window+chunk"].verdict == "undersized"  # PR 22358's ring rule ignores sinks
    assert by["sink+window+chunk"].verdict == "oversized"
    assert by["sink+window+chunk"].bytes_over == shape.bytes_per_slot
    assert by["closed-form"].verdict == by["simulated-minimum"].verdict == "exact"
    assert by["closed-form"].bytes == 43 * shape.bytes_per_slot


def test_uncapped_sink_rule_exceeds_a_small_context():
    rep = sizing.evaluate(sizing.CacheWorkload(16, 24, sink=4, context=30))
    by = {p.name: p for p in rep.policies}
    assert rep.minimum == 30
    assert by["sink+window+chunk"].verdict == "exceeds-full-context"
    assert by["sink+window+chunk-capped"].verdict == "exact"
    assert "larger than a full-context cache" in by["sink+window+chunk"].detail


# ---- probe sizing -------------------------------------------------------------------

def test_cli_headline_json():
    res = runner.invoke(app, ["sizing", "--window", "64", "--chunk", "128", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["minimum"] == 191 and doc["closed_form"] == 191
    by = {p["name"]: p for p in doc["policies"]}
    for p in doc["policies"]:
        assert {"name", "size", "verdict"} <= set(p)
        assert p["verdict"] in sizing.VERDICTS
    u = by["2x-window"]
    assert u["verdict"] == "undersized" and u["size"] == 128
    assert isinstance(u["position"], int) and u["max_err"] > 1e-3
    assert by["window+chunk"]["verdict"] == "oversized" and by["window+chunk"]["slots_over"] == 1
    assert by["closed-form"]["verdict"] == "exact"


def test_cli_human_output_small():
    res = runner.invoke(app, ["sizing", "-w", "8", "--chunk", "12", "--sink", "2", "-c", "20",
                              "-p", "2x-window", "-p", "sink+window+chunk"],
                           env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "exact minimum: 20" in res.stdout
    assert "undersized: wrong outputs at position" in res.stdout
    assert "larger than a full-context cache" in res.stdout


@pytest.mark.parametrize("argv,msg", [
    (["--window", "0", "--chunk", "4"], "--window"),
    (["--window", "4", "--chunk", "0"], "--chunk"),
    (["--window", "4", "--chunk", "4", "--sink", "-1"], "--sink"),
    (["--window", "4", "--chunk", "4", "--policy", "nope"], "unknown policy"),
    (["--window", "4", "--chunk", "4", "--kernel", "nope"], "unknown kernel"),
    (["--window", "4", "--chunk", "4", "--dtype", "f8"], "--dtype"),
    (["--window", "70000", "--chunk", "4"], "limit"),
])
def test_cli_bad_input(argv, msg):
    res = runner.invoke(app, ["sizing", *argv])
    assert res.exit_code == 2
    assert msg in res.output and res.output.startswith("error:")


def test_run_suite_cache_part(monkeypatch):
    monkeypatch.setattr(suite, "scratch_cases", lambda kernels=None: [])
    monkeypatch.setattr(suite, "SUITE_GRID", suite.SUITE_GRID[::6])  # the full grid is tested above
    cases = sizing.run_suite("flash")
    ids = [c["case"] for c in cases]
    assert len(ids) == len(set(ids))
    assert "ring-w16-c24-size32" in ids and "closed-form-grid" in ids
    for c in cases:
        assert {"case", "status", "reason", "max_abs_err", "seconds"} <= set(c)
        assert c["status"] == "pass", c


def test_int8_cache_is_i8_as_in_the_other_commands():
    """`i8` is the int8 dtype's name everywhere else; sizing takes it (and still int8)."""
    a = sizing.KVShape(layers=2, kv_heads=2, head_dim=8, dtype="i8").validate()
    b = sizing.KVShape(layers=2, kv_heads=2, head_dim=8, dtype="int8").validate()
    assert a.bytes_per_slot == b.bytes_per_slot == 2 * 2 * 2 * (8 + 5)
