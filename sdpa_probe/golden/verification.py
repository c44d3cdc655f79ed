"""`probe golden verify`: a golden set's manifest, every file's size, sha256 and
contents, the semantics its references encode, and (optionally) its inputs
regenerated from their seeds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from ..cases import Case
from .format import MANIFEST, GoldenError, default_dir, inputs_digest, show_path
from .manifest import Problem, check_blob, inputs_mismatch, parse_blob, read_manifest
from .provenance import semantics, versions


@dataclasses.dataclass
class VerifyResult:
    root: Path
    n_cases: int
    problems: list[Problem]
    notes: list[str]
    manifest: dict | None

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        m = self.manifest or {}
        return {"schema": "sdpa_probe.golden-verify/1", "dir": str(self.root), "ok": self.ok,
                "cases": self.n_cases, "versions": m.get("versions"),
                "problems": [p.as_dict() for p in self.problems], "notes": self.notes}


def _expected_shape(case: Case) -> list[int]:
    return [case.batch, case.q_len, case.n_heads, case.head_dim]


def _case_problem(root: Path, ent: dict, man: dict, check_inputs: bool) -> Problem | None:
    """The first thing wrong with one stored case, if any."""
    case = Case(**ent["params"])
    if ent["shape"] != _expected_shape(case):
        return Problem(ent["file"], "schema", f"{ent['file']}: shape {ent['shape']} "
                                              f"does not fit the case parameters")
    blob, prob = check_blob(root, ent)
    if prob:
        return prob
    try:
        parse_blob(show_path(root / ent["file"]), blob, ent)
    except GoldenError as exc:
        return Problem(ent["file"], "unreadable", str(exc))
    if check_inputs:
        # deferred: the inputs import torch
        from ..inputs import materialise

        if inputs_digest(materialise(case)) != ent["inputs_sha256"]:
            return Problem(ent["file"], "inputs", inputs_mismatch(ent, man))
    return None


def golden_root(root: Path | None) -> Path:
    """The golden directory asked for (None: default_dir()); GoldenError if it is none."""
    root = default_dir() if root is None else Path(root)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise GoldenError(f"no golden directory {show_path(root)}: it {what}")
    return root


def verify(root: Path | None = None, check_inputs: bool = True,
           progress: Callable[[str], None] | None = None) -> VerifyResult:
    """Schema, sizes, hashes and contents of every file; optionally the inputs
    regenerated from each seed against their recorded sha256. root: the golden
    directory (None: default_dir())."""
    root = golden_root(root)
    man, probs = read_manifest(root)
    if man is None:
        return VerifyResult(root, 0, probs, [], None)
    notes = []
    now = versions()
    for k, v in man["versions"].items():
        if now.get(k) != v:
            notes.append(f"made with {k} {v}; this environment has {now.get(k)}")
    live = semantics()
    for k, v in man["semantics"].items():
        if live.get(k) != v:
            probs.append(Problem(MANIFEST, "semantics",
                                 f"{show_path(root / MANIFEST)}: the data encodes {k} = {v!r}; "
                                 f"this sdpa_probe's oracle gives {live.get(k)!r}"))
    for ent in man["cases"]:
        if progress:
            progress(ent["id"])
        prob = _case_problem(root, ent, man, check_inputs)
        if prob:
            probs.append(prob)
    listed = {e["file"] for e in man["cases"]}
    for p in sorted(root.glob("*.npz")):
        if p.name not in listed:
            notes.append(f"{show_path(p)} is not in the manifest (ignored)")
    return VerifyResult(root, len(man["cases"]), probs, notes, man)
