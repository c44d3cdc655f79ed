"""Every command's tables fit the terminal, 80 columns included, by leaving columns out
in the stated order, never by cutting a number or an id (tables.fit)."""

import copy
import json
import re
from types import SimpleNamespace

import pytest
from kernels_for_tests import BUGS, SRC
from rich.console import Console
from typer.testing import CliRunner

from sdpa_probe import tables
from sdpa_probe.cli import app, bench_cmd
from sdpa_probe.cli.check_render import show_result
from sdpa_probe.cli.output import Output
from sdpa_probe.records import Record
from sdpa_probe.tables import Col, Sheet

runner = CliRunner()
WIDTHS = (80, 120)
SHAPE_A = "decode-h32kv8d64-kv8192-f16"
SHAPE_B = "prefill-h8kv2d64-q128-kv1024-causal-f32"


def _render(renderable, width: int) -> str:
    con = Console(width=width, force_terminal=False, color_system=None)
    with con.capture() as cap:
        con.print(renderable)
    return cap.get()


def assert_fits(text: str, width: int, whole: list[str]) -> None:
    """No line over width, no ellipsis anywhere, every id and number of `whole` on
    one line, uncut."""
    for ln in text.splitlines():
        assert len(ln.rstrip()) <= width, f"{len(ln)} > {width}: {ln!r}"
    assert "…" not in text
    for w in whole:
        assert re.search(rf"(?<![\w.-]){re.escape(w)}(?![\w.-])", text), (w, text)


def _sheet() -> Sheet:
    s = Sheet([Col("shape", "id"), Col("kernel", "id"), Col("median µs"),
               Col("IQR µs", drop=2), Col("GB/s", drop=1), Col("", "bar"),
               Col("verdict", "text")], title="a table")
    s.add_row(SHAPE_A, "quant_int8", "8,467", "723", "19.8", "█" * 20, "the ring is too small")
    s.add_row(SHAPE_B, "flash", "12,345,678", "1.5", "4.6", "█" * 3, "exact")
    return s


def test_fit_gives_up_the_bar_then_the_drop_order_then_stacks():
    s = _sheet()
    steps = {200: [], 120: [], 110: [5], 100: [5], 95: [4, 5], 85: [3, 4, 5]}
    for width, dropped in steps.items():
        f = tables.fit(s, width)
        assert f.dropped == dropped and not f.stacked, (width, f)
    assert tables.fit(s, 120).widths[5] == tables.BAR_LEAST  # narrowed before it leaves
    assert tables.fit(s, 100).widths[6] == tables.TEXT_LEAST  # prose wraps before a drop
    assert tables.fit(s, 80).stacked
    for w in (40, 80, 90, 120, 200):
        assert_fits(_render(tables.render(s, w), w), w,
                    [SHAPE_A, SHAPE_B, "quant_int8", "8,467", "12,345,678"])


def test_a_left_out_column_is_named():
    text = _render(tables.render(_sheet(), 90), 90)
    assert "left out at 90 columns" in text and "GB/s" in text.split("left out")[1]


def test_markdown_has_every_column_but_the_bar():
    md = tables.markdown(_sheet())
    head = md.splitlines()[2]
    assert head.count("|") == 7 and "GB/s" in head and "█" not in md


def test_a_repro_command_is_one_shell_command_within_the_width():
    cmd = f"probe check --kernel /tmp/a/very/long/path/kernel.c --repro {SHAPE_B}-window48"
    lines = tables.command_lines(cmd, 60, 8)
    assert all(len(ln) <= 60 for ln in lines) and len(lines) > 1
    joined = " ".join(ln.strip().removesuffix("\\").strip() for ln in lines)
    assert joined == cmd
    assert tables.command_lines("probe check --repro x", 80, 8) == ["        probe check --repro x"]


def _bench_doc() -> dict:
    res = {"kernel": "quant_int8", "shape": SHAPE_A, "median_us": 8467.2, "iqr_us": 723.4,
           "noisy": True, "gb_s": 19.47, "dram_pct": 88.3, "roofline_pct": 88.3,
           "bound": "memory", "dram_pct_same_run": 373.9, "fma_gflops_same_run": 202.2,
           "fma_pct_same_run": 46.8, "core_us": 418.7, "limit": "core",
           "ratio": {"torch": 24.599, "flash@f32": 1.47},
           "peers": {"torch": {"median_us": 208290.5, "noisy": False},
                     "flash@f32": {"median_us": 12445.0}}}
    other = copy.deepcopy(res) | {"shape": SHAPE_B, "kernel": "flash", "median_us": 1234567.0}
    return {"mode": "warm", "threads": 2, "rounds": 7, "peers": ["torch"], "notes": [],
            "roofline": None, "results": [res, other]}


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_table_fits(width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    out = Output()
    with out.out.capture() as cap:
        bench_cmd._render(out, _bench_doc(), None)
    assert_fits(cap.get(), width, [SHAPE_A, SHAPE_B, "quant_int8", "8,467", "1,234,567",
                                   "24.60x", "1.47x"])


def test_profile_and_sizing_fit_at_80_and_120(tmp_path):
    """A small model's profile and a small sizing run, each at both widths."""
    argv = ["profile", "--custom", "--layers", "1", "--hidden", "64", "--heads", "2",
            "--kv-heads", "1", "--head-dim", "32", "--ffn", "128", "--vocab", "300",
            "--steps", "2", "--warmup", "0", "-c", "16"]
    for width in WIDTHS:
        res = runner.invoke(app, argv, env={"COLUMNS": str(width)})
        assert res.exit_code == 0, res.output
        assert_fits(res.stdout, width, ["o_proj", "lm_head", "unattributed"])
        res = runner.invoke(app, ["sizing", "-w", "8", "--chunk", "4", "--sink", "1", "-c", "32"],
                            env={"COLUMNS": str(width)})
        assert res.exit_code == 0, res.output
        assert_fits(res.stdout, width, ["sink+window+chunk-capped", "closed-form"])


def test_check_failures_fit_at_80_and_120_and_x_stops_at_the_first(tmp_path, monkeypatch):
    """One check run (-x: it stops after its first failure) shown at 80 columns, its
    records shown again at 120, and the failing case's --repro at 80."""
    monkeypatch.chdir(tmp_path)  # (a kernel path shorter than a line)
    path = tmp_path / "no_start_pos.c"
    path.write_text(SRC.replace(*BUGS["ignore-start-pos"]))
    path = path.relative_to(tmp_path)
    res = runner.invoke(app, ["check", "--kernel", str(path), "--suite", "smoke", "-k",
                              "causal200 or causal65", "-j", "1", "-x", "--json", "r.json",
                              "--format", "jsonl", "--output", "r.jsonl"],
                        env={"COLUMNS": "80"})
    assert res.exit_code == 1, res.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [r["status"] for r in doc["records"]] == ["fail"]  # (-x: the other not run)
    assert "--maxfail" in res.output and "1 case(s) not run" in res.output
    case = doc["records"][0]["case"]
    assert_fits(res.stdout, 80, [case])  # (the table stays on the terminal with --output)
    (line,) = (tmp_path / "r.jsonl").read_text().splitlines()  # --format jsonl: a record
    assert json.loads(line) | {"probe": "check"} == {"probe": "check"} | doc["records"][0]
    assert _repro_line(res.stdout) == f"probe check --kernel {path} --repro {case}"
    monkeypatch.setenv("COLUMNS", "120")
    out = Output()
    result = SimpleNamespace(records=[Record(**r) for r in doc["records"]], cases=[None],
                             seconds=1.0, golden=None, document=doc)
    with out.out.capture() as cap:
        show_result(out, result, [str(path)], each_failure=False)
    assert_fits(cap.get(), 120, [case])
    assert _repro_line(cap.get()) == f"probe check --kernel {path} --repro {case}"
    res = runner.invoke(app, ["check", "--kernel", str(path), "--repro", case],
                        env={"COLUMNS": "80"})
    assert res.exit_code == 1, res.output
    assert_fits(res.stdout, 80, [case])


def _repro_line(text: str) -> str:
    """The first repro command in text, its backslash-continued lines joined."""
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("probe check --"))
    cmd = lines[at].strip()
    while cmd.endswith("\\"):
        at += 1
        cmd = cmd.removesuffix("\\").strip() + " " + lines[at].strip()
    return cmd
