"""The conformance report of `probe check --report FILE.md`: per backend (a runtime, torch,
our kernels) and case family, how many cases passed, failed, crashed, timed out or were
unsupported, with the first failing case's id, its one-line reason and the command that
reproduces it. Written from a check's JSON document, so it can be made again from a
saved `--json`."""

from __future__ import annotations

import collections

from .records import FAILING, STATUSES

TITLE = "# probe check: conformance"  # (outputs.py knows a report of ours by it)
REASON_CHARS = 160


def _cell(counts: collections.Counter) -> str:
    run = sum(counts.get(s, 0) for s in STATUSES) - counts.get("unsupported", 0)
    bad = sum(counts.get(s, 0) for s in FAILING)
    if run == 0:
        return "unsupported"
    return f"{run - bad}/{run}" + (" **✗**" if bad else "")


def _families(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["family"] for r in records))


def _one_line(text: str | None) -> str:
    text = " ".join((text or "").split()).replace("|", "\\|")
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


def tally(records: list[dict]) -> dict[tuple[str, str], collections.Counter]:
    """(backend, family) -> Counter of statuses, and of passes under a convention
    ("convention")."""
    cells: dict = collections.defaultdict(collections.Counter)
    for r in records:
        cells[(r["backend"], r["family"])][r["status"]] += 1
        if r["status"] == "pass" and r.get("convention"):
            cells[(r["backend"], r["family"])]["convention"] += 1
    return cells


def _counts(c: collections.Counter) -> str:
    """The status columns; a pass count says how many passed under a convention."""
    conv = c.get("convention", 0)
    return " | ".join(str(c.get(s, 0)) + (f" ({conv} by convention)"
                                          if s == "pass" and conv else "")
                      for s in STATUSES)


def markdown(doc: dict) -> str:
    """The report, from a `probe check --json` document."""
    records = doc["records"]
    backends = [b for b in doc["backends"] if any(r["backend"] == b for r in records)]
    versions = doc.get("backend_versions", {})
    env = doc.get("environment", {})
    cells = tally(records)
    families = _families(records)
    tool = doc.get("tool", {})
    lines = [TITLE, "",
             f"{tool.get('name', 'sdpa_probe')} {tool.get('version', '')} · suite "
             f"`{doc.get('suite')}` · seed {doc.get('seed')} · {env.get('cpu', '')} "
             f"({env.get('machine', '')}) · "
             f"python {env.get('python', '')} · numpy {env.get('numpy', '')} · "
             f"{doc.get('seconds', 0):.0f} s", "",
             "Each cell: cases passed / cases the backend ran (unsupported ones aside); ✗: "
             "something failed, crashed or timed out. Every case is judged against a "
             "float64 oracle (bottom-right causal with start_pos, zeros for a row that "
             "sees no key); docs/check.md says how. A pass *by convention* failed the "
             "oracle on tolerance alone and passed against a reference that rounds where "
             "the runtime says it does by design (docs/check.md, \"A runtime's "
             "convention\").", "",
             "## Backends", "",
             "| backend | version | " + " | ".join(STATUSES) + " |",
             "|---|---|" + "---:|" * len(STATUSES)]
    for b in backends:
        total = collections.Counter()
        for f in families:
            total += cells.get((b, f), collections.Counter())
        lines.append(f"| {b} | {_one_line(versions.get(b, ''))} | {_counts(total)} |")
    lines += ["", "## Case family x backend", "",
              "| family | " + " | ".join(backends) + " |",
              "|---|" + "---|" * len(backends)]
    for f in families:
        lines.append(f"| {f} | " + " | ".join(
            _cell(cells[(b, f)]) if (b, f) in cells else "" for b in backends) + " |")
    for b in backends:
        lines += ["", *_backend_section(b, versions.get(b), records, families, cells)]
    return "\n".join(lines) + "\n"


def _backend_section(backend: str, version: str | None, records: list[dict],
                     families: list[str], cells) -> list[str]:
    """A backend's families: counts, the first failing case and why; then why the
    unsupported ones were."""
    mine = [r for r in records if r["backend"] == backend]
    out = [f"## {backend}" + (f" ({version})" if version else ""), "",
           "| family | " + " | ".join(STATUSES) + " | first failure |",
           "|---|" + "---:|" * len(STATUSES) + "---|"]
    for f in families:
        c = cells.get((backend, f))
        if not c:
            continue
        first = next((r for r in mine if r["family"] == f and r["status"] in FAILING), None)
        what = (f"`{first['case']}` ({first['status']}): {_one_line(first['reason'])}"
                if first else "")
        out.append(f"| {f} | {_counts(c)} | {what} |")
    failing = [r for r in mine if r["status"] in FAILING]
    if failing:
        out += ["", f"Reproduce the first failure: `{failing[0]['repro']}`"]
    why = collections.Counter(_one_line(r["reason"]) for r in mine
                              if r["status"] == "unsupported")
    if why:
        out += ["", "Unsupported, and why:", ""]
        out += [f"- {n} case(s): {reason}" for reason, n in why.most_common()]
    return out
