"""Metamorphic relations: a case's call judged against the oracle as any case is, then
against the kernel's own answer to a transformed call whose right answer follows from
the first. Each relation names what it checks; a kernel that breaks one fails with
`property NAME: ...`.

permute-keys  keys (K, V rows and mask columns) in another order: the same output
masked-key    one more key, hidden by the mask: the same output
batch-split   each sequence of the batch in a call of its own: the same rows
v-scale       V times 2: the output times 2 (exactly: a power of two)
one-key       row 0's mask -inf but at key 0: row 0 is key 0's V (exactly)
rewritten     a second call on the same buffers rewritten with new values: a fresh
              call's answer on those values
concurrent    two callers at once with different inputs: each its own fresh call's answer

Where the two answers sum in another order (a permutation, another batch or key
count) they agree within the case's tolerance; where they are the same arithmetic on
one thread, to the bit."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from ..backends import Unsupported, describe_failure
from ..cases import Case, judged_tolerance
from ..errors import KernelError
from ..inputs import input_buffers, materialise, out_buffer
from ..inputs.from_values import from_values
from ..oracle import Prepared
from ..records import Record
from .calls import OTHER_INPUTS_SEED_STEP, _attempt, run_one

RELATION_ROUNDS = 4  # rounds of two simultaneous callers (concurrent)


def applies(relation: str, case: Case) -> str | None:
    """Why the relation cannot be checked on this case, or None."""
    if case.mask == "nan-inputs":
        return "NaN inputs: their rows' answers are NaN either way"
    if case.relation and case.relation != relation:
        return "one relation a case"
    if case.invalid or case.reuse or case.callers > 1 or case.stack_kib:
        return "a plain call only"
    if case.batch == 0 or case.q_len == 0:
        return "no work"
    if relation in ("permute-keys", "masked-key") and case.causal:
        return "causal: a key's position is part of the call"
    if relation == "permute-keys" and case.kv_len < 2:
        return "fewer than two keys"
    if relation == "batch-split" and (case.batch < 2 or case.layout == "far"):
        return "batch of at least 2 (not the far layout)"
    if relation == "v-scale" and case.v_magnitude != 1.0:
        return "V at another magnitude (subnormal outputs do not double exactly)"
    if relation == "one-key" and case.kv_len < 1:
        return "no key"
    return None


def run_case(backend, case: Case, prep: Prepared, keep_output: bool = False) -> Record:
    """run_one, and for a case with a relation the relation's check after a pass."""
    if not case.relation:
        return run_one(backend, case, prep, keep_output)
    why = applies(case.relation, case)
    if why is not None:
        raise ValueError(f"relation {case.relation} on {case.id}: {why}")
    rec = _attempt(backend, case, prep, keep_output)
    if rec.status != "pass":
        return rec
    try:
        problem = CHECKS[case.relation](backend, case, prep)
    except Unsupported as exc:
        rec.update(status="unsupported", reason=f"property {case.relation}: {exc}")
        return rec
    except KernelError as exc:
        problem = f"the transformed call failed: {describe_failure(exc)}"
    if problem:
        rec.update(status="fail", reason=f"property {case.relation}: {problem}")
        rec.retry_on_fresh_inputs = False  # (the oracle's verdict on these inputs passed)
    return rec


def _call(backend, data) -> np.ndarray:
    out = out_buffer(data.case)
    backend.run(data, out)
    return out.values().astype(np.float64)


def _values(data) -> tuple:
    mask = None if data.mask is None else np.array(data.mask, dtype=np.float32)
    return data.q.numpy(), data.k.numpy(), data.v.numpy(), mask


def _differs(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> str:
    """'' where a and b agree (NaN where the other is NaN), else where they differ."""
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        idx = tuple(int(x) for x in np.argwhere(nan_a != nan_b)[0])
        return f"NaN in one answer only, first at (b, q, h, d) {idx}"
    err = np.where(nan_a, 0.0, np.abs(a - b))
    bound = atol + rtol * np.abs(np.where(nan_b, 0.0, b))
    if not (err > bound).any():
        return ""
    idx = tuple(int(x) for x in np.unravel_index(int(np.argmax(err - bound)), err.shape))
    return (f"{int((err > bound).sum())} elements differ, worst at (b, q, h, d) {idx}: "
            f"{a[idx]:.9g} vs {b[idx]:.9g} (allowed {atol:.2g} + {rtol:.2g}*|x|)")


def _tol(case: Case, prep: Prepared, exact: bool) -> tuple[float, float]:
    if exact:
        return 0.0, 0.0
    atol, rtol = judged_tolerance(case, prep.torch_err)
    return 2 * atol, 2 * rtol  # (both answers within the tolerance of the oracle's)


def _permute_keys(backend, case: Case, prep: Prepared) -> str:
    q, k, v, mask = _values(prep.data)
    perm = np.random.default_rng(case.seed + 1).permutation(case.kv_len)
    mask = None if mask is None else mask[:, perm]
    moved = from_values(case, q, k[:, perm], v[:, perm], mask)
    return _differs(_call(backend, moved), _call(backend, prep.data), *_tol(case, prep, False))


def _masked_key(backend, case: Case, prep: Prepared) -> str:
    q, k, v, mask = _values(prep.data)
    rng = np.random.default_rng(case.seed + 2)
    big = dataclasses.replace(case, kv_len=case.kv_len + 1)
    extra = rng.standard_normal((case.batch, 1) + k.shape[2:]) * 100.0  # (a large score)
    if mask is None:
        mask = np.zeros((case.q_len, case.kv_len), np.float32)
    mask = np.concatenate([mask, np.full((case.q_len, 1), -np.inf, np.float32)], axis=1)
    data = from_values(big, q, np.concatenate([k, extra], 1), np.concatenate([v, extra], 1),
                       mask)
    return _differs(_call(backend, data), _call(backend, prep.data), *_tol(case, prep, False))


def _batch_split(backend, case: Case, prep: Prepared) -> str:
    q, k, v, mask = _values(prep.data)
    one = dataclasses.replace(case, batch=1)
    rows = [_call(backend, from_values(one, q[b:b + 1], k[b:b + 1], v[b:b + 1], mask))
            for b in range(case.batch)]
    return _differs(np.concatenate(rows), _call(backend, prep.data), *_tol(case, prep, False))


def _v_scale(backend, case: Case, prep: Prepared) -> str:
    q, k, v, mask = _values(prep.data)
    doubled = _call(backend, from_values(case, q, k, 2.0 * v, mask))
    return _differs(doubled, 2.0 * _call(backend, prep.data), 0.0, 0.0)


def _one_key(backend, case: Case, prep: Prepared) -> str:
    q, k, v, mask = _values(prep.data)
    if mask is None:
        mask = np.zeros((case.q_len, case.kv_len), np.float32)
    mask[0] = -np.inf
    mask[0, 0] = 0.0  # (key 0: seen by row 0 under any causal offset)
    got = _call(backend, from_values(case, q, k, v, mask))[:, 0]
    heads = np.arange(case.n_heads) // case.group
    want = prep.data.v.numpy()[:, 0][:, heads]  # [B, H, D]
    return _differs(got[:, None], want[:, None], 0.0, 2.0 ** -20)


def _fresh(backend, case: Case, seed: int) -> tuple:
    data = materialise(dataclasses.replace(case, seed=seed))
    return data, _call(backend, data)


def _rewritten(backend, case: Case, prep: Prepared) -> str:
    _call(backend, prep.data)
    new = materialise(dataclasses.replace(case, seed=case.seed + OTHER_INPUTS_SEED_STEP))
    bufs, new_bufs = input_buffers(prep.data), input_buffers(new)
    saved = {name: a.copy() for name, a in bufs.items()}
    try:  # (the rewritten call first: a fresh call in between could evict what it kept)
        for name, a in bufs.items():
            np.copyto(a, new_bufs[name])
        got = _call(backend, dataclasses.replace(prep.data, q=new.q, k=new.k, v=new.v))
    finally:  # (the next backend in this worker reads the case's own values)
        for name, a in bufs.items():
            np.copyto(a, saved[name])
    return _differs(got, _call(backend, new), *_tol(case, prep, case.n_threads == 1))


def _concurrent(backend, case: Case, prep: Prepared) -> str:
    fresh = [(prep.data, _call(backend, prep.data)),
             _fresh(backend, case, case.seed + OTHER_INPUTS_SEED_STEP)]
    barrier = threading.Barrier(2)
    found: list[str] = ["", ""]

    def caller(c: int) -> None:
        data, want = fresh[c]
        try:
            for r in range(RELATION_ROUNDS):
                barrier.wait(timeout=30)
                said = _differs(_call(backend, data), want,
                                *_tol(case, prep, case.n_threads == 1))
                if said:
                    found[c] = f"caller {c + 1}, round {r + 1}: {said}"
                    break
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:  # (a kernel error in one caller: its words, as a finding)
            found[c] = f"caller {c + 1}: {type(exc).__name__}: {exc}"
        finally:
            barrier.abort()

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return "; ".join(f for f in found if f)


CHECKS = {"permute-keys": _permute_keys, "masked-key": _masked_key,
          "batch-split": _batch_split, "v-scale": _v_scale, "one-key": _one_key,
          "rewritten": _rewritten, "concurrent": _concurrent}
