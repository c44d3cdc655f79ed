"""`probe check`: every SDPA path against the float64 oracle, case by case."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from pathlib import Path

import typer
from rich.console import Group
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .. import last_failed as last_failed_record
from .. import native
from ..backends import executorch_library
from ..cases import DTYPES, SUITES, Case, all_cases, find_case, random_cases, suite, tolerance
from ..errors import ProbeError
from ..harness import WorkerPool, malloc_debug_library
from ..report import FAILING, by_backend_family, check_document, exit_code, summary, write_junit
from . import command
from .output import Output, check_writable

STATUS_STYLE = {"pass": "green", "fail": "red", "crash": "bold red", "timeout": "magenta",
                "unsupported": "dim", "error": "yellow"}
EXTRA_SUITES = ("cache-sizing",)
RANDOM_SUITE = "random"  # cases.random_cases(--seed): a new slice of the space per seed
MAX_TIMEOUT = 86400


def _resolve_backends(backend: list[str] | None, kernel: Path | None, out: Output) -> list[str]:
    names: list[str] = []
    known = list(native.builtin_kernels())
    if kernel is not None:
        native.load_user_kernel(kernel)  # build errors surface here, once
        names.append(f"user:{kernel}")
    if backend:
        for b in backend:
            for name in b.split(","):
                name = name.strip()
                if not name:
                    continue
                if name == "all":
                    names += known + ["torch"]
                elif name == "executorch":
                    if executorch_library() is None:
                        out.warn("executorch is not installed (pip install --no-deps "
                                 "executorch==1.5.1); skipping it")
                        continue
                    names.append(name)
                elif name == "torch" or name in known:
                    names.append(name)
                else:
                    raise ProbeError(f"unknown backend {name!r}; known: "
                                     f"{', '.join(known + ['torch', 'executorch'])}")
    elif kernel is None:
        names = known + ["torch"]
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen


def _wanted(case_id: str, k: list[str] | None, skip: list[str] | None) -> bool:
    """-k: the id contains one of these; --skip: it contains none of those."""
    return (not k or any(s in case_id for s in k)) and not any(s in case_id for s in skip or ())


def _select_cases(suite_name: str, k: list[str] | None, dtype: list[str] | None,
                  seed: int, skip: list[str] | None = None) -> list[Case]:
    if suite_name == RANDOM_SUITE:  # (the seed picks the slice; each case has its own)
        cases = random_cases(seed)
    else:
        cases = suite(suite_name)
        if seed:
            cases = [dataclasses.replace(c, seed=c.seed + seed) for c in cases]
    if dtype:
        wanted = {d.strip() for spec in dtype for d in spec.split(",") if d.strip()}
        if not wanted:
            raise ProbeError(f"--dtype is empty; known: {', '.join(DTYPES)}")
        bad = wanted - set(DTYPES)
        if bad:
            raise ProbeError(f"unknown dtype {sorted(bad)[0]!r}; known: {', '.join(DTYPES)}")
        cases = [c for c in cases if c.dtype in wanted]
    return [c for c in cases if _wanted(c.id, k, skip)]


def _fmt(x, spec=".2e") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def _summary_table(records: list[dict], names: list[str]) -> Table:
    """Case families down, backends across; a cell counts passes over supported cases."""
    t = Table(title="probe check: case family x backend (passed / run; - unsupported)",
              title_justify="left")
    t.add_column("family", style="bold")
    backends = [n for n in names if any(r["backend"] == n for r in records)]
    for b in backends:
        t.add_column(b.replace("user:", ""), justify="center", overflow="fold")
    cells = by_backend_family(records)
    families = sorted({r["family"] for r in records}, key=lambda f: min(
        i for i, r in enumerate(records) if r["family"] == f))
    for fam in families:
        row = []
        for b in backends:
            c = cells.get((b, fam))
            if not c:
                row.append("")
                continue
            run = sum(c.values()) - c.get("unsupported", 0)
            bad = sum(c.get(s, 0) for s in FAILING)
            if run == 0:
                row.append("[dim]-[/]")
            elif bad:
                row.append(f"[red]{run - bad}/{run} ✗[/]")
            else:
                row.append(f"[green]{run}/{run}[/]")
        t.add_row(fam, *row)
    return t


# Below this console width the failures print as a list: in a table their reasons
# wrap into a narrow column a word or two wide (a CI log is 80 columns)
WIDE_FAILURES = 140


# A reason with its figures (errors, positions, counts) masked: failures that read the
# same but for them are one bug seen on many cases
_FIGURES = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:e[-+]?\d+)?")
GROUP_AT = 3     # this many failures of one reason and backend print as one
GROUP_IDS = 8    # the other cases' ids shown under it


def group_failures(records: list[dict], grouped: bool = True) -> list[tuple[dict, list[dict]]]:
    """The failing records as (the first of a kind, the others of that kind), in order:
    a kind is a backend, a status and a reason the same but for its figures; kinds with
    fewer than GROUP_AT members (or every kind, if not grouped) stay one record each."""
    failing = [r for r in records if r["status"] in FAILING]
    if not grouped:
        return [(r, []) for r in failing]
    kinds: dict[tuple, list[dict]] = {}
    for r in failing:
        key = (r["backend"], r["status"], _FIGURES.sub("#", r["reason"] or ""))
        kinds.setdefault(key, []).append(r)
    out: list[tuple[dict, list[dict]]] = []
    for members in kinds.values():
        if len(members) >= GROUP_AT:
            out.append((members[0], members[1:]))
        else:
            out += [(r, []) for r in members]
    order = {id(r): i for i, r in enumerate(failing)}
    return sorted(out, key=lambda g: order[id(g[0])])


def _more(others: list[dict]) -> str:
    ids = [r["case"] for r in others[:GROUP_IDS]]
    rest = len(others) - len(ids)
    return (f"and {len(others)} more failing the same way (figures aside): "
            + ", ".join(ids) + (f", ... ({rest} more; --each-failure or --json lists them)"
                                if rest else ""))


def _failure_list(records: list[dict], width: int = 80, grouped: bool = True) -> Group:
    """Each failure as a status / case / backend line, its reason indented (free to wrap
    at the console's width; an error's figures are in it) and its repro command. A
    backend that does not fit on the case's line (a long path to your kernel) goes on a
    line of its own, indented, rather than wrapping to the margin. grouped: one entry
    per kind of failure (group_failures), the others' ids under it."""
    lines: list = [Text("failures", style="bold")]
    for r, others in group_failures(records, grouped):
        st = r["status"]
        head = Text.assemble((f"{st:<8}", STATUS_STYLE[st]), r["case"])
        backend = Text(r["backend"], style="bold")
        if 8 + len(r["case"]) + 2 + len(r["backend"]) <= width:
            lines.append(Text.assemble(head, "  ", backend))
        else:
            lines += [head, Padding(backend, (0, 0, 0, 8))]
        lines += [Padding(Text(r["reason"]), (0, 0, 0, 8)),
                  Padding(Text(r["repro"], style="dim"), (0, 0, 0, 8))]
        if others:
            lines.append(Padding(Text(_more(others), style="yellow"), (0, 0, 0, 8)))
    return Group(*lines)


def _failure_table(records: list[dict], grouped: bool = True) -> Table:
    t = Table(title="failures", title_justify="left", show_lines=True)
    t.add_column("backend", style="bold")
    t.add_column("case")
    t.add_column("status")
    t.add_column("max abs err", justify="right")
    t.add_column("nmse", justify="right")
    t.add_column("reason / reproduce")
    for r, others in group_failures(records, grouped):
        st = r["status"]
        more = f"\n[yellow]{_more(others)}[/]" if others else ""
        t.add_row(r["backend"], r["case"], f"[{STATUS_STYLE[st]}]{st}[/]",
                  _fmt(r["max_abs_err"]), _fmt(r["nmse"]),
                  f"{r['reason']}\n[dim]{r['repro']}[/]{more}")
    return t


def _list_cases(out: Output, cases: list[Case], json_path: str | None) -> None:
    """The selected cases, one a line: id, tolerance, FLOPs and bytes (--json: all of a
    case's parameters too)."""
    # (an invalid call is judged on its status: no tolerance)
    rows = [dict(id=c.id, family=c.family, atol=atol, rtol=rtol, flops=c.flops,
                 bytes=c.bytes, params=c.params())
            for c, (atol, rtol) in ((c, tolerance(c) if c.needs_reference else (None, None))
                                    for c in cases)]
    if json_path:
        out.write_json(json_path, {"cases": rows})
    if json_path != "-":  # plain lines, never folded: the ids are for copying into -k
        w = max((len(r["id"]) for r in rows), default=2)
        out.print(f"{'id':<{w}}  {'atol':>8}  {'rtol':>6}  {'FLOPs':>13}  {'bytes':>11}",
                  style="bold", soft_wrap=True)
        for r in rows:
            tol = ("       -       -" if r["atol"] is None
                   else f"{r['atol']:>8.2g}  {r['rtol']:>6.2g}")
            out.print(f"{r['id']:<{w}}  {tol}  {r['flops']:>13,}  {r['bytes']:>11,}",
                      soft_wrap=True)
        out.print(f"{len(rows)} cases", soft_wrap=True)


@command("check")
def check_command(
    backend: list[str] = typer.Option(None, "--backend", "-b",
                                      help="Backend(s): a kernel from `probe kernels`, torch, "
                                           "executorch, or all. Repeat or comma-separate."),
    kernel: Path = typer.Option(None, "--kernel",
                                help="Your kernel: a .c, .cpp or .so implementing sdpa_forward "
                                     "(native/include/sdpa_probe.h)."),
    k: list[str] = typer.Option(None, "-k", help="Only cases whose id contains this (repeatable)."),
    skip: list[str] = typer.Option(None, "--skip",
                                   help="Leave out cases whose id contains this (repeatable; "
                                        "e.g. -c2 for a kernel not meant to be called from "
                                        "two threads at once)."),
    dtype: list[str] = typer.Option(None, "--dtype", help="Only these storage dtypes: "
                                                          "f32,f16,bf16,i8."),
    suite_name: str = typer.Option("default", "--suite",
                                   help="smoke | default | full | random (64 cases drawn from "
                                        "the whole parameter space, a new slice per --seed) | "
                                        "cache-sizing"),
    seed: int = typer.Option(0, "--seed", help="Offset added to every case's seed."),
    json_path: str = typer.Option(None, "--json", help="Write the JSON record here ('-': stdout)."),
    junit: str = typer.Option(None, "--junit", help="Write JUnit XML here."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, help="Worker processes."),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1,
                                  help="Seconds per (backend, case) before it is a timeout."),
    repro: str = typer.Option(None, "--repro", help="Rerun one case id and show where it fails."),
    after: list[str] = typer.Option(None, "--after",
                                    help="With --repro: run these case ids first, in the same "
                                         "process (a failure that depends on an earlier call; "
                                         "check's records name the case)."),
    save: Path = typer.Option(None, "--save", help="With --repro: write inputs, reference and "
                                                   "a torch-only script to this directory."),
    force: bool = typer.Option(False, "--force", help="With --save: overwrite existing files."),
    golden: bool = typer.Option(False, "--golden",
                                help="Check against the stored golden references (probe golden) "
                                     "instead of recomputing the oracle."),
    golden_dir: Path = typer.Option(None, "--golden-dir",
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
    list_cases: bool = typer.Option(False, "--list",
                                    help="List the cases the filters select (ids, tolerances, "
                                         "FLOPs, bytes; --json - for their parameters) and "
                                         "exit."),
) -> None:
    """Check SDPA kernels against a float64 torch oracle on a matrix of edge cases.

    Exit code 0: every case passed (unsupported allowed); 1: a case failed, crashed or
    timed out; 2: usage error."""
    out = Output(json_mode=json_path == "-")
    suites = [*SUITES, RANDOM_SUITE, *EXTRA_SUITES]
    if suite_name not in suites:
        raise ProbeError(f"unknown suite {suite_name!r}; known: {', '.join(suites)}")
    if save is not None and repro is None:
        raise ProbeError("--save needs --repro CASE_ID")
    if after and repro is None:
        raise ProbeError("--after needs --repro CASE_ID")
    if save is not None and save.exists() and not save.is_dir():
        raise ProbeError(f"--save {save} is not a directory")
    if seed < 0:
        raise ProbeError(f"--seed must be >= 0, got {seed}")
    if not timeout <= MAX_TIMEOUT:  # (inf too: the worker pool waits in poll(), in ms)
        raise ProbeError(f"--timeout must be at most {MAX_TIMEOUT} s (a day), got {timeout:g}")
    check_writable(json_path, "--json", inputs=[kernel])
    check_writable(junit, "--junit", inputs=[kernel])
    if golden_dir is not None:
        golden = True
    if golden and suite_name == RANDOM_SUITE:
        raise ProbeError("--golden: the random suite has no golden data (its references are "
                         "computed live)")
    if golden and repro is not None:
        raise ProbeError("--repro recomputes the reference live; drop --golden")
    names = _resolve_backends(backend, kernel, out)
    out.warn_if_portable()
    # what each worker process starts with (the repro's too)
    setup = {"build": dict(native._build_opts), "leak_check": not no_leak_check}
    if repro is not None:
        from .repro import run_repro

        raise typer.Exit(run_repro(out, repro, names, save, force, timeout, seed, setup,
                                   after=after or [], json_path=json_path))
    if suite_name in EXTRA_SUITES:
        cases: list[Case] = []
    else:
        cases = _select_cases(suite_name, k, dtype, seed, skip)
    if not cases and suite_name not in EXTRA_SUITES:
        raise ProbeError("no case matches the filters")
    lf_ids = None  # --last-failed: the case ids to keep (cache-sizing records' too)
    lf_sizing: set[str] = set()  # ... of which the cache-sizing records'
    if last_failed:
        known = last_failed_record.failed_for(names)
        fixed = all_cases()
        lf_sizing = {i for i in known if find_case(i, fixed) is None}
        if known & {c.id for c in cases} or (lf_sizing and _runs_cache_sizing(suite_name, dtype,
                                                                              golden)):
            lf_ids = known
            cases = [c for c in cases if c.id in lf_ids]
        else:
            out.note(f"--last-failed: no failure recorded for {', '.join(names)} among the "
                     f"selected cases ({last_failed_record.path()}); checking them all")
    if list_cases:
        if suite_name in EXTRA_SUITES:
            raise ProbeError(f"--list: the {suite_name} suite is not a case list; "
                             "probe sizing --help shows its policies")
        _list_cases(out, cases, json_path)
        return
    if not names:
        raise ProbeError("no backend to check")
    golden_store = None
    if golden:
        from ..golden import default_dir, store

        if suite_name in EXTRA_SUITES:
            raise ProbeError(f"the {suite_name} suite has no golden references; drop --golden")
        golden_store = store(golden_dir if golden_dir is not None else default_dir())
        golden_store.require(cases)  # every case stored and intact, else one line

    records: list[dict] = []
    t0 = time.perf_counter()
    total = len(cases) * len(names)
    with Progress(TextColumn("[bold]probe check[/]"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[last]}"), TimeElapsedColumn(),
                  console=out.err, transient=True) as prog:
        task = prog.add_task("check", total=total, last="")

        def on_record(rec: dict) -> None:
            records.append(rec)
            style = STATUS_STYLE[rec["status"]]
            prog.update(task, advance=1,
                        last=f"[{style}]{rec['status']}[/] {rec['backend']} {rec['case']}")

        if cases:
            if golden_store is not None:
                setup["golden"] = str(golden_store.root.resolve())
            pool = WorkerPool(jobs=jobs, timeout=timeout, setup=setup, fresh_per_job=isolate)
            pool.run([(c, names) for c in cases], on_record)
        if _runs_cache_sizing(suite_name, dtype, golden_store is not None) and (
                lf_ids is None or lf_sizing):
            # -k, --skip (and --last-failed) filter these records by id too
            records += [r for r in _cache_sizing_records(names, out)
                        if _wanted(r["case"], k, skip) and (lf_ids is None or r["case"] in lf_ids)]
    seconds = time.perf_counter() - t0
    try:
        last_failed_record.record(records, {c.id for c in cases} | {
            r["case"] for r in records if r["family"] == "cache-sizing"}, names)
    except OSError as exc:
        out.warn(f"could not keep this run's failures for --last-failed: {exc}")

    order = {c.id: i for i, c in enumerate(cases)}
    records.sort(key=lambda r: (names.index(r["backend"]) if r["backend"] in names else 99,
                                order.get(r["case"], 1 << 30)))
    run = {"isolate": isolate, "leak_check": not no_leak_check,
           "heap_guard": malloc_debug_library() is not None}
    doc = check_document(records, suite=suite_name, seconds=seconds, backends=names, seed=seed,
                         run=run)
    if golden_store is not None:
        m = golden_store.manifest
        doc["reference"] = {"source": "golden", "dir": str(golden_store.root),
                            "versions": m["versions"], "generator": m["generator"]}
    if json_path:
        out.write_json(json_path, doc)
    if junit:
        write_junit(junit, records, seconds)
    if not out.json_mode:
        out.print(_summary_table(records, names))
        if any(r["status"] in FAILING for r in records):
            wide = out.out.width >= WIDE_FAILURES
            out.print(_failure_table(records, not each_failure) if wide
                      else _failure_list(records, out.out.width, not each_failure))
        s = summary(records)
        parts = [f"[{STATUS_STYLE[k_]}]{s[k_]} {k_}[/]" for k_ in STATUS_STYLE if s[k_]]
        extra = sum(r["family"] == "cache-sizing" for r in records)
        what = f"{len(cases)} cases x {len(names)} backends" + (
            f" + {extra} cache-sizing" if extra else "")
        out.print(f"{s['total']} checks ({what}) in {seconds:.1f} s: " + ", ".join(parts))
        for note in unrepeatable_notes(records):
            out.warn(note)
        if golden_store is not None:
            skipped = ("; the cache-sizing suite, which has no golden data, was not run"
                       if suite_name == "default" else "")
            out.print(f"[dim]references: golden data in {golden_store.root} (made with torch "
                      f"{golden_store.manifest['versions'].get('torch')}){skipped}[/]")
    raise typer.Exit(exit_code(records))


def unrepeatable_notes(records: list[dict]) -> list[str]:
    """Per backend, the passing cases whose repeated call gave another answer bit for
    bit (both within tolerance): not a failure, but a result that follows thread
    timing (a reduction or merge order) is one a user cannot reproduce exactly."""
    by: dict[str, list[str]] = {}
    for r in records:
        if r.get("repeatable") is False:
            by.setdefault(r["backend"], []).append(r["case"])
    return [f"{b}: {len(ids)} passing case(s) gave another answer, bit for bit, when the "
            f"same call was repeated (both within tolerance; e.g. {ids[0]}): a result that "
            "follows thread timing, such as a reduction or merge order"
            for b, ids in by.items()]


def _runs_cache_sizing(suite_name: str, dtype, golden: bool) -> bool:
    """The cache-sizing records come with the default suite (unless --dtype or --golden
    narrows it) and make the cache-sizing suite."""
    return suite_name in EXTRA_SUITES or (suite_name == "default" and not golden and not dtype)


def _cache_sizing_records(names: list[str], out: Output) -> list[dict]:
    """The cache-sizing suite (ring / sink KV caches) through one float native kernel:
    flash if it is being checked, else the first float native kernel asked for."""
    try:
        from ..cache_sizing import run_suite
    except ImportError:
        return []
    known = native.builtin_kernels()
    floats = [n for n in names if n in known and "f32" in known[n].info.dtypes]
    if not floats:
        return []
    name = "flash" if "flash" in floats else floats[0]
    records = []
    for r in run_suite(name):
        rec = {"backend": name, "case": r["case"], "family": "cache-sizing",
               "status": r["status"], "reason": r.get("reason", ""),
               "max_abs_err": r.get("max_abs_err"), "max_rel_err": None, "nmse": None,
               "worst": None, "atol": None, "rtol": None, "torch_err": None,
               "seconds": r.get("seconds"),
               "repro": f"probe check --suite cache-sizing --backend {name}"}
        records.append(rec)
    return records

