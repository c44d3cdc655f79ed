"""What a failure is, in a few words: a failing record's kind. Shrinking keeps a
failure's kind (a smaller case that fails another way is another finding), and a
corpus file is named by it."""

from __future__ import annotations

import re

from ..records import Record

# (phrase in a fail's reason, its kind), first match wins
PHRASES = (
    ("written after sdpa_forward had returned", "output written after return"),
    ("where the reference is", "NaN or Inf"),
    ("never written (poison left)", "output unwritten"),
    ("out-of-bounds write", "out-of-bounds write"),
    ("wrote into its inputs", "inputs written"),
    ("floating-point environment", "floating-point environment left changed"),
    ("left its caller changed", "caller left changed"),
    ("error above tolerance", "error above tolerance"),
    ("leak", "memory leak"),
)


def _plain(reason: str) -> str:
    for phrase, kind in PHRASES:
        if phrase in reason:
            return kind
    words = re.sub(r"[^A-Za-z ]+", " ", reason).split()
    return " ".join(words[:4]) or "failed"


def kind_of(rec: Record) -> str:
    """The record's kind: its status for a crash, timeout or harness error (with the
    signal a crash names), else 'property NAME', or the verdict layer that failed,
    said of the call it failed in (a second call on rewritten buffers, concurrent
    callers)."""
    reason = re.sub(r"^under stress \([^)]*\): ", "", rec.reason or "")
    if rec.status == "crash":
        sig = re.search(r"\bSIG[A-Z]+\b", reason)
        return f"crash {sig.group(0)}" if sig else "crash"
    if rec.status in ("timeout", "error"):
        return rec.status
    m = re.match(r"property ([a-z-]+)", reason)
    if m:
        return f"property {m.group(1)}"
    if "concurrent calls" in reason.split(":", 1)[0]:
        return "concurrent callers: " + _plain(reason.split(":", 1)[-1])
    if reason.startswith("on a second call with its buffers rewritten"):
        return "second call on rewritten buffers: " + _plain(reason.split(":", 1)[-1])
    return _plain(reason)


def exception_for(kind: str, _made: dict = {}) -> type:  # noqa: B006 (a cache by design)
    """One exception class per kind, so that the shrinker keeps kinds apart."""
    if kind not in _made:
        name = "Found_" + re.sub(r"\W+", "_", kind)
        _made[kind] = type(name, (AssertionError,), {"kind": kind})
    return _made[kind]
