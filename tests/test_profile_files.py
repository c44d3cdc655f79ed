"""`probe profile`'s files: CSV rows, the Chrome trace, the SVG chart of a context sweep,
the machine and build they carry, and the output guard's knowledge of the CSV."""

import csv
import io
import json
import xml.etree.ElementTree as ET

import numpy as np
from profile_cli import COMMON_OPS, DECOMPOSED_OPS, FAST, TINY, run

from sdpa_probe import outputs
from sdpa_probe.profile import report


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


def _svg_panels(path):
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


def test_the_output_guard_knows_the_profile_csv_header(tmp_path):
    # outputs.py sits below the profile package: it knows the header by its text
    assert ",".join(report.CSV_FIELDS) + "," == outputs.PROFILE_CSV_HEAD
    f = tmp_path / "p.csv"
    f.write_text(report.csv_text({"runs": [], "threads": 1, "kernels": {}}))
    assert outputs._not_a_report(f) is None
    outputs.check_writable(str(f), "--csv")
