"""Start-up: the commands that only list or explain import neither torch nor a runtime
(each takes seconds to import), and `python -m sdpa_probe` is the `probe` command."""

from __future__ import annotations

import json
import subprocess
import sys

# Runs `probe ARGS` in-process for each argument list, and prints which of the heavy
# modules were imported by then.
_PROBE_IMPORTS = """
import contextlib, io, json, sys
from sdpa_probe.cli import main
HEAVY = ("torch", "onnxruntime", "openvino", "executorch")
seen = {}
for args in json.loads(sys.argv[1]):
    sys.argv = ["probe", *args]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), (args, exc.code)
    seen[" ".join(args)] = [m for m in HEAVY if m in sys.modules]
print(json.dumps(seen))
"""

LIGHT_COMMANDS = [["--help"], ["sizing", "--help"], ["check", "--help"], ["bench", "--help"],
                  ["profile", "--help"], ["backends", "--help"], ["run", "--help"],
                  ["golden", "--help"], ["info", "--help"], ["fuzz", "--help"]]


def _heavy_imports(commands: list[list[str]]) -> dict[str, list[str]]:
    r = subprocess.run([sys.executable, "-c", _PROBE_IMPORTS, json.dumps(commands)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_help_imports_no_torch_and_no_runtime():
    seen = _heavy_imports(LIGHT_COMMANDS)
    assert seen == {" ".join(c): [] for c in LIGHT_COMMANDS}


def test_the_guard_sees_torch_when_a_command_imports_it():
    # the same probe on a command that needs torch (its cases): it must report torch
    seen = _heavy_imports([["--help"], ["check", "--list", "--suite", "smoke"]])
    assert seen["--help"] == [] and "torch" in seen["check --list --suite smoke"]


def test_python_dash_m_is_the_probe_command():
    r = subprocess.run([sys.executable, "-m", "sdpa_probe", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("sdpa_probe ")
    r = subprocess.run([sys.executable, "-m", "sdpa_probe", "no-such-command"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no-such-command" in r.stderr
