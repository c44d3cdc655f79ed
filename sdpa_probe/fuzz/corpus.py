"""A corpus: a directory of the cases fuzzing found, one JSON file each, that
`probe check --corpus DIR` replays as a suite. A file holds the case's spec (the case
itself, cases/spec.py), its id and what was found; nothing of the generator's own."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..cases import Case
from ..cases.spec import parse_spec, spec_of
from ..errors import ProbeError
from ..outputs import write_text

SCHEMA = "sdpa_probe.corpus/1"


def file_name(case: Case, kind: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")[:40] or "failure"
    return f"{slug}-{hashlib.sha256(spec_of(case).encode()).hexdigest()[:10]}.json"


def save(root: Path, case: Case, backend: str, kind: str, reason: str) -> Path:
    """The case written into root (made if need be); the same case found again
    overwrites its own file."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / file_name(case, kind)
    doc = {"schema": SCHEMA, "spec": spec_of(case), "id": case.id, "backend": backend,
           "kind": kind, "reason": reason}
    write_text(str(path), json.dumps(doc, indent=1) + "\n")
    return path


def load(root: Path) -> list[Case]:
    """Every case of a corpus directory, in file-name order; ProbeError (one line) for
    a missing directory or a file that is not a corpus case."""
    if not root.is_dir():
        raise ProbeError(f"--corpus {root}: not a directory")
    cases: dict[str, Case] = {}
    for path in sorted(root.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            if doc.get("schema") != SCHEMA:
                raise ValueError(f"schema is not {SCHEMA}")
            case = parse_spec(doc["spec"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ProbeError(f"--corpus: {path} is not a corpus case: {exc}") from None
        cases.setdefault(case.id + "|" + spec_of(case), case)
    if not cases:
        raise ProbeError(f"--corpus {root}: no case files (*.json) in it")
    return list(cases.values())
