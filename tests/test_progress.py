"""Progress on stderr: a native build says what it compiles (each compiler command with
-v), and `probe sizing` says what it simulates; stdout keeps the command's data."""

from __future__ import annotations

import io
import time

from typer.testing import CliRunner

from sdpa_probe.cli import app
from sdpa_probe.cli.progress import PIPE_EVERY, Activity, BuildProgress

# the smallest kernel a build takes: it declines every call
TINY_KERNEL = '#include "sdpa_probe.h"\nint sdpa_forward(const sdpa_args *a) ' \
              '{ (void)a; return SDPA_UNSUPPORTED; }\n'


def _build_tiny(tmp_path, monkeypatch, *flags: str):
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path / "cache"))  # (nothing cached)
    src = tmp_path / "tiny_kernel.c"
    src.write_text(TINY_KERNEL)
    return CliRunner().invoke(app, [*flags, "build", "--kernel", str(src), "--json"])


def test_a_build_shows_its_progress_on_stderr(tmp_path, monkeypatch):
    res = _build_tiny(tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    assert "building your kernel: 1 source(s)" in res.stderr
    assert "1/1 compiled (tiny_kernel.c)" in res.stderr
    assert "built your kernel in" in res.stderr
    assert " -c " not in res.stderr  # (the compiler commands: with -v only)
    assert res.stdout.lstrip().startswith("{")  # (the JSON record alone)


def test_verbose_shows_each_compiler_command(tmp_path, monkeypatch):
    res = _build_tiny(tmp_path, monkeypatch, "-v")
    assert res.exit_code == 0, res.output
    commands = [ln for ln in res.stderr.splitlines() if " -c " in ln]
    assert len(commands) == 1 and commands[0].endswith(".o")
    assert "tiny_kernel.c" in commands[0] and "-O3" in commands[0]


def test_a_failed_build_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "broken_kernel.c"
    src.write_text("int sdpa_forward(void) { return undeclared_name; }\n")
    res = CliRunner().invoke(app, ["build", "--kernel", str(src)])
    assert res.exit_code == 2
    assert "building your kernel failed after" in res.stderr


def test_a_pipe_gets_occasional_lines(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("sdpa_probe.cli.progress.time.monotonic", lambda: clock[0])
    sink = io.StringIO()  # (not a terminal: plain lines)
    progress = Activity("probe sizing", file=sink)
    for n in range(1, 31):
        progress(f"step {n}")
        clock[0] += PIPE_EVERY / 4
    progress.close()
    lines = sink.getvalue().splitlines()
    # the first line at once, then one per PIPE_EVERY seconds: 30 steps over 7.5 periods
    assert lines[0] == "probe sizing: step 1"
    assert 7 <= len(lines) <= 9, lines


def test_a_pipe_hears_from_a_long_silent_step(monkeypatch):
    monkeypatch.setattr("sdpa_probe.cli.progress.PIPE_EVERY", 0.01)
    sink = io.StringIO()
    progress = Activity("probe sizing", file=sink)
    progress("one long step")  # (then nothing: a compiler on one large source)
    for _ in range(500):  # (waits for the heartbeat's lines, up to 5 s)
        if len(sink.getvalue().splitlines()) >= 3:
            break
        time.sleep(0.01)
    progress.close()
    lines = sink.getvalue().splitlines()
    assert len(lines) >= 3 and all(ln.startswith("probe sizing: one long step") for ln in lines)


def test_build_progress_without_a_build_prints_nothing():
    sink = io.StringIO()
    watcher = BuildProgress(verbose=True, file=sink)
    watcher.command(["cc", "-c", "x.c"])  # (outside a build: nobody asked)
    watcher.compiled("x.c", 1, 1)
    assert sink.getvalue() == ""


def test_sizing_shows_what_it_simulates():
    res = CliRunner().invoke(app, ["sizing", "-w", "8", "--chunk", "4", "--sink", "1",
                                   "-p", "closed-form"])
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith("probe sizing: the float64 reference over")
    assert "probe sizing" not in res.stdout
