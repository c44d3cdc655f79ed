"""`probe golden regen`: select the cases, regenerate their references in memory,
compare them with the stored set, and write only what may be written (a reference
that moved beyond tolerance, a semantics change or a dropped case needs --accept)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..cases import SUITES, Case, all_cases, suite
from ..children import process_alive
from ..errors import ProbeError
from .drift import DRIFT_FRACTION, compare, count_statuses
from .format import (
    DEFAULT_SUITE,
    GENERATOR,
    MANIFEST,
    SCHEMA,
    SCHEMA_VERSION,
    GoldenError,
    default_dir,
    inputs_digest,
    manifest_bytes,
    npz_bytes,
    seal,
    sha256,
    show_path,
    summary,
)
from .manifest import CaseProblem, header_problems, load_case, read_case, read_manifest
from .provenance import semantics, torch_err_comparable, versions
from .recompute import one_thread


@dataclasses.dataclass
class Entry:
    """One case's golden data, in memory."""

    case: Case
    ref: np.ndarray
    torch_err: float | None
    inputs_sha256: str
    blob: bytes | None = None

    @property
    def file(self) -> str:
        return f"{self.case.id}.npz"

    def to_bytes(self) -> bytes:
        if self.blob is None:
            terr = np.float64(np.nan if self.torch_err is None else self.torch_err)
            self.blob = npz_bytes({"ref": self.ref.astype(np.float64), "torch_err": terr})
        return self.blob

    def manifest_entry(self) -> dict:
        """Its manifest entry, but the record digest (seal() adds it)."""
        blob = self.to_bytes()
        return {"id": self.case.id, "file": self.file, "bytes": len(blob),
                "sha256": sha256(blob), "inputs_sha256": self.inputs_sha256,
                "seed": self.case.seed, "params": self.case.params(),
                **summary(self.ref, self.torch_err)}


def generate(case: Case) -> Entry:
    """Inputs from the seed, the float64 oracle, and torch's own error."""
    from ..backends import torch_error  # deferred: torch takes seconds to import
    from ..inputs import materialise  # deferred: torch
    from ..reference import sdpa_reference  # deferred: torch (and read at call time)

    data = materialise(case)
    ref = sdpa_reference(data.q, data.k, data.v, mask=data.mask_t, is_causal=case.causal,
                         start_pos=case.start_pos, scale=case.scale).numpy()
    return Entry(case, ref, torch_error(data, ref), inputs_digest(data))


def build_manifest(entries: Iterable[Entry], suite_name: str | None) -> dict:
    """The manifest of these entries, sealed: its header and every case's whole record
    hashed."""
    entries = sorted(entries, key=lambda e: e.case.id)
    man = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "generator": dict(GENERATOR),
           "versions": versions(), "semantics": semantics(), "suite": suite_name,
           "header_sha256": "", "cases": [e.manifest_entry() for e in entries]}
    return seal(man, {e.case.id: (e.ref, e.torch_err) for e in entries})


# ---- selecting -----------------------------------------------------------------------

def reference_suite(name: str) -> list[Case]:
    """A suite's cases that have a reference (not its invalid-argument calls)."""
    return [c for c in suite(name) if c.needs_reference]


def select_cases(specs: list[str] | None, suite_name: str) -> list[Case]:
    """--cases: ids, or substrings of ids, from the full matrix (repeatable, comma
    separated); none: the whole suite."""
    if not specs:
        try:
            return reference_suite(suite_name)
        except KeyError:
            raise ProbeError(f"unknown suite {suite_name!r}; known: smoke, default, full") \
                from None
    every = all_cases()
    chosen: dict[str, Case] = {}
    for spec in specs:
        for s in (x.strip() for x in spec.split(",")):
            if not s:
                continue
            hits = [every[s]] if s in every else [c for i, c in every.items() if s in i]
            if not hits:
                raise ProbeError(f"no case id matches {s!r} (ids: probe check --list --suite "
                                 f"full)")
            hits = [c for c in hits if c.needs_reference]
            if not hits:
                raise ProbeError(f"{s!r} matches only invalid-argument cases, which are "
                                 "judged on their status and have no reference")
            for c in hits:
                chosen[c.id] = c
    if not chosen:
        raise ProbeError("--cases is empty: give case ids (or parts of ids), comma separated")
    return list(chosen.values())


# ---- planning ------------------------------------------------------------------------

@dataclasses.dataclass
class RegenPlan:
    root: Path
    entries: list[Entry]            # every case the new manifest lists
    rows: list[dict]                # per regenerated case: status new/same/within/changed
    removed: list[str]              # ids the new manifest drops
    blocking: list[str]             # why writing needs --accept
    old_manifest: dict | None
    new_manifest: dict
    written: bool = False
    refused: bool = False           # blocked and not accepted: nothing written
    accepted: bool = False          # blocked, accepted and written

    @property
    def counts(self) -> dict[str, int]:
        return count_statuses(self.rows)

    @property
    def nbytes(self) -> int:
        """The new set's case files, in bytes."""
        return sum(len(e.to_bytes()) for e in self.entries)

    def version_changes(self) -> dict[str, tuple]:
        """The versions that differ from the stored set's: name -> (old, new)."""
        old = (self.old_manifest or {}).get("versions") or {}
        new = self.new_manifest["versions"]
        if not old or old == new:
            return {}
        return {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}

    def set_blocking(self) -> list[str]:
        """The reasons for --accept that are about the set, not about one case's row."""
        return [b for b in self.blocking
                if not any(b.startswith(f"{r['case']}: ") for r in self.rows)]

    def as_dict(self) -> dict:
        return {"schema": "sdpa_probe.golden-regen/1", "dir": str(self.root),
                "written": self.written, "cases": len(self.entries), "counts": self.counts,
                "removed": self.removed, "blocking": self.blocking,
                "versions": self.new_manifest["versions"],
                "old_versions": (self.old_manifest or {}).get("versions"), "rows": self.rows,
                "accepted": self.accepted}


def _stored_state(root: Path) -> tuple[dict | None, dict[str, dict], list[str]]:
    """The stored manifest, its entries by id, and what about it blocks writing (the
    oracle's semantics moved, or a manifest that cannot be read)."""
    old_man, old_probs = read_manifest(root)
    blocking: list[str] = []
    if old_man is None:
        if old_probs and old_probs[0].kind != "missing":
            blocking.append(f"the existing manifest cannot be read, so nothing can be "
                            f"compared: {old_probs[0].message}")
        return None, {}, blocking
    live = semantics()
    for k, v in old_man["semantics"].items():
        if live.get(k) != v:
            blocking.append(f"semantics: {k} was {v!r}, the oracle now gives {live.get(k)!r}")
    return old_man, {e["id"]: e for e in old_man["cases"]}, blocking


def _refuse_mixed_machines(kept: set[str], old_man: dict | None, now: dict) -> None:
    # the manifest has one set of versions: stored torch_err values made under
    # another ISA / CPU beside fresh ones would be read as this machine's
    if not kept or torch_err_comparable(old_man, now):
        return
    was = old_man.get("versions") or {}
    raise GoldenError(
        f"the {len(kept)} stored case(s) this regen would keep were made under torch_cpu "
        f"{was.get('torch_cpu')} on {was.get('cpu')!r}, this machine is "
        f"{now['versions']['torch_cpu']} on {now['versions']['cpu']!r}: regenerate every "
        f"stored case here (the suite, or --cases naming them all) or add the cases on "
        f"such a machine")


def _generate_all(cases: list[Case], progress: Callable[[Case], None] | None) -> list[Entry]:
    fresh = []
    with one_thread():  # one reduction order: the same bytes on every rerun
        for c in cases:
            if progress:
                progress(c)
            fresh.append(generate(c))
    return fresh


def _compare_row(root: Path, e: Entry, ent: dict | None, drift: float,
                 comparable: bool) -> tuple[dict, str | None]:
    """A regenerated case against its stored version: (row, why it blocks or None)."""
    if ent is None:
        path = root / e.file
        if path.exists() and (not path.is_file() or path.read_bytes() != e.to_bytes()):
            why = f"{show_path(path)} exists but no manifest describes it; it would be overwritten"
            return {"case": e.case.id, "status": "new", "reasons": []}, why
        return {"case": e.case.id, "status": "new", "reasons": []}, None
    try:
        old_ref, old_terr = read_case(root, ent)  # (an edited record: compared as it is)
    except CaseProblem as exc:
        row = {"case": e.case.id, "status": "changed",
               "reasons": [f"the stored file cannot be compared: {exc.problem.message}"]}
    else:
        row = compare(e.case, old_ref, old_terr, ent["inputs_sha256"], e.ref,
                      e.torch_err, e.inputs_sha256, drift, comparable)
    why = f"{e.case.id}: " + "; ".join(row["reasons"]) if row["status"] == "changed" else None
    return row, why


def _carried_over(root: Path, old_man: dict | None, new_ids: set[str],
                  prune: bool) -> tuple[list[Entry], list[str]]:
    """The stored cases not regenerated: kept as stored (file and record verified
    first), or with prune removed. Returns (kept entries, removed ids)."""
    kept: list[Entry] = []
    removed: list[str] = []
    old_entries = {e["id"]: e for e in (old_man or {}).get("cases", [])}
    # (a version 1 manifest is kept unhashed: this write seals it)
    edited = [p for p in header_problems(old_man, root) if p.kind == "record"] \
        if old_man else []
    for cid, ent in sorted(old_entries.items()):
        if cid in new_ids:
            continue
        if prune:
            removed.append(cid)
            continue
        try:
            if edited:
                raise CaseProblem(edited[0])
            ref, terr = load_case(root, old_man, ent)
        except CaseProblem as exc:
            raise GoldenError(f"cannot keep {cid}: {exc}; regenerate it too "
                              f"(--cases {cid}) or run a full regen") from None
        kept.append(Entry(Case(**ent["params"]), ref, terr, ent["inputs_sha256"],
                          (root / ent["file"]).read_bytes()))
    return kept, removed


def plan_regen(root: Path, cases: list[Case], *, prune: bool, suite_name: str | None,
               drift: float = DRIFT_FRACTION,
               progress: Callable[[Case], None] | None = None) -> RegenPlan:
    """Regenerate `cases` in memory and compare with what `root` holds. With prune,
    the new set is exactly `cases`; without, the other stored cases are kept as they
    are (their files are verified first)."""
    old_man, old_entries, blocking = _stored_state(root)
    kept_ids = set(old_entries) - {c.id for c in cases} if not prune else set()
    now = {"versions": versions()}
    _refuse_mixed_machines(kept_ids, old_man, now)
    comparable = torch_err_comparable(old_man, now)
    fresh = _generate_all(cases, progress)
    rows = []
    for e in fresh:
        row, why = _compare_row(root, e, old_entries.get(e.case.id), drift, comparable)
        rows.append(row)
        if why:
            blocking.append(why)
    kept, removed = _carried_over(root, old_man, {e.case.id for e in fresh}, prune)
    entries = fresh + kept
    if removed:
        blocking.append(f"{len(removed)} stored case(s) are not in the new set and would be "
                        f"removed: {', '.join(removed[:5])}" + (" ..." if len(removed) > 5 else ""))
    if not prune and old_man is not None:
        suite_name = old_man.get("suite")
    ids = {e.case.id for e in entries}
    if suite_name not in SUITES or ids != {c.id for c in reference_suite(suite_name)}:
        suite_name = None  # not exactly a suite: the manifest's case list says what it is
    new_man = build_manifest(entries, suite_name)
    return RegenPlan(root, entries, rows, removed, blocking, old_man, new_man)


# ---- writing -------------------------------------------------------------------------

def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_plan(plan: RegenPlan) -> None:
    """The new set is made whole in a folder beside the old one (unchanged files hard
    links to the old ones, changed files written, dropped cases' files left out, the
    manifest last), then swapped in by renames: a regeneration killed at any point
    leaves the old set as it was (recover_swap puts it back if the kill fell between
    the two renames)."""
    root = plan.root
    new = root.with_name(f".{root.name}.new-{os.getpid()}")
    try:
        recover_swap(root)
        if root.is_dir():
            shutil.copytree(root, new, copy_function=_link_or_copy)
        else:
            new.mkdir(parents=True)
        _fill(plan, new)
        _swap_in(new, root)
    except OSError as exc:
        raise ProbeError(f"cannot write the golden data in {show_path(root)}: "
                         f"{exc.strerror or exc}") from None
    finally:
        shutil.rmtree(new, ignore_errors=True)
    plan.written = True


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # (another file system, or no hard links)
        shutil.copy2(src, dst)


def _fill(plan: RegenPlan, folder: Path) -> None:
    """Changed files written (a new file each: never into a hard link to the old set),
    dropped cases' files removed, the manifest last."""
    for e in plan.entries:
        path = folder / e.file
        blob = e.to_bytes()
        if path.is_file() and path.read_bytes() == blob:
            continue
        _write_atomic(path, blob)
    old = {e["id"]: e["file"] for e in (plan.old_manifest or {}).get("cases", [])}
    keep = {e.file for e in plan.entries}
    for cid in plan.removed:
        f = old.get(cid)
        if f and f not in keep:
            (folder / f).unlink(missing_ok=True)
    man = manifest_bytes(plan.new_manifest)
    mpath = folder / MANIFEST
    if not (mpath.is_file() and mpath.read_bytes() == man):
        _write_atomic(mpath, man)


def _swap_in(new: Path, root: Path) -> None:
    old = root.with_name(f".{root.name}.old-{os.getpid()}")
    if root.exists():
        os.rename(root, old)
    os.rename(new, root)
    shutil.rmtree(old, ignore_errors=True)


def recover_swap(root: Path) -> None:
    """After a regeneration that was killed: the old set put back if the kill fell
    between its two renames, and the folders it left removed."""
    olds = sorted(root.parent.glob(f".{root.name}.old-*"))
    if not root.exists() and olds:
        os.rename(olds[-1], root)
    for p in [*root.parent.glob(f".{root.name}.old-*"),
              *root.parent.glob(f".{root.name}.new-*")]:
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def regenerate(cases: list[str] | None = None, suite_name: str = DEFAULT_SUITE, *,
               root: Path | None = None, accept: bool = False, drift: float = DRIFT_FRACTION,
               dry_run: bool = False,
               progress: Callable[[Case | None, int], None] | None = None) -> RegenPlan:
    """`probe golden regen`: the cases (--cases ids or parts of ids, the other stored cases
    kept; else exactly the suite), regenerated and compared with the set in `root`
    (None: default_dir()), then written unless it is a dry run or the plan is blocked and
    not accepted. progress(None, total) is called once the cases are selected, then
    progress(case, total) before each case is generated."""
    root = default_dir() if root is None else Path(root)
    if root.exists() and not root.is_dir():
        raise GoldenError(f"--dir {show_path(root)} is not a directory")
    selected = select_cases(cases, suite_name)

    def step(case: Case) -> None:
        progress(case, len(selected))

    if progress is not None:
        progress(None, len(selected))
    plan = plan_regen(root, selected, prune=not cases, suite_name=None if cases else suite_name,
                      drift=drift, progress=step if progress is not None else None)
    plan.refused = bool(plan.blocking) and not accept
    plan.accepted = bool(plan.blocking) and accept and not dry_run
    if not plan.refused and not dry_run:
        write_plan(plan)
    return plan
