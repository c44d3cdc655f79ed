"""Baselines across runs: `probe bench` / `probe profile --save-baseline NAME` keeps a
run's document under the data directory, `--compare NAME` holds a new run against it.

The verdict is noise-aware, as llama.cpp's compare-llama-bench and
torch.utils.benchmark's Compare mean it: each median gets an interval from its own
rounds' spread, median +- 1.57 IQR / sqrt(n) (the notch of a notched box plot, about
a 95 % interval for the median); "same" when the two intervals overlap or the change
is under MIN_CHANGE, else "faster" or "slower". ratio = baseline time / this time:
above 1 this run is faster."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from pathlib import Path

from . import TOOL
from .errors import ProbeError
from .outputs import dumps, write_text

SCHEMA = "sdpa_probe.baseline/1"
NOTCH = 1.57
MIN_CHANGE = 0.02   # a change under 2 % is "same" even with tight intervals
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def root() -> Path:
    """$SDPA_PROBE_BASELINES, else $XDG_DATA_HOME/sdpa_probe/baselines (default
    ~/.local/share/sdpa_probe/baselines)."""
    env = os.environ.get("SDPA_PROBE_BASELINES")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "sdpa_probe" / "baselines"


def path(command: str, name: str) -> Path:
    if not _NAME.match(name or ""):
        raise ProbeError(f"baseline name {name!r}: letters, digits, '.', '_' and '-', at most "
                         "64, starting with a letter or digit")
    return root() / command / f"{name}.json"


def names(command: str) -> list[str]:
    folder = root() / command
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def saved_at(command: str, name: str) -> str | None:
    """When the baseline was saved (None: there is none)."""
    try:
        return json.loads(path(command, name).read_text()).get("saved_at", "?")
    except (OSError, ValueError):
        return None if not path(command, name).exists() else "?"


def save(command: str, name: str, doc: dict) -> Path:
    p = path(command, name)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProbeError(f"cannot make {p.parent}: {exc.strerror}") from None
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_text(str(p), dumps({"schema": SCHEMA, "tool": dict(TOOL), "name": name,
                              "command": command, "saved_at": now, "run": doc}) + "\n",
               force=True)
    return p


def load(command: str, name: str) -> dict:
    """The saved baseline (its "run" is the command's document)."""
    p = path(command, name)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        have = names(command)
        known = f"; saved: {', '.join(have)}" if have else f"; none saved yet in {p.parent}"
        raise ProbeError(f"no {command} baseline {name!r}{known} (--save-baseline NAME "
                         "saves one)") from None
    except (OSError, ValueError) as exc:
        raise ProbeError(f"cannot read baseline {p}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or "run" not in doc:
        raise ProbeError(f"{p} is not a probe baseline")
    return doc


def interval(median: float, iqr: float, n: int) -> tuple[float, float]:
    half = NOTCH * iqr / math.sqrt(max(n, 1))
    return median - half, median + half


def verdict(base: tuple[float, float, int], now: tuple[float, float, int]) -> dict:
    """ratio (baseline / now), both intervals and the verdict of one figure, each given
    as (median, iqr, n) of a time."""
    (bm, bi, bn), (nm, ni, nn) = base, now
    blo, bhi = interval(bm, bi, bn)
    nlo, nhi = interval(nm, ni, nn)
    ratio = bm / nm if nm > 0 else float("nan")
    if not math.isfinite(ratio) or abs(ratio - 1) < MIN_CHANGE or (blo <= nhi and nlo <= bhi):
        word = "same"
    else:
        word = "faster" if ratio > 1 else "slower"
    return {"baseline": bm, "now": nm, "ratio": ratio, "baseline_interval": [blo, bhi],
            "now_interval": [nlo, nhi], "verdict": word}


def compare_bench(base: dict, doc: dict) -> list[dict]:
    """Each (shape, party) timed in both runs: the kernel's median and each peer's."""
    def figures(d: dict) -> dict:
        out = {}
        for r in d["results"]:
            out[(r["shape"], r["kernel"])] = (r["median_us"], r["iqr_us"], r.get("samples", 1))
            for p, ps in r.get("peers", {}).items():
                if "median_us" in ps:
                    out[(r["shape"], p)] = (ps["median_us"], ps.get("iqr_us", 0.0),
                                            ps.get("samples", 1))
        return out

    was, now = figures(base), figures(doc)
    return [{"shape": k[0], "party": k[1], "unit": "us", **verdict(was[k], now[k])}
            for k in now if k in was]


def compare_profile(base: dict, doc: dict) -> list[dict]:
    """Each (attention, context) run in both: the step, then each op by name."""
    def figures(d: dict) -> dict:
        out = {}
        for sm in d["runs"]:
            key, n = (sm["attention"], sm["context"]), sm["steps"]
            out[(*key, "step")] = (sm["step_ms"]["median"], sm["step_ms"]["iqr"], n)
            for o in sm["ops"]:
                out[(*key, o["name"])] = (o["median_ms"], o["iqr_ms"], n)
        return out

    was, now = figures(base), figures(doc)
    return [{"attention": k[0], "context": k[1], "op": k[2], "unit": "ms",
             **verdict(was[k], now[k])} for k in now if k in was]


def mismatch(base: dict, doc: dict) -> list[str]:
    """What differs between the two runs' conditions (threads, CPU, mode)."""
    out = []
    for key in ("threads", "mode", "weights", "cache"):
        if key in doc and key in base and doc[key] != base[key]:
            out.append(f"{key} {base[key]} then, {doc[key]} now")
    cpu = (base.get("machine") or {}).get("cpu"), (doc.get("machine") or {}).get("cpu")
    if all(cpu) and cpu[0] != cpu[1]:
        out.append(f"CPU {cpu[0]} then, {cpu[1]} now")
    return out
