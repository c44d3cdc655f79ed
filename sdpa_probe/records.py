"""A check record: one backend's verdict on one case, the same shape whichever suite
made it, as `probe check --json` writes it (docs/check.md, "JSON record"), and the
command that reproduces it."""

from __future__ import annotations

import dataclasses
from typing import Any

from .backends.registry import is_kernel_file
from .cases import Case

STATUSES = ("pass", "fail", "crash", "timeout", "unsupported", "error")
FAILING = ("fail", "crash", "timeout", "error")


def repro_command(backend: str, case_id: str, after: str | None = None) -> str:
    then = f" --after {after}" if after else ""
    if is_kernel_file(backend):
        return f"probe check --kernel {backend} --repro {case_id}{then}"
    return f"probe check --repro {case_id} --backend {backend}{then}"


@dataclasses.dataclass
class Record:
    backend: str
    case: str                                 # the case's id
    family: str
    status: str = "error"                     # one of STATUSES
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    nmse: float | None = None
    worst: list[int] | None = None            # [batch, query row, head, dim]
    atol: float | None = None
    rtol: float | None = None
    torch_err: float | None = None            # torch's own max abs error on the case
    convention: str | None = None             # judged under the backend's convention (a
    #                                           pass there: the float64 oracle failed it)
    products: str | None = None               # the dtype its products round to (flash_bf16:
    #                                           bf16): tolerance and torch_err at that dtype
    seconds: float | None = None
    leak_bytes_per_call: int | None = None
    repeatable: bool | None = None            # False: a repeat passed but differed bit for bit
    fresh_retry: str | None = None            # a failure's status on fresh copies of its inputs
    after_case: str | None = None             # the case run before it that it depends on
    repro: str = ""
    # kept in this process only, never written: what a repro maps, and whether a
    # failure is about the inputs (a sampled verdict, such as thread use, is not)
    output: Any = dataclasses.field(default=None, repr=False, compare=False)
    reference: Any = dataclasses.field(default=None, repr=False, compare=False)
    retry_on_fresh_inputs: bool = dataclasses.field(default=True, repr=False, compare=False)

    def as_dict(self) -> dict:
        """The JSON shape: every field but the in-process ones, in this order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in _IN_PROCESS}

    def update(self, **fields) -> None:
        for name, value in fields.items():
            if name not in _FIELDS:
                raise AttributeError(f"a record has no field {name!r}")
            setattr(self, name, value)

    # Read as the JSON shape's mapping (reports and their readers index records so)
    def __getitem__(self, name: str):
        if name not in _FIELDS or name in _IN_PROCESS:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default=None):
        try:
            return self[name]
        except KeyError:
            return default


_IN_PROCESS = ("output", "reference", "retry_on_fresh_inputs")
_FIELDS = {f.name for f in dataclasses.fields(Record)}


def base_record(backend: str, case: Case) -> Record:
    """A record of `backend` on `case`, status "error" until a verdict is written."""
    return Record(backend, case.id, case.family, repro=repro_command(backend, case.id))
