"""--format table|md|csv|json|jsonl, --output FILE and --json PATH: one meaning in
check, bench, profile and sizing."""

import csv
import io
import json

import pytest
from test_output_fit import _bench_doc
from typer.testing import CliRunner

from sdpa_probe.cli import app, bench_cmd
from sdpa_probe.cli.output import Output

runner = CliRunner()
SIZING = ["sizing", "-w", "8", "--chunk", "4", "--sink", "1", "--context", "32"]


def test_sizing_in_every_format():
    res = runner.invoke(app, [*SIZING, "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    names = [p["name"] for p in doc["policies"]]
    assert doc["schema"].startswith("sdpa_probe.sizing") and "closed-form" in names
    res = runner.invoke(app, [*SIZING, "-f", "jsonl"])
    lines = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert [ln["name"] for ln in lines] == names and lines[0]["probe"] == "sizing"
    res = runner.invoke(app, [*SIZING, "-f", "csv"])
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["name"] for r in rows] == names and rows[0]["probe"] == "sizing"
    res = runner.invoke(app, [*SIZING, "-f", "md"])
    assert res.stdout.startswith("# probe sizing") and "| closed-form |" in res.stdout
    res = runner.invoke(app, [*SIZING, "--json", "-"])
    assert json.loads(res.stdout)["policies"][0]["name"] == names[0]


def test_output_writes_the_format_and_refuses_a_file_probe_did_not_write(tmp_path):
    dest = tmp_path / "sizing.csv"
    res = runner.invoke(app, [*SIZING, "-f", "csv", "-o", str(dest)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "policy" in res.stdout  # (the table stays on the terminal)
    assert dest.read_text().startswith("probe,name,")
    res = runner.invoke(app, [*SIZING, "-f", "csv", "-o", str(dest)])
    assert res.exit_code == 0, res.output  # its own earlier output: replaced
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    res = runner.invoke(app, [*SIZING, "-f", "md", "-o", str(mine)])
    assert res.exit_code == 2 and "--force" in res.output and mine.read_text() == "my notes\n"
    res = runner.invoke(app, [*SIZING, "-f", "md", "-o", str(mine), "--force"])
    assert res.exit_code == 0 and mine.read_text().startswith("# probe sizing")
    table = tmp_path / "table.txt"
    res = runner.invoke(app, [*SIZING, "-o", str(table)], env={"COLUMNS": "80"})
    assert res.exit_code == 0 and "closed-form" in table.read_text()
    res = runner.invoke(app, [*SIZING, "-o", str(table)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("argv,msg", [
    ([*SIZING, "-f", "xml"], "--format must be one of"),
    ([*SIZING, "-f", "md", "--json", "-"], "both want stdout"),
    (["bench", "-f", "json", "--json", "-", "--list"], "both want stdout"),
    (["check", "-f", "csv", "--report", "-"], "both want stdout"),
    (["profile", "-m", "smollm2-135m", "-f", "csv", "--csv", "-"], "stdout"),
])
def test_format_usage_errors(argv, msg):
    res = runner.invoke(app, argv)
    assert res.exit_code == 2 and msg in res.output, res.output


@pytest.mark.parametrize("fmt", ["md", "csv", "jsonl", "json"])
def test_bench_formats(fmt, capsys):
    bench_cmd._render(Output(True, fmt), _bench_doc(), None)
    text = capsys.readouterr().out
    if fmt == "md":
        assert "| decode-h32kv8d64-kv8192-f16 | quant_int8 |" in text
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        assert rows[0]["peers.torch.median_us"] == "208290.5" and rows[0]["probe"] == "bench"
    elif fmt == "jsonl":
        assert [json.loads(ln)["kernel"] for ln in text.splitlines()] == ["quant_int8", "flash"]
    else:
        assert json.loads(text)["results"][1]["median_us"] == 1234567.0


def test_a_bare_json_is_stdout_in_every_command():
    res = runner.invoke(app, [*SIZING, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["minimum"] >= 1
    res = runner.invoke(app, ["sizing", "-w", "8", "--json", "--chunk", "4"])
    assert res.exit_code == 0 and "policies" in json.loads(res.stdout)
    res = runner.invoke(app, ["check", "--list", "-k", "far and f16", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["cases"]
