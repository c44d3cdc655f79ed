"""What the last `probe check` found failing, by backend, so that `probe check
--last-failed` reruns just those cases (pytest's --lf, for a kernel being fixed).

One small JSON file in the cache directory ($SDPA_PROBE_LAST_CHECK names another).
A run replaces, for each backend it checked, the failures among the cases it ran and
keeps those of cases it did not run; a file that cannot be read is an empty record."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .build import cache_root
from .records import FAILING, Record

SCHEMA = 1
MAX_BACKENDS = 64  # your kernels are backends by path: the oldest records go first


def path() -> Path:
    env = os.environ.get("SDPA_PROBE_LAST_CHECK")
    return Path(env).expanduser() if env else cache_root() / "last-check.json"


def load() -> dict[str, set[str]]:
    """Failing case ids by backend name, as the last runs left them."""
    try:
        doc = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return {}
    failed = doc.get("failed")
    if not isinstance(failed, dict):
        return {}
    return {b: {i for i in ids if isinstance(i, str)} for b, ids in failed.items()
            if isinstance(ids, list)}


def failed_for(backends: list[str]) -> set[str]:
    state = load()
    return set().union(*(state.get(b, set()) for b in backends))


def record(records: list[Record], ran: set[str], backends: list[str]) -> None:
    """Keep this run's failures; raises OSError when the file cannot be written."""
    state = load()
    for b in backends:  # (the backends of this run move to the end: the newest)
        now = {r.case for r in records if r.backend == b and r.status in FAILING}
        state[b] = (state.pop(b, set()) - ran) | now
    kept = [(b, ids) for b, ids in state.items() if ids][-MAX_BACKENDS:]
    doc = {"schema": SCHEMA, "failed": {b: sorted(ids) for b, ids in kept}}
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".last-check-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
