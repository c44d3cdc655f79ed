"""`probe check`: every SDPA path against the float64 oracle, case by case. The
options become a CheckRequest for check.run; the records are shown by check_render."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import native, sandbox
from ..errors import ProbeError
from ..golden import default_dir, store
from ..id_filter import compile_filter
from ..limits import check_seed
from ..outputs import write_text
from ..targets.spec import TARGET_HELP
from . import command
from .formats import (
    FORMAT,
    OUTPUT,
    JsonPathCommand,
    check_format,
    deliver,
    json_option,
    stdout_is_data,
)
from .output import Output, check_writable, path_option
from .pass_env import PASS_ENV

if TYPE_CHECKING:
    from ..backends import BackendSpec
    from ..check.run import CheckRequest, CheckResult
    from ..records import Record

STRESS_ROUNDS = 20  # --stress-rounds' default (fuzz.stress.DEFAULT_ROUNDS: not imported
#                     here, its package imports torch)
MAX_TIMEOUT = 86400
MAX_JOBS = 1024  # worker processes: past any machine's cores
MAX_FAIL = 1 << 30  # --maxfail: past any suite's size


# why long: its options are its signature (typer)
@command("check", cls=JsonPathCommand)
def check_command(
    backend: list[str] = typer.Option(None, "--backend", "-b", metavar="NAME",
                                      help="Backend(s) from `probe backends`, or all (every "
                                           "one that can run here). Repeat or comma-separate."),
    kernel: Path = typer.Option(None, "--kernel",
                                help="Your kernel: a .c, .cpp or .so implementing sdpa_forward "
                                     "(native/include/sdpa_probe.h)."),
    target: list[str] = typer.Option(None, "--target", help=TARGET_HELP),
    k: list[str] = typer.Option(None, "-k", metavar="EXPRESSION",
                                help="Only cases whose id matches, as pytest's -k: words "
                                     "matched in the id, with and, or, not and parentheses "
                                     "(-k 'decode and not f16'; several -k: any of them)."),
    skip: list[str] = typer.Option(None, "--skip", metavar="TEXT",
                                   help="Leave out cases whose id contains this (repeatable; "
                                        "e.g. -c2 for a kernel not meant to be called from "
                                        "two threads at once)."),
    dtype: list[str] = typer.Option(None, "--dtype", metavar="DTYPES",
                                    help="Only these storage dtypes: f32,f16,bf16,i8."),
    suite_name: str = typer.Option("default", "--suite",
                                   help="smoke | default | full | random (64 cases drawn from "
                                        "the whole parameter space, a new slice per --seed) | "
                                        "cache-sizing"),
    seed: int = typer.Option(0, "--seed", help="Offset added to every case's seed."),
    json_path: str = json_option("the records as JSON"),
    fmt: str = FORMAT, output: str = OUTPUT,
    junit: str = typer.Option(None, "--junit", help="Write JUnit XML here."),
    report: str = typer.Option(None, "--report",
                               help="Write the conformance report here, in Markdown: per "
                                    "backend and case family, the counts and the first "
                                    "failure ('-': stdout)."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, max=MAX_JOBS,
                             help="Worker processes (at most the usable cores, unless "
                                  "--force-jobs)."),
    force_jobs: bool = typer.Option(False, "--force-jobs",
                                    help="Run -j workers even when there are fewer usable "
                                         "cores."),
    pass_env: list[str] = PASS_ENV,
    timeout: float = typer.Option(60.0, "--timeout", min=0.1,
                                  help="Seconds per (backend, case) before it is a timeout."),
    repro: str = typer.Option(None, "--repro", help="Rerun one case id and show where it fails."),
    after: list[str] = typer.Option(None, "--after", metavar="CASE_ID",
                                    help="With --repro: run these case ids first, in the same "
                                         "process (a failure that depends on an earlier call; "
                                         "check's records name the case)."),
    save: str = typer.Option(None, "--save",
                             help="Write each failing case (with --repro: the case) into this "
                                  "directory for a standalone C driver: raw inputs, reference, "
                                  "driver.c and a Makefile (make: builds it against your "
                                  "kernel with ASan and UBSan and runs it). Refused if the "
                                  "directory is not empty."),
    force: bool = typer.Option(False, "--force",
                               help="With --save: write into a directory that is not empty; "
                                    "with --output: replace any file."),
    golden: bool = typer.Option(False, "--golden",
                                help="Check against the stored golden references (probe golden) "
                                     "instead of recomputing the oracle."),
    golden_dir: str = typer.Option(None, "--golden-dir",
                                    help="The golden directory (implies --golden; default: "
                                         "$SDPA_PROBE_GOLDEN or the checkout's golden/)."),
    last_failed: bool = typer.Option(False, "--last-failed", "--lf",
                                     help="Only the cases that failed, crashed or timed out "
                                          "in the last run for these backends (all, if none "
                                          "of them is selected)."),
    isolate: bool = typer.Option(False, "--isolate",
                                 help="Each case in a fresh worker process: no verdict can "
                                      "depend on a case run before it (a process start a "
                                      "case: slower)."),
    no_leak_check: bool = typer.Option(False, "--no-leak-check",
                                       help="Do not repeat passing calls (the leak count and "
                                            "the repeated call's verdict), for a kernel too "
                                            "slow to call 7 more times."),
    each_failure: bool = typer.Option(False, "--each-failure",
                                      help="List every failure in full (default: one per "
                                           "kind, a backend's same reason but for its "
                                           "figures, with the other cases' ids)."),
    case_arg: list[str] = typer.Option(None, "--case",
                                       help="Check this case instead of a suite: an id, or a "
                                            "spec (key=value,..., as probe fuzz prints). "
                                            "Repeatable."),
    corpus: str = typer.Option(None, "--corpus", help="Check the cases kept in this corpus "
                                                      "directory (probe fuzz --corpus)."),
    coverage: bool = typer.Option(False, "--coverage",
                                  help="Print which factor-value pairs the selected cases "
                                       "meet and which never do, and exit."),
    stress: bool = typer.Option(False, "--stress",
                                help="After the run, each threaded or concurrent case again "
                                     "under varied scheduling (--stress-rounds times)."),
    stress_rounds: int = typer.Option(STRESS_ROUNDS, "--stress-rounds", min=1, max=100000,
                                      help="Rounds per case with --stress."),
    exitfirst: bool = typer.Option(False, "--exitfirst", "-x",
                                   help="Stop at the first failure (--maxfail 1)."),
    maxfail: int = typer.Option(0, "--maxfail", min=0, max=MAX_FAIL, metavar="N",
                                help="Start no case after N failures, crashes or timeouts "
                                     "(0: run them all)."),
    list_cases: bool = typer.Option(False, "--list",
                                    help="List the cases the filters select (ids, tolerances, "
                                         "FLOPs, bytes; --json - for their parameters) and "
                                         "exit."),
) -> None:
    """Check SDPA kernels against a float64 torch oracle on a matrix of edge cases.

    Exit code 0: every case passed (unsupported allowed); 1: a case failed, crashed or
    timed out; 2: usage error."""
    # deferred, each: the check imports torch (seconds); probe --help imports none
    from .. import conformance  # (deferred)
    from ..check.run import (  # (deferred)
        EXTRA_SUITES,
        RANDOM_SUITE,
        CheckRequest,
        last_failed_filter,
        parse_dtypes,
        select_cases,
    )
    from ..report import exit_code, write_junit  # (deferred)
    from ..targets.select import on_targets  # (deferred)
    from .check_render import cases_markdown, show_result  # (deferred)
    from .check_render import list_cases as show_cases  # (deferred)
    from .repro import run_repro  # (deferred)

    check_format(fmt, output, json_path, force=force, inputs=[kernel], other_stdout=(
        "report" if report == "-" else None,))
    out = Output(report == "-" or stdout_is_data(fmt, output, json_path), fmt, output, force)
    sandbox.pass_env(pass_env)
    save, golden_dir = path_option(save, "--save"), path_option(golden_dir, "--golden-dir")
    _check_options(save, repro, after, seed, timeout, k, force)
    check_writable(json_path, "--json", inputs=[kernel])
    check_writable(junit, "--junit", inputs=[kernel], stdout_ok=False)
    check_writable(report, "--report", inputs=[kernel])
    golden = golden or golden_dir is not None
    if golden and suite_name == RANDOM_SUITE:
        raise ProbeError("--golden: the random suite has no golden data (its references are "
                         "computed live)")
    if golden and repro is not None:
        raise ProbeError("--repro recomputes the reference live; drop --golden")
    if golden and suite_name in EXTRA_SUITES:
        raise ProbeError(f"the {suite_name} suite has no golden references; drop --golden")
    if golden:  # (its manifest read now: a directory that holds no set is a usage error)
        store(golden_dir if golden_dir is not None else default_dir())
    specs = on_targets(_backend_specs(backend, kernel, out), target)
    req = CheckRequest(specs, suite_name, k, skip,
                       parse_dtypes(dtype), seed, jobs, timeout, golden, golden_dir,
                       last_failed, isolate, not no_leak_check,
                       maxfail=1 if exitfirst and not maxfail else maxfail)
    out.warn_if_portable()
    if repro is not None:
        raise typer.Exit(run_repro(out, repro, req.names, save, force, timeout, seed,
                                   req.worker_setup(), after=after or [],
                                   json_path=json_path))  # (--format: run_repro's)
    # (deferred, as run_check: the fuzz package's cases import torch)
    from .check_given import given_cases, show_coverage, spec_repros, stress_after

    given = given_cases(case_arg, path_option(corpus, "--corpus"), req)
    cases, notes, keep_ids = (select_cases(req) if given is None else given), [], None
    if req.last_failed:
        cases, keep_ids = last_failed_filter(req, cases, notes)
    if coverage:
        show_coverage(out, cases, json_path)
        return
    if list_cases:
        if suite_name in EXTRA_SUITES:
            raise ProbeError(f"--list: the {suite_name} suite is not a case list; "
                             "probe sizing --help shows its policies")
        rows = show_cases(out, cases, json_path)
        deliver(out, fmt, output, "check", {"cases": rows}, rows, lambda: cases_markdown(rows))
        return
    req.jobs, job_notes = sandbox.plan_jobs(req.jobs, force_jobs)
    for note in job_notes:
        out.note(note)
    res = _run_with_progress(out, req, cases, keep_ids, notes)
    spec_repros(res, given)
    if stress:
        stress_after(out, req, res, stress_rounds)
    for note in res.notes:
        out.note(note)
    if json_path:
        out.write_json(json_path, res.document)
    if junit:
        write_junit(junit, res.records, res.seconds)
    if report:
        write_text(report, conformance.markdown(res.document))
    if not out.json_mode:
        show_result(out, res, req.names, each_failure)
    deliver(out, fmt, output, "check", res.document, lambda: res.document["records"],
            lambda: conformance.markdown(res.document))
    if save is not None:
        _save_failures(out, save, res.records, cases, kernel)
    raise typer.Exit(exit_code(res.records))


def _save_failures(out: Output, save: Path, records, cases, kernel: Path | None) -> None:
    from ..backends import parse  # deferred: torch (seconds)
    from ..saved_case import save_failures  # deferred: torch (seconds)

    mine = parse(str(kernel)).name if kernel is not None else None
    dirs, left = save_failures(save, records, cases, str(kernel) if kernel else None, mine)
    if not dirs:
        out.note(f"--save {save}: no failing case to save")
    for d in dirs:  # (never folded: the command is for copying)
        out.err.print(f"saved {d.name}: make -C {d}" + ("" if kernel else " KERNEL=your_kernel.c"),
                      markup=False, highlight=False, soft_wrap=True)
    if left:
        out.note(f"--save: {left} more failing cases not saved (--repro CASE_ID --save DIR "
                 "saves one)")


def _check_options(save, repro, after, seed: int, timeout: float, k, force: bool) -> None:
    if after and repro is None:
        raise ProbeError("--after needs --repro CASE_ID")
    if save is not None:
        from ..saved_case import check_save_dir  # deferred: its package imports torch

        check_save_dir(save, force)
    check_seed(seed)
    if k and not all(x.strip() for x in k):  # (an empty one would select every case)
        raise ProbeError("-k is empty: give part of a case id (probe check --list)")
    compile_filter(k)  # (a malformed expression: a usage error before any work)
    if not timeout <= MAX_TIMEOUT:  # (inf too: the worker pool waits in poll(), in ms)
        raise ProbeError(f"--timeout must be at most {MAX_TIMEOUT} s (a day), got {timeout:g}")


def _backend_specs(backend: list[str] | None, kernel: Path | None,
                   out: Output) -> list[BackendSpec]:
    """The backends asked for (every native kernel and torch if none), a kernel file
    built first (its build errors surface here, once); one that cannot run here is
    skipped with a warning."""
    from ..backends import default_specs, parse, parse_list  # deferred: torch (seconds)

    specs: list[BackendSpec] = []
    if kernel is not None:
        native.load_user_kernel(kernel)
        specs.append(parse(str(kernel)))
    if backend:
        listed = parse_list(backend)
        specs += listed
        if not listed:
            raise ProbeError("--backend is empty: give a backend (probe backends lists "
                             "them) or all")
    elif kernel is None:
        specs = default_specs()
    kept = []
    for spec in dict.fromkeys(specs):
        why = spec.why_unavailable() if spec.kind == "registered" else None
        if why:
            out.warn(f"{why}; skipping {spec.name}")
        else:
            kept.append(spec)
    return kept


def _run_with_progress(out: Output, req: CheckRequest, cases, keep_ids, notes) -> CheckResult:
    from ..check.run import run_check  # deferred: torch (seconds); probe --help imports none
    from .check_render import STATUS_STYLE  # deferred, as run_check

    with Progress(TextColumn("[bold]probe check[/]"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[last]}"), TimeElapsedColumn(),
                  console=out.err, transient=True) as prog:
        task = prog.add_task("check", total=len(cases) * len(req.specs), last="")

        def on_record(rec: Record) -> None:
            style = STATUS_STYLE[rec["status"]]
            prog.update(task, advance=1,
                        last=f"[{style}]{rec['status']}[/] {rec['backend']} {rec['case']}")

        def on_golden_case(case_id: str) -> None:
            prog.update(task, last=f"[dim]verifying golden data[/] {case_id}")

        return run_check(req, cases, on_record, keep_ids, notes, on_golden_case)
