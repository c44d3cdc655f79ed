"""A golden directory opened for reading references: the `probe check --golden` path,
which takes each case's float64 reference and torch error from the stored set instead
of the oracle."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..cases import Case
from .format import MANIFEST, GoldenError, inputs_digest, show_path
from .manifest import check_blob, inputs_mismatch, load_case, read_manifest


class GoldenStore:
    """A golden directory opened for reading references (the `--golden` check path)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        man, probs = read_manifest(self.root)
        if man is None:
            raise GoldenError(f"{probs[0].message} (see probe golden verify)")
        self.manifest = man
        self.entries = {e["id"]: e for e in man["cases"]}

    def missing(self, cases: Iterable[Case]) -> list[str]:
        """Cases judged against a reference that the set does not hold."""
        return [c.id for c in cases if c.needs_reference and c.id not in self.entries]

    def require(self, cases: list[Case]) -> None:
        """Every case stored, every file intact: else one GoldenError naming the first."""
        miss = self.missing(cases)
        if miss:
            more = f" and {len(miss) - 3} more" if len(miss) > 3 else ""
            raise GoldenError(f"{len(miss)} selected case(s) are not in the golden set "
                              f"{show_path(self.root)}: {', '.join(miss[:3])}{more}; select "
                              f"stored cases with -k, or add them with probe golden regen "
                              f"--cases ID")
        for c in (c for c in cases if c.needs_reference):
            _, prob = check_blob(self.root, self.entries[c.id])
            if prob:
                raise GoldenError(f"{prob.message} (see probe golden verify)")

    def reference(self, case: Case, data=None) -> tuple[np.ndarray, float | None]:
        """(ref, torch_err) for a case; with its materialised inputs, also proves they
        are the inputs the reference was made from."""
        ent = self.entries.get(case.id)
        if ent is None:
            raise GoldenError(f"case {case.id} is not in the golden set {show_path(self.root)}")
        ref, terr = load_case(self.root, self.manifest, ent)
        if data is not None and inputs_digest(data) != ent["inputs_sha256"]:
            raise GoldenError(inputs_mismatch(ent, self.manifest))
        return ref, terr


_stores: dict[str, tuple[tuple, GoldenStore]] = {}


def store(root: Path | str) -> GoldenStore:
    """A GoldenStore per directory, read again only when its manifest changes."""
    key = str(Path(root).resolve())
    try:
        st = (Path(root) / MANIFEST).stat()
        stamp: tuple = (st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        stamp = ()
    hit = _stores.get(key)
    if hit is None or hit[0] != stamp or not stamp:
        _stores[key] = (stamp, GoldenStore(Path(root)))
    return _stores[key][1]
