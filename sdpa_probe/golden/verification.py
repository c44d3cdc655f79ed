"""`probe golden verify`, and what `probe check --golden` runs before it judges
anything: a golden set's manifest and header, every case's file (size, sha256,
contents) and whole record (its digest, and the manifest's fields against the
arrays), the semantics its references encode, and (with the inputs) each case's
inputs, reference and torch error recomputed from its seed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

from ..cases import Case
from .format import MANIFEST, GoldenError, default_dir, show_path
from .manifest import (
    CaseProblem,
    Problem,
    header_problems,
    read_case,
    read_manifest,
    record_problems,
)
from .provenance import semantics, versions
from .recompute import bounds_note, made_here, one_thread, recompute_problems


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


class GoldenProblems(GoldenError):
    """A golden set that verify finds problems in: no kernel is judged against it."""

    def __init__(self, res: VerifyResult):
        lines = [f"  {p.kind:>10}  {p.message}" for p in res.problems]
        super().__init__(f"{len(res.problems)} problem(s) in the golden data "
                         f"{show_path(res.root)}, so no kernel was judged against it (probe "
                         f"golden verify lists the same; probe golden regen rewrites the set):\n"
                         + "\n".join(lines))
        self.result = res


def _case_problems(root: Path, ent: dict, man: dict, check_inputs: bool,
                   exact: bool) -> list[Problem]:
    """What is wrong with one stored case: its file first (nothing more can be read
    then), its record, then what its inputs recompute."""
    case = Case(**ent["params"])
    if ent["shape"] != [case.batch, case.q_len, case.n_heads, case.head_dim]:
        return [Problem(ent["file"], "schema", f"{ent['file']}: shape {ent['shape']} "
                                               f"does not fit the case parameters")]
    try:
        ref, terr = read_case(root, ent)
    except CaseProblem as exc:
        return [exc.problem]
    probs = record_problems(man, ent, ref, terr)
    if check_inputs:
        probs += recompute_problems(ent, man, ref, terr, exact)
    return probs


def golden_root(root: Path | None, holding: bool = False) -> Path:
    """The golden directory asked for (None: default_dir()); GoldenError if it is none,
    or with holding, if it holds no golden data at all (neither a manifest nor a case
    file: not a damaged set, another directory)."""
    root = default_dir() if root is None else Path(root)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise GoldenError(f"no golden directory {show_path(root)}: it {what}")
    if holding and not (root / MANIFEST).exists() and not any(root.glob("*.npz")):
        raise GoldenError(f"{show_path(root)} holds no golden data (no {MANIFEST}, no .npz "
                          f"files)")
    return root


def verify(root: Path | None = None, check_inputs: bool = True,
           progress: Callable[[str], None] | None = None,
           ids: Iterable[str] | None = None) -> VerifyResult:
    """The manifest, its header and semantics, and every case's file and record; with
    check_inputs, also each case's inputs, reference and torch error recomputed from its
    seed. root: the golden directory (None: default_dir()); ids: only these cases (those
    a check selected; None: all)."""
    root = golden_root(root)
    man, probs = read_manifest(root)
    if man is None:
        return VerifyResult(root, 0, probs, [], None)
    notes = []
    now = versions()
    for k, v in man["versions"].items():
        if now.get(k) != v:
            notes.append(f"made with {k} {v}; this environment has {now.get(k)}")
    exact = made_here(man)
    if check_inputs and not exact:
        notes.append(bounds_note(man))
    probs += header_problems(man, root)
    live = semantics()
    for k, v in man["semantics"].items():
        if live.get(k) != v:
            probs.append(Problem(MANIFEST, "semantics",
                                 f"{show_path(root / MANIFEST)}: the data encodes {k} = {v!r}; "
                                 f"this sdpa_probe's oracle gives {live.get(k)!r}"))
    wanted = None if ids is None else set(ids)
    entries = [e for e in man["cases"] if wanted is None or e["id"] in wanted]
    with one_thread():
        for ent in entries:
            if progress:
                progress(ent["id"])
            probs += _case_problems(root, ent, man, check_inputs, exact)
    listed = {e["file"] for e in man["cases"]}
    for p in sorted(root.glob("*.npz")) if wanted is None else ():
        if p.name not in listed:
            notes.append(f"{show_path(p)} is not in the manifest (ignored)")
    return VerifyResult(root, len(entries), probs, notes, man)
