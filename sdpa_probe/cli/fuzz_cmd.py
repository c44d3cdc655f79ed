"""`probe fuzz`: cases drawn from the whole parameter space by hypothesis, judged as
`probe check` judges them, a failing one shrunk to the smallest that fails the same
way, printed with its one-line repro and kept in a corpus (docs/fuzz.md)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .. import native
from ..errors import ProbeError
from ..limits import check_seed
from . import command
from .output import Output, check_writable, path_option

if TYPE_CHECKING:
    from ..backends import BackendSpec
    from ..fuzz.runner import Finding, FuzzResult
    from ..fuzz.stress import StressJob

SCHEMA = "sdpa_probe.fuzz/1"
STRESS_ROUNDS = 20  # --stress-rounds' default (fuzz.stress.DEFAULT_ROUNDS: not imported
#                     here, its package imports torch)
MAX_SECONDS = 7 * 86400


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '1h' -> seconds; ProbeError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text or "")
    if not m:
        raise ProbeError(f"--time {text!r}: a duration like 60s, 5m or 1h")
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not 0 < seconds <= MAX_SECONDS:
        raise ProbeError(f"--time {text!r}: more than 0 and at most a week")
    return seconds


def repro_line(backend: str, spec: str) -> str:
    from ..backends.registry import is_kernel_file  # (deferred: backends import torch)

    where = f"--kernel {backend}" if is_kernel_file(backend) else f"--backend {backend}"
    return f"probe check {where} --case '{spec}'"


# why long: its options are its signature (typer)
@command("fuzz")
def fuzz_command(
    kernel: Path = typer.Option(None, "--kernel", help="Your kernel: a .c, .cpp or .so "
                                                        "implementing sdpa_forward."),
    backend: list[str] = typer.Option(None, "--backend", "-b",
                                      help="Backend(s) from `probe backends` (repeat or "
                                           "comma-separate)."),
    time_budget: str = typer.Option("60s", "--time", help="Budget for drawing cases: 60s, "
                                                          "5m, 1h (shrinking a failure "
                                                          "goes on past it)."),
    max_examples: int = typer.Option(None, "--max-examples", min=1, max=10**9,
                                     help="At most this many cases (with --time: whichever "
                                          "comes first)."),
    seed: int = typer.Option(0, "--seed", help="The same seed draws the same cases."),
    corpus_dir: str = typer.Option("probe-corpus", "--corpus",
                                   help="Keep each shrunk failing case here, one JSON file "
                                        "each (probe check --corpus DIR replays them)."),
    no_corpus: bool = typer.Option(False, "--no-corpus", help="Keep no corpus file."),
    no_relations: bool = typer.Option(False, "--no-relations",
                                      help="Oracle verdicts only, no metamorphic relations."),
    stress: bool = typer.Option(False, "--stress",
                                help="Run each threaded or concurrent case again under "
                                     "varied scheduling (--stress-rounds times)."),
    stress_rounds: int = typer.Option(STRESS_ROUNDS, "--stress-rounds", min=1, max=100000,
                                      help="Rounds per case with --stress."),
    no_leak_check: bool = typer.Option(False, "--no-leak-check",
                                       help="Do not repeat passing calls (the leak count and "
                                            "the repeated call's verdict): faster, fewer "
                                            "checks."),
    timeout: float = typer.Option(30.0, "--timeout", min=0.1, max=86400,
                                  help="Seconds per (backend, case) before it is a timeout."),
    json_path: str = typer.Option(None, "--json", help="Write the JSON document here "
                                                       "('-': stdout)."),
) -> None:
    """Fuzz kernels with cases drawn from the whole parameter space; shrink what fails.

    Exit code 0: nothing failed; 1: a failing case was found (shrunk, printed, kept in
    the corpus); 2: usage error."""
    # deferred, each: drawing and judging cases imports torch (seconds); --help none
    from ..check.run import CheckRequest  # (deferred)
    from ..fuzz.live_pool import LivePool  # (deferred)
    from ..fuzz.runner import Fuzzer, confirm  # (deferred)
    from ..fuzz.stress import StressJob, stress_preload  # (deferred)

    out = Output(json_mode=json_path == "-")
    check_seed(seed)
    seconds = parse_duration(time_budget)
    check_writable(json_path, "--json", inputs=[kernel])
    corpus = None if no_corpus else path_option(corpus_dir, "--corpus")
    if corpus is not None and corpus.exists() and not corpus.is_dir():
        raise ProbeError(f"--corpus {corpus} is not a directory")
    specs = _specs(kernel, backend)
    names = [s.name for s in specs]
    setup = CheckRequest(specs, leak_check=not no_leak_check).worker_setup()
    with LivePool(timeout, setup, stress_preload() if stress else None) as pool:
        job = StressJob(pool, names, stress_rounds if stress else 0)
        fuzzer = Fuzzer(job, seconds, max_examples, seed, not no_relations,
                        on_example=_progress(out, seconds))
        res = fuzzer.run()
        confirm(res.findings, job, corpus)
    doc = _document(res, names, seed, job)
    if json_path:
        out.write_json(json_path, doc)
    if not out.json_mode:
        _show(out, res, names, seed, doc)
    raise typer.Exit(1 if res.findings else 0)


def _specs(kernel: Path | None, backend: list[str] | None) -> list[BackendSpec]:
    from ..backends import parse, parse_list  # (deferred: torch)

    specs: list[BackendSpec] = []
    if kernel is not None:
        native.load_user_kernel(kernel)  # (its build errors here, once, as check's)
        specs.append(parse(str(kernel)))
    specs += parse_list(backend or [])
    if not specs:
        raise ProbeError("give a kernel to fuzz: --kernel FILE or --backend NAME")
    for s in specs:
        why = s.why_unavailable() if s.kind == "registered" else None
        if why:
            raise ProbeError(f"{s.name}: {why}")
    return list(dict.fromkeys(specs))


def _progress(out: Output, seconds: float):
    """A line on stderr every 2 s (and at the first failure): cases run, time, failing
    cases seen (a shrink runs many), the last case."""
    from ..records import FAILING  # (deferred: records import the backends, torch)

    last, failing = [0.0], [0]
    t0 = time.monotonic()

    def on_example(n: int, case, records) -> None:
        now = time.monotonic()
        bad = [r for r in records if r.status in FAILING]
        failing[0] += bool(bad)
        if now - last[0] >= 2.0 or (bad and failing[0] == 1):
            last[0] = now
            what = f"{failing[0]} failing (shrinking); " if failing[0] else ""
            said = f"{bad[0].status} " if bad else ""
            out.note(f"fuzz: {n} cases, {now - t0:.0f} of {seconds:.0f} s; {what}"
                     f"{said}{case.id}")

    return on_example


def _finding_doc(f: Finding, runs: int) -> dict:
    from ..cases.spec import spec_of  # (deferred: the case model imports numpy)

    spec = spec_of(f.case)
    return {"kind": f.kind, "backend": f.backend, "status": f.status, "reason": f.reason,
            "case": f.case.id, "spec": spec, "params": f.case.params(),
            "repro": repro_line(f.backend, spec), "after_examples": f.after_examples,
            "confirmed": f"{f.confirmed} of {runs}", "corpus_file": f.corpus_file}


def _document(res: FuzzResult, names: list[str], seed: int, job: StressJob) -> dict:
    from ..fuzz.coverage import coverage  # (deferred, as the run)
    from ..fuzz.runner import CONFIRM_RUNS  # (deferred, as the run)

    return {"schema": SCHEMA, "backends": names, "seed": seed, "examples": res.examples,
            "seconds": round(res.seconds, 3), "stopped": res.stopped,
            "findings": [_finding_doc(f, CONFIRM_RUNS) for f in res.findings],
            "stress": job.summary(), "coverage": coverage(res.cases)}


def _show(out: Output, res: FuzzResult, names: list[str], seed: int, doc: dict) -> None:
    from ..fuzz.coverage import render  # (deferred, as the run)

    what = ", ".join(names)
    head = f"probe fuzz: {res.examples} cases in {res.seconds:.1f} s on {what} (seed {seed})"
    if not res.findings:
        out.print(f"{head}: nothing failed")
    else:
        out.print(f"{head}: {len(res.findings)} kind(s) of failure, each shrunk")
    for f, d in zip(res.findings, doc["findings"], strict=True):
        out.print(f"\n[bold red]{f.kind}[/] on {f.backend} (failed again in {d['confirmed']} "
                  "reruns of the shrunk case)")
        params = " ".join(f"{k}={v}" for k, v in f.case.params().items() if k != "family")
        for label, value in (("case", f.case.id), ("spec", d["spec"]), ("params", params),
                             ("reason", f.reason), ("repro", d["repro"]),
                             ("corpus", f.corpus_file or "(not kept: --no-corpus)")):
            out.print(f"  {label:7s}{value}", markup=False)
    if doc["stress"]["rounds"]:
        s = doc["stress"]
        out.print(f"\nstress: {s['rounds']} rounds over {s['cases']} threaded or concurrent "
                  f"cases; {s['differed']} differed from the first round")
    out.print("\ncoverage of the cases drawn:")
    for line in render(doc["coverage"]):
        out.print("  " + line, markup=False)
