"""A backend checked on a target (`name@target`): the case's inputs, output buffer and
reference made here as for a host run, its calls sent to the native worker on the
target in one arena (the plain call, an invalid one, concurrent callers, buffers
rewritten in place, a small stack; a passing call's repeats), and every call judged by
the host's verdict code. What the worker cannot observe there is left out, not passed:
threads at work beyond n_threads, child processes and standard descriptors, glibc's
heap guard bytes; and a failure is not retried on fresh inputs (each case runs in a
fresh worker process: no earlier call can have left state)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .. import __version__, invalid_args, native
from ..backends.base import describe_failure
from ..backends.registry import is_kernel_file
from ..cases import Case
from ..check.calls import CONCURRENT_ROUNDS, OTHER_INPUTS_SEED_STEP
from ..children import died_in_call
from ..errors import ProbeError, SdpaInvalid
from ..inputs import OutBuffer, input_buffers, out_buffer
from ..judge.verdict import judge
from ..oracle import Prepared, prepare_case
from ..records import Record, base_record
from . import arena as ar
from .build import WorkerBuild, arch_of, build_worker
from .judging import caller_changes, describe_fp, fill_output, growth, leak_reason
from .remote import Outcome, run_worker, ssh_link
from .spec import parse_target, split_target


class TargetBackend:
    """One backend (our kernel, or a kernel file) built for and run on one target."""

    def __init__(self, name: str, leak_check: bool = True) -> None:
        self.name = name
        self.base, target = split_target(name)
        self.target = parse_target(target)
        self.kernel_path = Path(self.base) if is_kernel_file(self.base) else None
        if self.kernel_path is None and self.base not in native.builtin_kernels():
            raise ProbeError(f"{self.base}: only our kernels and kernel files run on "
                             f"{self.target.name} (a runtime's backend runs on this host)")
        self.leak_check = leak_check
        self._build: WorkerBuild | None = None

    def build(self) -> WorkerBuild:
        """The worker for this target (an ssh device asked its machine first)."""
        if self._build is None:
            machine = ssh_link(self.target).uname() if self.target.kind == "ssh" else ""
            self._build = build_worker(arch_of(self.target, machine), self.kernel_path)
        return self._build

    def version(self) -> str:
        what = f"{self.kernel_path}" if self.kernel_path else f"sdpa_probe {__version__}"
        how = (f"under qemu-aarch64 -cpu {self.target.qemu_cpu()}" if self.target.kind == "qemu"
               else f"on {self.target.name}")
        return f"{what}, built for {self.target.name} ({' '.join(self.build().flags[-1:])}), {how}"

    # ---- one case ----------------------------------------------------------------

    def check_case(self, case: Case, prep: Prepared, timeout: float) -> Record:
        rec = base_record(self.name, case)
        try:
            build = self.build()
        except (ProbeError, ConnectionError) as exc:
            rec.update(status="error", reason=f"cannot run on {self.target.name}: {exc}")
            return rec
        if case.invalid:
            return self._invalid(rec, case, prep, build, timeout)
        if case.callers > 1:
            return self._concurrent(rec, case, prep, build, timeout)
        return self._plain(rec, case, prep, build, timeout)

    def _layout(self, case: Case) -> ar.Layout:
        return ar.Layout(ar.fence_of(case.layout))

    def _call(self, lay: ar.Layout, data, out: OutBuffer, invalid: str = "",
              rewrites=()) -> tuple[bytes, dict[int, str], int]:
        """One call's arena words, the input buffers' names by index, the output's index."""
        ffi = native.native_lib()[0]
        c = data.case
        names = {lay.add(a): name for name, a in input_buffers(data).items()}
        out_i = lay.add(out.arena, is_out=True)
        call = native.prepare(ffi, data.q_store, data.k_store, data.v_store, out.view,
                              mask=data.mask, is_causal=c.causal, start_pos=c.start_pos,
                              scale=c.scale, n_threads=c.n_threads)
        if invalid:
            invalid_args.corrupt(invalid, call.args, ffi)
        w = ar.Writer()
        ar.write_call(w, lay, ffi, call.args, out_i, list(rewrites))
        return w.bytes(), names, out_i

    def _run(self, rec: Record, build: WorkerBuild, arena: bytes,
             timeout: float) -> ar.WorkerResult | None:
        """The worker's result, or None with rec holding how the run ended."""
        # (a little inside the pool's own deadline: the record says where it ran)
        out = run_worker(self.target, build, arena, timeout * 0.9)
        if out.kind == "result":
            try:
                return ar.read_result(out.data)
            except ValueError as exc:
                out = Outcome("fault", said=str(exc))
        rec.update(**_ended(out, self.target.name, timeout))
        return None

    def _status(self, rec: Record, res: ar.CallResult) -> bool:
        """A status other than SDPA_OK as the host's call reports it; True if OK."""
        rec.seconds = res.seconds
        if res.status == 0:
            return True
        if res.status == 1:
            rec.update(status="unsupported", reason="kernel returned SDPA_UNSUPPORTED")
        else:
            rec.update(status="fail", reason=describe_failure(SdpaInvalid("")))
        return False

    def _judge(self, rec: Record, case: Case, prep: Prepared, out: OutBuffer, buf: ar.Buffer,
               res: ar.CallResult, names: dict[int, str], changed: list[str]) -> None:
        if not self._status(rec, res):
            return
        fill_output(out, buf, res)
        v = judge(case, prep.ref, out, prep.torch_err,
                  inputs_written=[(names[b], n) for b, n in res.written if b in names],
                  fp_changed=describe_fp(self.build().arch, res.fp_before, res.fp_after),
                  caller_changed=changed)
        rec.update(**v.as_dict())

    def _invalid(self, rec: Record, case: Case, prep: Prepared, build: WorkerBuild,
                 timeout: float) -> Record:
        """The call with one argument broken: judged on its status and nothing written."""
        lay, out = self._layout(case), out_buffer(case)
        call, names, out_i = self._call(lay, prep.data, out, invalid=case.invalid)
        res = self._run(rec, build, ar.arena_bytes(ar.MODE_SINGLE, self.base, lay, [call]),
                        timeout)
        if res is None:
            return rec
        before = out.arena.copy()
        first = res.calls[0]
        fill_output(out, lay.buffers[out_i], first)
        changed = int((out.arena.view(np.uint8) != before.view(np.uint8)).sum())
        written = [(names[b], n) for b, n in first.written if b in names]
        rec.seconds = first.seconds
        rec.status, rec.reason = invalid_args.judge(case.invalid, first.status, changed, written)
        return rec

    def _plain(self, rec: Record, case: Case, prep: Prepared, build: WorkerBuild,
               timeout: float) -> Record:
        """One call (on a small stack, if the case says), a reuse case's second call on
        its buffers rewritten in place, a passing call's repeats."""
        lay, out = self._layout(case), out_buffer(case)
        call, names, out_i = self._call(lay, prep.data, out)
        calls, new = [call], None
        if case.reuse:
            new = prepare_case(dataclasses.replace(case, seed=case.seed + OTHER_INPUTS_SEED_STEP))
            fresh = input_buffers(new.data)
            rewrites = [(i, fresh[name]) for i, name in names.items()]
            # (the same output buffer: the worker poisons it again before the second call)
            calls.append(self._call(lay, prep.data, out, rewrites=rewrites)[0])
        mode = ar.MODE_REUSE if case.reuse else ar.MODE_SINGLE
        arena = ar.arena_bytes(mode, self.base, lay, calls, stack_kib=case.stack_kib,
                               repeats=self.leak_check and not case.reuse)
        res = self._run(rec, build, arena, timeout)
        if res is None:
            return rec
        self._judge(rec, case, prep, out, lay.buffers[out_i], res.calls[0], names,
                    caller_changes(res.state_before, res.state_after))
        if rec.status != "pass":
            return rec
        if case.reuse and new is not None and len(res.calls) > 1:
            self._judge(rec, case, new, out, lay.buffers[out_i], res.calls[1], names, [])
            if rec.status in ("fail", "error"):
                rec.reason = ("on a second call with its buffers rewritten in place (same "
                              "pointers, new values): " + rec.reason)
        elif res.repeat is not None:
            self._repeat(rec, case, prep, out, lay.buffers[out_i], res)
        return rec

    def _repeat(self, rec: Record, case: Case, prep: Prepared, out: OutBuffer, buf: ar.Buffer,
                res: ar.WorkerResult) -> None:
        """judge/repeat.py's layer on the worker's repeats (threads at work: not here)."""
        first = out.values()
        changed = caller_changes(res.state_after, res.state_after_repeats)
        if changed:
            rec.update(status="fail", reason=(
                f"left its caller changed on a repeat of the same call "
                f"({len(res.repeat_resources) + 2 + 1} made; the first did not): "
                + "; ".join(changed)))
            return
        grew = growth(res.repeat_resources)
        rec.leak_bytes_per_call = grew["heap"]
        leak = leak_reason(grew)
        if leak:
            rec.update(status="fail", reason=leak)
            return
        again = base_record(self.name, case)
        self._judge(again, case, prep, out, buf, res.repeat, {}, [])
        if again.status != "pass":
            rec.update(status="fail", reason="the same call made again, into the same output "
                       "poisoned again, gives another answer: " + again.reason)
            return
        rec.repeatable = bool(np.array_equal(first, out.values(), equal_nan=True))

    def _concurrent(self, rec: Record, case: Case, prep: Prepared, build: WorkerBuild,
                    timeout: float) -> Record:
        """case.callers threads of the worker call at once, CONCURRENT_ROUNDS times, each
        with its own inputs and output (check/calls.py's _run_concurrent, on the target)."""
        lay = self._layout(case)
        preps = [prep] + [prepare_case(dataclasses.replace(
            case, seed=case.seed + OTHER_INPUTS_SEED_STEP * k)) for k in range(1, case.callers)]
        outs = [out_buffer(case) for _ in preps]
        made = [self._call(lay, p.data, o) for p, o in zip(preps, outs, strict=True)]
        arena = ar.arena_bytes(ar.MODE_CONCURRENT, self.base, lay, [m[0] for m in made],
                               callers=case.callers, rounds=CONCURRENT_ROUNDS)
        res = self._run(rec, build, arena, timeout)
        if res is None:
            return rec
        for k, (p, o, (_, names, out_i)) in enumerate(zip(preps, outs, made, strict=True)):
            for r in range(CONCURRENT_ROUNDS):
                one = base_record(self.name, case)
                self._judge(one, case, p, o, lay.buffers[out_i],
                            res.calls[k * CONCURRENT_ROUNDS + r], names, [])
                if one.status != "pass":
                    rec.update(status=one.status, reason=one.reason, seconds=one.seconds)
                    if one.status in ("fail", "error"):
                        rec.reason = (f"with {case.callers} concurrent calls (caller {k + 1}, "
                                      f"round {r + 1} of {CONCURRENT_ROUNDS}): {one.reason}")
                    return rec
                if k == 0:
                    rec.update(**{f: one[f] for f in ("status", "reason", "max_abs_err",
                                                      "max_rel_err", "nmse", "worst", "atol",
                                                      "rtol", "torch_err", "seconds")})
        changed = caller_changes(res.state_before, res.state_after)
        if changed:
            rec.update(status="fail", reason=(f"left its caller changed after {case.callers} "
                                              "concurrent calls: " + "; ".join(changed)))
        return rec


def _ended(out: Outcome, target: str, timeout: float) -> dict:
    """A record's status and reason for a worker that gave no result."""
    said = f"; it printed: {out.said}" if out.said else ""
    if out.kind == "timeout":
        return {"status": "timeout",
                "reason": f"no result within {timeout * 0.9:g} s on {target}",
                "seconds": timeout}
    if out.kind == "died":
        return {"status": "crash",
                "reason": f"worker process died on {target}: {died_in_call(out.code)}{said}"}
    if out.kind == "lost":
        return {"status": "error", "reason": f"lost the connection to {target} during the "
                f"case ({out.said or 'no word from ssh'}); the case was not judged"}
    return {"status": "error", "reason": f"the native worker could not run the case on "
            f"{target}{said}"}
