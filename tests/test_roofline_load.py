"""A roofline measured while the machine is busy is not cached as the machine's figure:
the last quiet one is used, or the busy one is kept as provisional until the machine is
quiet. The load is injected (a fake measurement and load monitor), never real load."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sdpa_probe import build, host_load, machine, native
from sdpa_probe.cli import app

QUIET = {"other_cpu_fraction": 0.0, "steal_fraction": 0.0, "round_spread": {}, "busy": False}
BUSY = {"other_cpu_fraction": 0.6, "steal_fraction": 0.0, "round_spread": {}, "busy": True}


class QuietMonitor:
    """An idle host, whatever the machine running the tests is doing."""

    def result(self, details=None) -> dict:
        return dict(QUIET)

    @classmethod
    def now(cls) -> dict:
        return dict(QUIET)


class BusyMonitor(QuietMonitor):
    @classmethod
    def now(cls) -> dict:
        return dict(BUSY)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A private roofline cache, and measurements whose load the test sets: each
    measure() returns ceilings of 10 (scaled by `scale`), measured_at counting calls."""
    monkeypatch.setattr(machine, "roofline_dir", lambda: tmp_path)
    res = native.native_lib()[2]
    state = {"load": QUIET, "calls": 0, "scale": 1.0}

    def measure(progress=None) -> dict:
        state["calls"] += 1
        return {k: 10.0 * state["scale"] for k in machine.ROOFLINE_KEYS} | {
            "schema": machine.SCHEMA, "cpu_model": build.cpu_model(),
            "module": res.module_name, "build_flags": list(res.flags),
            "measured_at": f"measurement {state['calls']}", "load": dict(state["load"])}

    monkeypatch.setattr(machine, "measure", measure)
    monkeypatch.setattr(machine, "LoadMonitor", QuietMonitor)
    return state


def test_a_busy_measurement_is_provisional_until_a_quiet_one(host, monkeypatch):
    host["load"] = BUSY
    r = machine.roofline()
    assert r["provisional"] and r["load"]["busy"] and host["calls"] == 1
    assert machine.load_cached() is None  # (not the machine's figure)
    # still busy: the provisional figure, and no measurement
    monkeypatch.setattr(machine, "LoadMonitor", BusyMonitor)
    r = machine.roofline()
    assert r["provisional"] and r["measured_at"] == "measurement 1" and host["calls"] == 1
    # quiet now: measured again, and that one is the machine's
    monkeypatch.setattr(machine, "LoadMonitor", QuietMonitor)
    host["load"] = QUIET
    r = machine.roofline()
    assert not r.get("provisional") and r["measured_at"] == "measurement 2"
    assert machine.load_cached()["measured_at"] == "measurement 2"
    assert not machine.provisional_path(machine.cache_path()).exists()
    assert machine.roofline()["cached"] and host["calls"] == 2


def test_a_busy_refresh_keeps_the_last_quiet_figure(host):
    machine.roofline()  # quiet: cached
    host["load"], host["scale"] = BUSY, 0.25  # (a busy host's low figures)
    r = machine.roofline(refresh=True)
    assert host["calls"] == 2 and r["cached"] and r["busy_measurement"]["busy"]
    assert r["measured_at"] == "measurement 1" and r["read_bw_gbs_all"] == 10.0
    assert machine.load_cached()["measured_at"] == "measurement 1"


def test_a_busy_figure_cached_before_is_measured_again(host):
    machine.roofline()
    path = machine.cache_path()
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data | {"load": BUSY}))  # (as an older version kept it)
    r = machine.roofline()
    assert host["calls"] == 2 and not r["cached"] and r["measured_at"] == "measurement 2"


def test_info_says_the_busy_measurement_was_dropped(host):
    machine.roofline()
    host["load"] = BUSY
    res = CliRunner().invoke(app, ["info", "--refresh", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["roofline"]["measured_at"] == "measurement 1"
    assert "60% of the CPUs used by other processes" in res.stderr
    assert "not kept; the last quiet one (measurement 1) is used" in res.stderr


def test_rounds_far_apart_count_as_busy():
    def details(*bests):
        return {"read_bw_gbs_all": {"round_bests": list(bests)}}

    assert host_load.round_spread(details(10.0, 9.0)) == {}
    assert host_load.round_spread(details(10.0, 7.0)) == {"read_bw_gbs_all": 0.3}
    assert host_load.LoadMonitor().result(details(10.0, 7.0))["busy"] is True


def test_other_processes_cpu_time_counts_as_busy(monkeypatch):
    ticks = iter([(0, 0), (10**9, 0)])  # (others ran every CPU flat out meanwhile)
    monkeypatch.setattr(host_load, "_cpu_ticks", lambda: next(ticks))
    load = host_load.LoadMonitor().result()
    assert load["busy"] is True and load["other_cpu_fraction"] > host_load.BUSY_FRACTION
    ticks = iter([(0, 0), (0, 0)])
    assert host_load.LoadMonitor().result()["busy"] is False
