"""What `probe golden verify` (and `probe check --golden`, before it judges anything)
recomputes from a stored case's inputs: the float64 reference and torch's own error,
compared with what the set stores, so an edit of either that kept every hash
consistent is still found."""

from __future__ import annotations

import contextlib

import numpy as np

from ..cases import Case, judged_tolerance, tolerance
from .format import inputs_digest
from .manifest import Problem, inputs_mismatch
from .provenance import versions

# Where the set was made (the same torch, torch CPU capability and CPU model) both
# recompute bit for bit: measured on the 238 cases of the default set, with 1 and 2
# torch threads. torch_err may still move by float64 rounding (TORCH_ERR_REL, far
# below one float32 last bit of torch's output, 6e-8 relative).
TORCH_ERR_REL = 1e-12
# Elsewhere the float64 reference may round differently in its last bits (another
# BLAS path; it was bit-identical here under AVX512, AVX2 and torch's non-vector
# path), so it is compared within REF_BOUND x the case's tolerance, which can move no
# verdict; torch's error moves with the ISA torch dispatches to and the CPU's BLAS
# path (the effective atol, max(atol, 3 x torch_err), moved up to 1.35x between AVX512
# and AVX2 here, 6.0x to the non-vector path), so it is compared through the atol it
# gives, within a factor of TORCH_ERR_FACTOR.
REF_BOUND = 1e-6
TORCH_ERR_FACTOR = 10.0
_MADE_ON = ("torch", "torch_cpu", "cpu")


def made_here(man: dict) -> bool:
    """Whether this machine recomputes the set bit for bit: the torch, torch CPU
    capability and CPU model it was made with."""
    now, was = versions(), man.get("versions") or {}
    return all(was.get(k) is not None and was.get(k) == now.get(k) for k in _MADE_ON)


def bounds_note(man: dict) -> str:
    """What verify compares where the set was not made (the note it prints)."""
    was = man.get("versions") or {}
    return (f"made with torch {was.get('torch')} ({was.get('torch_cpu')}) on "
            f"{was.get('cpu')!r}, not this machine: references compared within "
            f"{REF_BOUND:g} x tolerance, torch_err through the atol it gives within a "
            f"factor of {TORCH_ERR_FACTOR:g} (bit for bit where it was made)")


@contextlib.contextmanager
def one_thread():
    """torch on one thread, as regen computed torch_err (a check worker's reduction order)."""
    # deferred: torch takes seconds to import
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _at(idx) -> str:
    return "b={} q={} h={} d={}".format(*(int(x) for x in idx))


def reference_mismatch(case: Case, stored: np.ndarray, live: np.ndarray,
                       exact: bool) -> str | None:
    """How the stored reference differs from the oracle's on the same inputs, if it
    does beyond what this machine allows (exact: not at all)."""
    if stored.shape != live.shape:
        return f"the stored reference is {list(stored.shape)}, the oracle gives {list(live.shape)}"
    fs, fl = np.isfinite(stored), np.isfinite(live)
    if (fs != fl).any():
        idx = np.argwhere(fs != fl)[0]
        return (f"NaN/Inf at {int((fs != fl).sum())} elements where the oracle's is not, or "
                f"the reverse; first at {_at(idx)} (stored {stored[tuple(idx)]:.17g}, "
                f"oracle {live[tuple(idx)]:.17g})")
    delta = np.where(fs, np.abs(stored - live), 0.0)
    if exact:
        moved = delta > 0
        what = "they must match bit for bit on the machine the set was made on"
    else:
        atol, rtol = tolerance(case)
        moved = delta > REF_BOUND * (atol + rtol * np.abs(np.where(fl, live, 0.0)))
        what = f"by more than {REF_BOUND:g} x tolerance"
    if not moved.any():
        return None
    idx = tuple(np.unravel_index(int(np.argmax(np.where(moved, delta, -1.0))), delta.shape))
    return (f"the stored reference differs from the oracle's on its inputs at "
            f"{int(moved.sum())} of {delta.size} elements ({what}); worst |delta| "
            f"{delta[idx]:.3g} at {_at(idx)} (stored {stored[idx]:.17g}, oracle "
            f"{live[idx]:.17g})")


def _g(x: float | None) -> str:
    return "none (no torch path)" if x is None else f"{x:.17g}"


def torch_err_mismatch(case: Case, stored: float | None, live: float | None,
                       exact: bool) -> str | None:
    """How the stored torch_err (the floor of the case's atol) differs from torch's
    error recomputed on the same inputs, beyond what this machine allows."""
    if (stored is None) != (live is None):
        return f"the stored torch_err is {_g(stored)}, torch's error on its inputs is {_g(live)}"
    if stored is None or live is None:
        return None
    if exact:
        if abs(stored - live) <= TORCH_ERR_REL * abs(live):
            return None
        bound = (f"they must agree within {TORCH_ERR_REL:g} relative on the machine the set "
                 f"was made on")
    else:
        a_stored, a_live = judged_tolerance(case, stored)[0], judged_tolerance(case, live)[0]
        if max(a_stored, a_live) <= TORCH_ERR_FACTOR * min(a_stored, a_live):
            return None
        bound = (f"the atols they give, {a_stored:.3g} and {a_live:.3g}, are more than "
                 f"{TORCH_ERR_FACTOR:g}x apart")
    return (f"the stored torch_err {_g(stored)} is not torch's error on its inputs, "
            f"{_g(live)} ({bound})")


def recompute_problems(ent: dict, man: dict, ref: np.ndarray, torch_err: float | None,
                       exact: bool) -> list[Problem]:
    """The inputs regenerated from the seed against their digest, then the reference
    and torch's error recomputed on them against the stored ones (call under
    one_thread())."""
    from ..backends import torch_error  # deferred: torch takes seconds to import
    from ..inputs import materialise  # deferred: torch
    from ..reference import sdpa_reference  # deferred: torch

    case = Case(**ent["params"])
    data = materialise(case)
    if inputs_digest(data) != ent["inputs_sha256"]:
        return [Problem(ent["file"], "inputs", inputs_mismatch(ent, man))]
    live = sdpa_reference(data.q, data.k, data.v, mask=data.mask_t, is_causal=case.causal,
                          start_pos=case.start_pos, scale=case.scale).numpy()
    probs = []
    why = reference_mismatch(case, ref, live, exact)
    if why:
        probs.append(Problem(ent["file"], "reference", f"case {case.id}: {why}"))
    why = torch_err_mismatch(case, torch_err, torch_error(data, live), exact)
    if why:
        probs.append(Problem(ent["file"], "torch_err", f"case {case.id}: {why}"))
    return probs
