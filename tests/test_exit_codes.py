"""Every option of every command (read from the command objects, so a new option is
covered as it is added) given values it cannot use: negative, zero, huge, NaN, inf, an
empty string, a directory, a regular file, a path whose folder is missing. Each is
refused before any work, with exit 2 and one line on stderr, through the console
script's own error handling (in-process); what a command legitimately accepts is
listed in ACCEPTED with the reason."""

from __future__ import annotations

import importlib
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from sdpa_probe import golden, native
from sdpa_probe.cli import app, main


class StartedWork(Exception):
    """A command got past its checks to its real work."""


# the first step of each command's real work; a value that reaches one was accepted
# (check and run import their work where they run it: it is replaced at its source)
WORK = [("sdpa_probe.check.run", "run_check"), ("sdpa_probe.check.repro", "WorkerPool"),
        ("sdpa_probe.check.single", "check_and_time"), ("sdpa_probe.bench.host", "roofline"),
        ("sdpa_probe.cli.profile_cmd", "run_profile"), ("sdpa_probe.cli.profile_cmd", "_explore"),
        ("sdpa_probe.cli.profile_cmd", "_run_live"), ("sdpa_probe.sizing.report", "Simulator"),
        ("sdpa_probe.golden.regen", "plan_regen"), ("sdpa_probe.golden", "verify"),
        ("sdpa_probe.golden", "diff_sets"), ("sdpa_probe.build", "_compile"),
        ("sdpa_probe.fuzz.live_pool", "LivePool")]

CASE = "decode-h8gqa4-q1-kv129-d64-f32"  # of the smoke suite
# what a command needs beside the option under test to get as far as its work
BASE = {"sizing": ["-w", "4", "--chunk", "2"], "check": ["-b", "flash", "-k", "decode"],
        "fuzz": ["-b", "flash"],
        "golden diff": [str(golden.default_dir())]}
# options that only count together with another one
WITH = {("check", "--save"): ["-b", "flash", "--repro", CASE],
        ("check", "--after"): ["-b", "flash", "--repro", CASE]}

NUMBERS = {int: {"negative": "-1", "zero": "0", "huge": "99999999999999999999", "nan": "nan"},
           float: {"negative": "-1", "zero": "0", "huge": "1e308", "nan": "nan",
                   "inf": "inf"}}
TEXTS = ("empty", "directory", "file", "missing")

# (command, option) -> {kind: why it is a value the command can use}. Besides these, an
# option's own default is accepted (zero for --seed 0, the empty --q-dtype).
ACCEPTED = {
    ("bench", "--vs"): {"empty": "no peers: the kernel timed alone"},
    ("bench", "--min-time"): {"zero": "one call per batch"},
    ("build", "--cflags"): dict.fromkeys(TEXTS, "extra flags; only the compiler can tell "
                                                "one it does not take (one line, exit 2)"),
    ("check", "--skip"): dict.fromkeys(("directory", "file", "missing"),
                                       "a part of an id that no case has leaves out none"),
    ("check", "--save"): {"directory": "where the repro files go",
                          "missing": "created for the repro files"},
    ("fuzz", "--corpus"): {"directory": "the shrunk cases are written into it",
                           "missing": "created for the shrunk cases"},
    ("golden diff", "--drift"): {"zero": "any move counts as a change"},
    ("golden regen", "--drift"): {"zero": "any move counts as a change"},
    ("golden regen", "--dir"): {"directory": "a new set is written into it",
                                "missing": "created for the new set"},
    ("profile", "--warmup"): {"zero": "no untimed steps first"},
    ("run", "--kv-len"): {"zero": "a call with no keys is a valid call (zeros out)"},
}


def _leaves(cmd, path=()):
    if hasattr(cmd, "commands"):
        for name, sub in sorted(cmd.commands.items()):
            yield from _leaves(sub, (*path, name))
    else:
        yield " ".join(path), cmd


def _sweep():
    for name, cmd in _leaves(typer.main.get_command(app)):
        for p in cmd.params:
            if getattr(p, "is_flag", False):
                continue
            kinds = NUMBERS.get(p.type_descriptor.annotation, dict.fromkeys(TEXTS))
            option = p.opts[0] if p.opts else p.name
            for kind, text in kinds.items():
                yield pytest.param(name, p, kind, text, id=f"{name} {option} {kind}")


def _value(kind: str, text: str | None, tmp_path) -> str:
    (tmp_path / "adir").mkdir(exist_ok=True)
    (tmp_path / "afile.txt").write_text("what no option wants\n")
    return {"empty": "", "directory": str(tmp_path / "adir"),
            "file": str(tmp_path / "afile.txt"),
            "missing": str(tmp_path / "missing" / "x")}.get(kind, text)


def _argv(name: str, param, value: str) -> list[str]:
    base = list(WITH.get((name, param.opts[0] if param.opts else ""), BASE.get(name, [])))
    if param.param_type_name == "argument":
        return [*name.split(), value, *base[1:]]  # (the base's own argument replaced)
    for opt in param.opts:  # (the base's value for it, under any of its names, dropped)
        if opt in base:
            i = base.index(opt)
            del base[i:i + 2]
    return [*name.split(), *base, param.opts[0], value]


@pytest.fixture(scope="module")
def no_work():
    """Each command's work replaced by StartedWork (the native library loaded first, as
    every command has it)."""
    native.native_lib()
    mp = pytest.MonkeyPatch()

    def started(*a, **k):
        raise StartedWork()

    for module, attr in WORK:
        mp.setattr(importlib.import_module(module), attr, started)
    yield
    mp.undo()


def probe(argv: list[str]) -> tuple[object, str, str]:
    """(exit code or "work", stdout, stderr) of `probe ARGV` through the console script."""
    runner = CliRunner()
    with runner.isolation(env={"COLUMNS": "400"}) as streams:
        saved, sys.argv = sys.argv, ["probe", *argv]
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code
        except StartedWork:
            code = "work"
        finally:
            sys.argv = saved
            sys.stdout.flush()
            sys.stderr.flush()
        return code, streams[0].getvalue().decode(), streams[1].getvalue().decode()


@pytest.mark.parametrize("name,param,kind,text", list(_sweep()))
def test_a_value_an_option_cannot_use(no_work, tmp_path, name, param, kind, text):
    value = _value(kind, text, tmp_path)
    code, out, err = probe(_argv(name, param, value))
    assert "Traceback" not in out + err, err
    option = param.opts[0] if param.opts else param.name
    why = ACCEPTED.get((name, option), {}).get(kind)
    default = param.default if not callable(param.default) else None
    if why is None and str(default) == value and default not in (None, ""):
        why = "its default"
    if why is None and default == "" and kind == "empty":
        why = "its default"
    if why is not None:
        assert code in (0, "work"), (f"probe {name} {option} {value!r} is refused now: drop "
                                     f"it from ACCEPTED ({err.strip()})")
        return
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
        f"probe {' '.join(_argv(name, param, value))!r}: exit {code}, stderr {lines}"


@pytest.mark.parametrize("name", sorted(BASE))
def test_the_base_arguments_reach_the_work(no_work, name):
    """What the sweep adds its bad value to is accepted: the refusals are the value's."""
    code, _, err = probe([*name.split(), *BASE[name]])
    assert code == "work", err
