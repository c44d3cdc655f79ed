"""One meaning per short flag across commands, -k as pytest's expression, and help
text that reads cleanly at 80 columns (-x: tests/test_output_fit.py)."""

import pytest
import typer
from typer.testing import CliRunner

from sdpa_probe.cli import app
from sdpa_probe.errors import ProbeError
from sdpa_probe.id_filter import compile_filter

runner = CliRunner()
IDS = ["decode-h8gqa4-q1-kv300-d64-f32-causal200", "decode-h8gqa4-q1-kv65-d64-f16",
       "window-h8gqa4-q3-kv130-d64-f32-causal127-window48", "layout-h8-q3-kv65-d64-f32-padded"]


@pytest.mark.parametrize("expr,picked", [
    ("decode", [0, 1]),
    ("DECODE and not f16", [0]),
    ("causal or padded", [0, 2, 3]),
    ("(window or layout) and not (padded)", [2]),
    ("not decode and not window", [3]),
    ("kv65 and (f16 or padded)", [1, 3]),
    ("-kv300-", [0]),
])
def test_k_is_an_expression_of_substrings(expr, picked):
    match = compile_filter([expr])
    assert [i for i, s in enumerate(IDS) if match(s)] == picked


def test_several_k_are_any_of_them():
    match = compile_filter(["window", "f16"])
    assert [s for s in IDS if match(s)] == [IDS[1], IDS[2]]


@pytest.mark.parametrize("bad", ["decode and", "(decode", "decode)", "and f16", "", "a $ b",
                                 "not"])
def test_a_malformed_expression_is_a_usage_error(bad):
    with pytest.raises(ProbeError, match="-k"):
        compile_filter([bad])
    res = runner.invoke(app, ["check", "--list", "-k", bad or " "])
    assert res.exit_code == 2 and "Traceback" not in res.output


def _commands():
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():
        subs = getattr(cmd, "commands", None)
        if subs:
            yield from ((f"{name} {n}", c) for n, c in subs.items())
        yield name, cmd


def test_a_short_flag_means_one_thing_in_every_command():
    meaning: dict[str, tuple[str, str]] = {}
    for name, cmd in _commands():
        for p in cmd.params:
            longs = [o for o in p.opts if o.startswith("--")]
            for short in (o for o in p.opts if len(o) == 2 and o[0] == "-"):
                key = longs[0] if longs else p.metavar  # (-k: an EXPRESSION over ids)
                if short in meaning:
                    assert meaning[short][1] == key, (short, name, key, meaning[short])
                meaning[short] = (name, key)
    assert meaning["-k"][1] == "EXPRESSION"
    assert meaning["-c"][1] == "--context" and meaning["-f"][1] == "--format"


def test_help_is_clean_at_80_columns():
    for name in ["", *(n for n, _ in _commands())]:
        res = runner.invoke(app, [*name.split(), "--help"], env={"COLUMNS": "80"})
        assert res.exit_code == 0, (name, res.output)
        text = res.output
        assert "<bool>" not in text and "%%" not in text and "[/" not in text, (name, text)
        long = [ln for ln in text.splitlines() if len(ln) > 80]
        assert not long, (name, long)
