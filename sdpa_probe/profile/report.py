"""Output of `probe profile`: Rich tables, CSV rows, a Chrome trace."""

from __future__ import annotations

import csv
import io
import json
import math

from rich.text import Text

from .. import tables
from ..outputs import write_json, write_text
from ..tables import Col, Sheet
from . import chart
from .measure import Run
from .provenance import build_line, flags_text, machine_line

BAR_WIDTH = 24
_BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(share: float, width: int = BAR_WIDTH) -> str:
    if not math.isfinite(share) or share <= 0:
        return ""
    cells = min(share, 1.0) * width
    full = int(cells)
    frac = int((cells - full) * 8)
    return "█" * full + (_BLOCKS[frac] if frac and full < width else "")


def _f(x, fmt: str = ".3f", none: str = "-") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return format(x, fmt)


def _rate(x) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _title(doc: dict, sm: dict) -> str:
    m = doc["model"]
    kern = doc["kernels"].get(sm["attention"])
    base = sm["attention"].partition("@")[0]
    att = sm["attention"] + (f" ({kern})" if kern and kern != base else "")
    text = (f"decode step: {m['name']} ({m['layers']} layers, hidden {m['hidden']}, "
            f"{m['heads']}/{m['kv_heads']} heads x {m['head_dim']}, ffn {m['ffn']}, vocab "
            f"{m['vocab']}) | weights {doc['weights']} | cache {doc['cache']} | attention {att} "
            f"| context {sm['context']} | {doc['threads']} thread(s) | {sm['steps']} steps")
    for line in (machine_line(doc), build_line(doc, sm["attention"])):
        if line:
            text += "\n" + line
    return text


def _delta(now, before) -> Text:
    if before is None:
        return Text("new", style="yellow")
    if now is None or not (math.isfinite(now) and math.isfinite(before)):
        return Text("-")
    d = now - before
    pct = f" {100 * d / before:+.0f}%" if before > 1e-9 else ""
    style = "green" if d < 0 else ("red" if d > 0 else None)
    return Text(f"{d:+.3f}{pct}", style=style)


# the per-op table's drop order at a narrow width (tables.fit; the bar leaves first):
# op, median ms, the change against an earlier run and share are never dropped
_OP_DROP = {"alloc KiB/step": 1, "IQR ms": 2, "GFLOP/s": 3, "kind": 4, "allocs/step": 5,
            "calls": 6, "% roof": 7, "GB/s": 8}


def _op_cols(roof: bool, prev_name: str | None) -> list[Col]:
    cols = [Col("op", "id", style="bold"), Col("kind", "id", drop=_OP_DROP["kind"]),
            Col("calls", drop=_OP_DROP["calls"]), Col("median ms")]
    if prev_name is not None:
        cols.append(Col(f"Δ ms vs {prev_name}"))
    cols += [Col("IQR ms", drop=_OP_DROP["IQR ms"]), Col("share"),
             Col("", "bar", style="cyan", least=8), Col("GB/s", drop=_OP_DROP["GB/s"]),
             Col("GFLOP/s", drop=_OP_DROP["GFLOP/s"])]
    if roof:
        cols.append(Col("% roof", drop=_OP_DROP["% roof"]))
    return cols + [Col("allocs/step", drop=_OP_DROP["allocs/step"]),
                   Col("alloc KiB/step", drop=_OP_DROP["alloc KiB/step"])]


def op_table(doc: dict, sm: dict, prev: dict | None = None, prev_name: str = "prev") -> Sheet:
    """The per-op table of one (graph, context) summary; with prev (an earlier summary)
    a column of the change in median ms against it (ops matched by name)."""
    roof = doc.get("roofline")
    t = Sheet(_op_cols(bool(roof), prev_name if prev is not None else None),
              title=_title(doc, sm))
    if prev is not None:
        prev_ops = {o["name"]: o["median_ms"] for o in prev["ops"]}
        prev_kinds = {k["kind"]: k["median_ms"] for k in prev["kinds"]}

    def row(name, kind, calls, med, iq, share, gbs=None, gfs=None, rp=None, al=None, ab=None,
            style=None, was=None):
        cells = [name, kind, calls, _f(med)]
        if prev is not None:
            cells.append(_delta(med, was) if was != "" else Text(""))
        cells += [_f(iq), _f(share * 100, ".1f") + "%"
                  if share is not None and math.isfinite(share) else "-",
                  bar(share if share is not None else float("nan")),
                  _rate(gbs), _rate(gfs)]
        if roof:
            cells.append(_f(rp, ".0f"))
        cells += [_f(al, ".0f", ""), _f(ab / 1024 if ab is not None else None, ".1f", "")]
        t.add_row(*cells, style=style)

    def was(table: str, key: str):
        if prev is None:
            return ""
        return (prev_ops if table == "op" else prev_kinds).get(key)

    for o in sm["ops"]:
        row(o["name"], o["kind"], str(o["calls"]), o["median_ms"], o["iqr_ms"], o["share"],
            o["gb_s"], o["gflop_s"], o["roofline_pct"], o["allocs_per_step"],
            o["alloc_bytes_per_step"], was=was("op", o["name"]))
    t.add_section()
    for k in sm["kinds"]:
        row(rf"\[kind] {k['kind']}", f"{len(k['ops'])} op(s)", "", k["median_ms"], k["iqr_ms"],
            k["share"], style="dim", was=was("kind", k["kind"]))
    t.add_section()
    step = sm["step_ms"]["median"]
    p = prev or {}
    row("sum of ops", "", "", sm["op_sum_ms"], None, sm["op_sum_share"],
        was=p.get("op_sum_ms", ""))
    row("unattributed", "step - ops", "", sm["unattributed_ms"], None,
        sm["unattributed_share"], was=p.get("unattributed_ms", ""))
    row("step", "measured", "", step, sm["step_ms"]["iqr"], 1.0,
        al=sm["allocs_per_step"], ab=sm["alloc_bytes_per_step"], style="bold",
        was=p["step_ms"]["median"] if prev else "")
    return t


def summary_lines(sm: dict) -> list[str]:
    step = sm["step_ms"]["median"]
    lines = [f"{sm['attention']} @ context {sm['context']}: step {step:.3f} ms "
             f"(IQR {sm['step_ms']['iqr']:.3f}), {sm['tokens_per_s']:.2f} tokens/s; "
             f"ops sum to {100 * sm['op_sum_share']:.2f}% of the step, unattributed "
             f"{sm['unattributed_ms']:.3f} ms"]
    ov = (f"timing overhead {sm['overhead_ms'] * 1e3:.1f} us/step ({sm['overhead_pct']:.3f}% of "
          f"the step; {sm['n_ops_per_step']} records x {sm['record_cost_ns']:.0f} ns), at most "
          f"{sm['overhead_upper_ms'] * 1e3:.0f} us ({sm['overhead_upper_pct']:.3f}%) counting "
          "all unattributed time")
    if sm.get("untimed_step_ms") is not None:
        ov += (f"; cross-check: {sm['untimed_steps']} untimed steps, median "
               f"{sm['untimed_step_ms']:.3f} ms")
    lines.append(ov)
    return lines


def growth_table(doc: dict, label: str) -> Sheet:
    rows = doc["growth"][label]
    ctxs = list(rows[0]["ms_by_context"].keys())
    t = Sheet([Col("op", "id", style="bold"), Col("kind", "id", drop=1)]
              + [Col(f"ctx {c}") for c in ctxs] + [Col("ms / 1k tokens")],
              title=f"{label}: median ms per op by context, and growth per 1000 tokens")
    for r in rows:
        cells = [r["name"], r["kind"]] + [_f(r["ms_by_context"].get(c)) for c in ctxs]
        cells.append(_f(r["per_1000_tokens_ms"], "+.3f"))
        t.add_row(*cells, style="bold" if r["name"] == "step" else None)
    return t


def ab_table(doc: dict) -> Sheet:
    ab = doc["ab"]
    items = ab.get("by_context", [ab])
    t = Sheet([Col("context"), Col(f"{ab['a']} ms"), Col(f"{ab['b']} ms"), Col("ratio"),
               Col("95% CI"), Col("verdict (b vs a)", "id")],
              title=f"A/B (interleaved): a = {ab['a']}, b = {ab['b']}; ratio = median(a) / "
                    "median(b), 95% bootstrap CI")
    for x in items:
        style = "green" if x["verdict"] == "faster" else ("red" if x["verdict"] == "slower"
                                                          else None)
        t.add_row(str(x["context"]), _f(x["a_ms"]), _f(x["b_ms"]), _f(x["ratio"], ".3f"),
                  f"[{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]", x["verdict"], style=style)
    return t


def rate_table(doc: dict) -> Sheet:
    t = Sheet([Col("test", "id"), Col("attention", "id"), Col("start"), Col("tokens"),
               Col("ms/token"), Col("tokens/s")],
              title="token rates (token-at-a-time steps, greedy; pp = prompt from position 0, "
                    "tg = generation after the context)")
    for kind in ("pp", "tg"):
        for r in doc.get(kind, []):
            t.add_row(f"{kind}{r['tokens']}", r["attention"], str(r["start"]), str(r["tokens"]),
                      _f(r["ms_per_token"]), _f(r["tokens_per_s"], ".2f"))
    return t


def render(doc: dict, out, chart_by: str = "op", chart_top: int = 6) -> None:
    ctx = doc["context"]
    for sm in doc["runs"]:
        if sm["context"] != ctx:
            continue
        out.table(op_table(doc, sm))
        for line in summary_lines(sm):
            out.print(line)
        out.print("")
    if "growth" in doc:
        for label in doc["growth"]:
            out.table(growth_table(doc, label))
            out.print("")
        width = max(24, min(out.width - 14, 90))
        out.print(chart.text_chart(doc, chart_by, chart_top, width=width))
    if "ab" in doc:
        out.table(ab_table(doc))
        out.print(f"verdict at context {doc['ab']['context']}: {doc['ab']['summary']} "
                  f"(ratio {doc['ab']['ratio']:.3f}, 95% CI [{doc['ab']['ci'][0]:.3f}, "
                  f"{doc['ab']['ci'][1]:.3f}])")
        out.print("")
    if doc.get("pp") or doc.get("tg"):
        out.table(rate_table(doc))
    for chk in doc["checks"]:
        out.note(f"check @ context {chk['context']}: {chk['a']} vs {chk['b']} logits "
                 f"max|diff| {chk['max_abs_diff']:.3g}, /rms {chk['rel_err']:.3g} "
                 f"(tol {chk['tol']}) {'ok' if chk['ok'] else 'FAILED'}")
    worst = max(sm["overhead_upper_pct"] for sm in doc["runs"])
    if worst >= 2.0:
        out.warn(f"timing overhead is {worst:.1f}% of a step: the shape is too small for "
                 "per-op timing to be trusted")
    bad = [sm for sm in doc["runs"] if abs(sm["unattributed_share"]) > 0.05]
    for sm in bad:
        out.warn(f"{sm['attention']} @ {sm['context']}: unattributed time is "
                 f"{100 * sm['unattributed_share']:.1f}% of the step")


# ---- files ------------------------------------------------------------------------

CSV_FIELDS = ["attention", "kernel", "context", "op", "kind", "calls", "median_ms", "iqr_ms",
              "mean_ms", "share", "bytes", "flops", "gb_s", "gflop_s", "roofline_pct",
              "allocs_per_step", "alloc_bytes_per_step", "step_median_ms", "step_iqr_ms"]
# the machine and build of every row (repeated: a CSV has no header block)
CSV_META = ["threads", "cpu", "build", "module", "cc", "cflags", "kernel_module",
            "kernel_sha256"]


def csv_meta(doc: dict, attention: str) -> dict:
    m = doc.get("machine", {})
    b = doc.get("builds", {}).get(doc.get("attention_builds", {}).get(attention), {})
    u = doc.get("user_kernels", {}).get(doc["kernels"].get(attention) or "", {})
    return {"threads": doc["threads"], "cpu": m.get("cpu", ""), "build": b.get("label", ""),
            "module": b.get("module", ""), "cc": b.get("cc_version", ""),
            "cflags": " ".join(b.get("flags", [])), "kernel_module": u.get("module", ""),
            "kernel_sha256": u.get("sha256", "")}


def csv_rows(doc: dict) -> list[dict]:
    """A row per (graph, context, op) and each one's unattributed time, with the
    machine and build: --csv's rows, --format jsonl's too."""
    out = []
    for sm in doc["runs"]:
        meta = csv_meta(doc, sm["attention"])
        rows = [dict(o, op=o["name"]) for o in sm["ops"]]
        rows.append({"op": "(unattributed)", "kind": "", "calls": 0,
                     "median_ms": sm["unattributed_ms"], "share": sm["unattributed_share"]})
        for r in rows:
            out.append({
                "attention": sm["attention"], "kernel": sm["kernel"] or "",
                "context": sm["context"],
                **{k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS[3:-2]},
                "step_median_ms": sm["step_ms"]["median"], "step_iqr_ms": sm["step_ms"]["iqr"],
                **meta,
            })
    return out


def csv_text(doc: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS + CSV_META, lineterminator="\n")
    w.writeheader()
    for row in csv_rows(doc):
        w.writerow(row)
    return buf.getvalue()


def markdown(doc: dict) -> str:
    """--format md: the tables render() shows, as Markdown."""
    sheets = [op_table(doc, sm) for sm in doc["runs"] if sm["context"] == doc["context"]]
    sheets += [growth_table(doc, label) for label in doc.get("growth", {})]
    if "ab" in doc:
        sheets.append(ab_table(doc))
    if doc.get("pp") or doc.get("tg"):
        sheets.append(rate_table(doc))
    return "# probe profile\n\n" + "\n".join(tables.markdown(s) for s in sheets)


def trace_meta(doc: dict) -> dict:
    """Flat string metadata for the trace's otherData (shown by chrome://tracing)."""
    m = doc.get("machine", {})
    meta = {"model": doc["model"]["name"], "weights": doc["weights"], "cache": doc["cache"],
            "threads": str(doc["threads"]), "cpu": m.get("cpu", ""),
            "simd": " ".join(m.get("simd", [])), "logical_cores": str(m.get("logical_cores")),
            "os": m.get("os", ""), "sdpa_probe": m.get("sdpa_probe", ""),
            "abi_version": str(m.get("abi_version", ""))}
    for label, b in doc.get("builds", {}).items():
        meta[f"build[{label}]"] = (f"{b['module']}: {b['cc_version']}, "
                                   f"{' '.join(b['flags'])}")
    for name, u in doc.get("user_kernels", {}).items():
        meta[f"kernel[{name}]"] = (f"{u['module']}: {u['path']} sha256:{u['sha256']}, "
                                   f"{' '.join(u['flags'])}")
    for att, label in doc.get("attention_builds", {}).items():
        meta[f"attention[{att}]"] = f"build {label}, kernel {doc['kernels'].get(att) or '-'}"
    return meta


def trace_doc(runs: list[Run], max_steps: int | None = None, doc: dict | None = None) -> dict:
    """Chrome trace (chrome://tracing, Perfetto): one process per (graph, context),
    a complete event per step and per op, timestamps in microseconds; with doc, the
    machine and builds as otherData and a label per process."""
    starts = [r.records()[:, :, 0].min() for r in runs if r.rec]
    t0 = int(min(starts)) if starts else 0
    events = []
    for pid, r in enumerate(runs):
        rec = r.records()
        if max_steps is not None:
            rec = rec[:max_steps]
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": f"{r.attention.title} @ context {r.context}"}})
        if doc is not None:
            b = doc.get("builds", {}).get(r.attention.build_label, {})
            events.append({"name": "process_labels", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"labels": f"{b.get('module', '?')} "
                                              f"{flags_text(b.get('flags', []))}"}})
        for si in range(rec.shape[0]):
            s_start = int(rec[si, 0, 0])
            s_end = int((rec[si, :, 0] + rec[si, :, 1]).max())
            events.append({"name": f"step {si}", "cat": "step", "ph": "X", "pid": pid,
                           "tid": 0, "ts": (s_start - t0) / 1e3, "dur": (s_end - s_start) / 1e3,
                           "args": {"wall_ms": r.wall_ns[si] / 1e6}})
            for oi, op in enumerate(r.ops):
                ev = {"name": op.name, "cat": op.kind, "ph": "X", "pid": pid, "tid": 0,
                      "ts": (int(rec[si, oi, 0]) - t0) / 1e3, "dur": int(rec[si, oi, 1]) / 1e3,
                      "args": {"layer": op.layer, "allocs": int(rec[si, oi, 2])}}
                events.append(ev)
    out = {"traceEvents": events, "displayTimeUnit": "ms"}
    if doc is not None:
        out["otherData"] = trace_meta(doc)
    return out


def write_trace(path: str, runs: list[Run], doc: dict | None = None) -> None:
    write_text(path, json.dumps(trace_doc(runs, doc=doc), separators=(",", ":")) + "\n")


def write_files(doc: dict, runs: list[Run], *, json_path: str | None = None,
                csv_path: str | None = None, trace_path: str | None = None,
                chart_path: str | None = None, chart_by: str = "op",
                chart_top: int = chart.DEFAULT_TOP) -> None:
    """The report files asked for, each to its path ('-': stdout)."""
    if json_path:
        write_json(json_path, doc)
    if csv_path:
        write_text(csv_path, csv_text(doc))
    if trace_path:
        write_trace(trace_path, runs, doc)
    if chart_path:
        svg = chart.svg_chart(doc, chart_by, chart_top, chart.header_lines(doc))
        write_text(chart_path, svg)
