"""--save-baseline / --compare: a run held against a saved one, with a verdict that
heeds both runs' spread (synthetic runs: no timing is asserted)."""

import copy
import json

import pytest
from test_output_fit import _bench_doc
from typer.testing import CliRunner

from sdpa_probe import saved_runs
from sdpa_probe.cli import app
from sdpa_probe.cli.baseline_opts import before_run, compare_sheet
from sdpa_probe.errors import ProbeError
from sdpa_probe.tables import markdown

runner = CliRunner()


@pytest.fixture(autouse=True)
def _store(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPA_PROBE_BASELINES", str(tmp_path / "baselines"))


@pytest.mark.parametrize("base,now,word", [
    ((100.0, 2.0, 9), (80.0, 2.0, 9), "faster"),    # tight rounds, 20 % less time
    ((100.0, 2.0, 9), (130.0, 2.0, 9), "slower"),
    ((100.0, 60.0, 9), (80.0, 60.0, 9), "same"),    # the same change inside the noise
    ((100.0, 0.0, 9), (101.0, 0.0, 9), "same"),     # under MIN_CHANGE
])
def test_verdict_heeds_the_spread(base, now, word):
    v = saved_runs.verdict(base, now)
    assert v["verdict"] == word and v["ratio"] == pytest.approx(base[0] / now[0])


def test_bench_runs_compare_by_shape_and_party():
    was = _bench_doc()
    for r in was["results"]:
        r["samples"], r["iqr_us"] = 20, 1.0
        r["peers"]["torch"] |= {"samples": 20, "iqr_us": 1.0}
    now = copy.deepcopy(was)
    now["results"][0]["median_us"] /= 2        # quant_int8 twice as fast
    now["results"][1]["peers"]["torch"]["median_us"] *= 1.5
    rows = {(r["shape"], r["party"]): r for r in saved_runs.compare_bench(was, now)}
    shape_a, shape_b = (r["shape"] for r in was["results"])
    assert rows[(shape_a, "quant_int8")]["verdict"] == "faster"
    assert rows[(shape_a, "quant_int8")]["ratio"] == pytest.approx(2.0)
    assert rows[(shape_b, "torch")]["verdict"] == "slower"
    assert rows[(shape_b, "flash")]["verdict"] == "same"


def test_a_saved_name_is_not_replaced_without_asking(monkeypatch):
    saved_runs.save("bench", "main", _bench_doc())
    with pytest.raises(ProbeError, match="--force replaces it"):
        before_run("bench", "main", None, force=False)
    before_run("bench", "main", None, force=True)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    monkeypatch.setattr("typer.confirm", lambda *a, **k: False)
    with pytest.raises(ProbeError, match="kept"):
        before_run("bench", "main", None, force=False)
    with pytest.raises(ProbeError, match="saved: main"):
        before_run("bench", None, "other", force=False)
    with pytest.raises(ProbeError, match="baseline name"):
        before_run("bench", "../x", None, force=False)


def test_profile_saves_and_compares(tmp_path):
    argv = ["profile", "--custom", "--layers", "1", "--hidden", "64", "--heads", "2",
            "--kv-heads", "1", "--head-dim", "32", "--ffn", "128", "--vocab", "300",
            "--steps", "3", "--warmup", "0", "-c", "16"]
    res = runner.invoke(app, [*argv, "--save-baseline", "before"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [*argv, "--compare", "before", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = doc["compare"]["rows"]
    assert doc["compare"]["baseline"] == "before" and rows[0]["op"] == "step"
    assert {r["verdict"] for r in rows} <= {"faster", "slower", "same"}
    assert "| step |" in markdown(compare_sheet(doc))
    res = runner.invoke(app, [*argv, "--save-baseline", "before"])
    assert res.exit_code == 2 and "exists" in res.output
