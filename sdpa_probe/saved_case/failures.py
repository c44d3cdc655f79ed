"""`probe check --save DIR`: the failing cases of a run, each written into DIR/CASE_ID
for its C driver (at most SAVE_MAX_CASES of them, first failures first)."""

from __future__ import annotations

from pathlib import Path

from ..cases import Case, judged_tolerance
from ..oracle import prepare_case
from ..records import FAILING, Record
from .writer import save_case

SAVE_MAX_CASES = 8


def save_failures(directory: Path, records: list[Record], cases: list[Case],
                  kernel: str | None, kernel_backend: str | None) -> tuple[list[Path], int]:
    """(the directories written, the failing cases left unsaved past the cap). A case
    failing on several backends is saved once; its Makefile builds `kernel` (your
    --kernel file, whose records are `kernel_backend`'s; none: `make KERNEL=...`)."""
    by_id = {c.id: c for c in cases}
    failing: dict[str, Record] = {}
    for r in records:
        case = by_id.get(r.case)
        if r.status in FAILING and case is not None and case.needs_reference:
            if r.case not in failing or r.backend == kernel_backend:
                failing[r.case] = r
    saved = []
    for case_id, rec in list(failing.items())[:SAVE_MAX_CASES]:
        case = by_id[case_id]
        prep = prepare_case(case)
        atol, rtol = ((rec.atol, rec.rtol) if rec.atol is not None
                      else judged_tolerance(case, prep.torch_err))
        save_case(directory / case_id, case, prep.data, prep.ref, atol, rtol, kernel,
                  rec.as_dict())
        saved.append(directory / case_id)
    return saved, max(0, len(failing) - SAVE_MAX_CASES)
