"""What each backend is on this machine: available or why not, and its version, for
`probe backends` and the reports that name what ran. A runtime's version may mean
loading it, and a runtime can abort or change the process that loads it: the
versions are asked for in a child process (`python -m sdpa_probe.backends.inventory
NAME...`, one JSON line back), never in the caller."""

from __future__ import annotations

import json
import subprocess
import sys

from .. import native
from ..children import child_env, signal_name
from .registry import REGISTERED, BackendSpec, make

VERSION_TIMEOUT = 120.0  # seconds for every version at once (a runtime's first import)


def specs_known() -> list[BackendSpec]:
    """Every backend the tool knows: our native kernels, then the registered ones."""
    return ([BackendSpec("native", n) for n in native.builtin_kernels()]
            + [BackendSpec("registered", n) for n in REGISTERED])


def describe(specs: list[BackendSpec]) -> list[dict]:
    """Per spec: name, kind, available (bool), why (None or why not), version (None if
    unavailable or the child could not say)."""
    rows = []
    for s in specs:
        try:
            why = s.why_unavailable()
        except Exception as exc:  # a runtime's probe is its own code: its failure is a why
            why = f"{type(exc).__name__}: {exc}"
        rows.append({"name": s.name, "kind": s.kind, "available": why is None, "why": why,
                     "version": None})
    names = [r["name"] for r in rows if r["available"]]
    versions, trouble = versions_in_child(names) if names else ({}, None)
    for r in rows:
        if r["available"]:
            r["version"] = versions.get(r["name"])
            if r["version"] is None:
                r["why_no_version"] = trouble or "it gave none"
    return rows


def versions_in_child(names: list[str]) -> tuple[dict[str, str], str | None]:
    """{name: version} from a child process, and what went wrong if it did not answer
    for every name (a runtime that crashed on loading, a timeout)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "sdpa_probe.backends.inventory", *names],
                              capture_output=True, text=True, timeout=VERSION_TIMEOUT,
                              env=child_env(), start_new_session=True)
    except subprocess.TimeoutExpired:
        return {}, f"asking for the versions took over {VERSION_TIMEOUT:g} s"
    except OSError as exc:
        return {}, f"could not start a child process: {exc.strerror}"
    answer = _last_json_line(proc.stdout)
    if answer is None:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        return {}, f"the child process ended with {signal_name(proc.returncode)}: {tail}"
    return answer, None


def _last_json_line(text: str) -> dict | None:
    """A runtime may print on stdout while loading: the answer is the last line."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _child_main(names: list[str]) -> None:
    out = {}
    for name in names:
        try:
            out[name] = make(name).version()
        except Exception as exc:  # one runtime's failure must not hide the others'
            out[name] = f"(no version: {type(exc).__name__}: {exc})"[:200]
    sys.stdout.write("\n" + json.dumps(out) + "\n")


if __name__ == "__main__":
    _child_main(sys.argv[1:])
