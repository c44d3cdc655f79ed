"""A check record: one backend's verdict on one case, as `probe check --json` writes
it (docs/check.md: every record has the same keys, whichever suite made it), and the
command that reproduces it. Keys starting with "_" are kept in-process only (the
output buffer and reference a repro maps) and never written."""

from __future__ import annotations

from .backends.registry import is_kernel_file
from .cases import Case

STATUSES = ("pass", "fail", "crash", "timeout", "unsupported", "error")
FAILING = ("fail", "crash", "timeout", "error")


def repro_command(backend: str, case_id: str, after: str | None = None) -> str:
    then = f" --after {after}" if after else ""
    if is_kernel_file(backend):
        return f"probe check --kernel {backend} --repro {case_id}{then}"
    return f"probe check --repro {case_id} --backend {backend}{then}"


def new_record(backend: str, case_id: str, family: str, repro: str) -> dict:
    """A record with every key, status "error" until a verdict is written into it."""
    return {"backend": backend, "case": case_id, "family": family, "status": "error",
            "reason": "", "max_abs_err": None, "max_rel_err": None, "nmse": None,
            "worst": None, "atol": None, "rtol": None, "torch_err": None, "seconds": None,
            "leak_bytes_per_call": None, "repeatable": None, "fresh_retry": None,
            "after_case": None, "repro": repro}


def base_record(backend: str, case: Case) -> dict:
    return new_record(backend, case.id, case.family, repro_command(backend, case.id))


def public(record: dict) -> dict:
    """The record as written to JSON: without its in-process keys."""
    return {k: v for k, v in record.items() if not k.startswith("_")}
