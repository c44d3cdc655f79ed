#!/usr/bin/env python3
"""The mutation study of docs/check.md: put one-line bugs into an example kernel,
run each mutant through `probe check --kernel`, and count the cases that catch it.

    python docs/examples/mutants.py                    # every mutant, default suite
    python docs/examples/mutants.py --only alpha-no-log2e,merge-no-rescale
    python docs/examples/mutants.py --suite full --json mutants.json
    python docs/examples/mutants.py --block 512 --splits 1   # the same bugs, another tiling

A mutant no case catches is a hole in the case matrix, or a change within the
tolerance (docs/check.md says which). Prints a Markdown table; exit 0.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ONLINE = HERE / "online_sdpa.c"

RESCALE = "for (int64_t d = 0; d < D; d++) st->acc[d] *= alpha;"
ALPHA = "const float alpha = exp2f((st->m - mn) * LOG2E); /* 0 while the state is empty */"
CAUSAL = "if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;"
V_ELEM = "st->acc[d] += w * elem(&a->v, b, j, hk, d);"
SCORE = "float s = 0.0f;"
ELEM_OFF = ("const int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + "
            "d * t->stride[3];\n  if (t->dtype == SDPA_F32) return")
WEIGHT = "const float w = exp2f((p[j - j0] - mn) * LOG2E);"
Q_ELEM = "q[d] = elem(&a->q, b, i, h, d) * scale;"
K_DOT = "for (int64_t d = 0; d < D; d++) s += q[d] * elem(&a->k, b, j, hk, d);"
V_SCALE = "a->v.scale[b * a->v.qstride[0] + {j} * a->v.qstride[1] + hk * a->v.qstride[2]]"

# name -> (what the bug is, [(old, new), ...]) for online_sdpa.c; every `old` occurs once
MUTANTS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "no-acc-rescale": ("the accumulator not rescaled when a block raises the max",
                       [(RESCALE, "")]),
    "no-sum-rescale": ("the running sum not rescaled", [("st->l *= alpha;", "")]),
    "rescale-after-add": ("the sum rescaled after the block's terms are added",
                          [("st->l *= alpha;", ""),
                           ("st->m = mn;\n  }", "st->l *= alpha;\n    st->m = mn;\n  }")]),
    "alpha-inverted": ("rescale factor exp2(m_new - m_old) instead of exp2(m_old - m_new)",
                       [(ALPHA, "const float alpha = st->m == -INFINITY ? 0.0f"
                                " : exp2f((mn - st->m) * LOG2E);")]),
    "alpha-no-log2e": ("rescale factor exp2(m_old - m_new) without log2(e): the wrong base",
                       [(ALPHA, "const float alpha = exp2f(st->m - mn);")]),
    "exp-no-log2e": ("block weights exp2(s - m) without log2(e), the rescale right",
                     [(WEIGHT,
                       "const float w = exp2f(p[j - j0] - mn);")]),
    "max-not-kept": ("the running max never updated", [("st->m = mn;\n  }", "}")]),
    "max-starts-at-zero": ("the running max initialised to 0, not -inf",
                           [("st->m = -INFINITY;", "st->m = 0.0f;")]),
    "no-empty-block-skip": ("a block with every key masked not skipped (-inf - -inf)",
                            [("if (bm == -INFINITY) continue;", "")]),
    "tail-block-dropped": ("the range's last partial block dropped (unless it is the only one)",
                           [("for (int64_t j0 = lo; j0 < hi; j0 += BLOCK) {",
                             "for (int64_t j0 = lo; j0 < hi && (j0 + BLOCK <= hi || j0 == lo);"
                             " j0 += BLOCK) {")]),
    "merge-no-rescale": ("partial states merged without bringing them to a common max",
                         [("const float w = exp2f((part[s].m - M) * LOG2E);",
                           "const float w = part[s].m == -INFINITY ? 0.0f : 1.0f;")]),
    "merge-sum-unweighted": ("partial sums merged without their max's weight",
                             [("L += part[s].l * w;", "L += part[s].l;")]),
    "merge-no-empty-guard": ("no guard for a row no split saw a key of (0 / 0)",
                             [("if (M != -INFINITY) {", "{")]),
    "split-drops-key": ("the first split's range one key short (boundary off by one)",
                        [("hi = lo + chunk < n ? lo + chunk : n;",
                          "hi = lo + chunk < n ? lo + chunk - (s == 0 && chunk > 1) : n;")]),
    "causal-block-granular": ("the causal edge applied per block: the block that straddles it "
                              "read whole",
                              [(CAUSAL, "if (a->is_causal && a->start_pos + i + 1 < n) {"
                                        " n = (a->start_pos + i + BLOCK) / BLOCK * BLOCK;"
                                        " if (n > kv) n = kv; }")]),
    "causal-decode-only": ("start_pos honoured only for q_len 1 (chunked prefill misaligned)",
                           [(CAUSAL, "if (a->is_causal && (a->q_len == 1 ? a->start_pos : 0)"
                                     " + i + 1 < n) n = (a->q_len == 1 ? a->start_pos : 0)"
                                     " + i + 1;")]),
    "mask-block-local": ("the mask indexed by the key's offset in its block",
                         [("a->mask[i * a->mask_row_stride + j]",
                           "a->mask[i * a->mask_row_stride + (j - j0)]")]),
    "v-quant-params-of-k": ("int8 V dequantised with K's scales and zero points",
                            [(V_ELEM, "{ sdpa_tensor v_ = a->v; v_.scale = a->k.scale;"
                                      " v_.zero_point = a->k.zero_point;"
                                      " st->acc[d] += w * elem(&v_, b, j, hk, d); }")]),
    "q-prescaled-in-f16": ("q * scale rounded to F16 / BF16 storage (half-precision pre-scale)",
                           [(Q_ELEM,
                             "q[d] = a->q.dtype == SDPA_F16 || a->q.dtype == SDPA_BF16"
                             " ? (float)(_Float16)(elem(&a->q, b, i, h, d) * scale)"
                             " : elem(&a->q, b, i, h, d) * scale;")]),
    "acc-in-f16": ("the P.V accumulator kept in F16 for F16 / BF16 inputs",
                   [(V_ELEM, "st->acc[d] = a->v.dtype == SDPA_F32 || a->v.dtype == SDPA_I8"
                             " ? st->acc[d] + w * elem(&a->v, b, j, hk, d)"
                             " : (float)(_Float16)(st->acc[d] + w * elem(&a->v, b, j, hk, d));")]),
    "gqa-interleaved": ("query head h read kv head h % n_kv_heads (interleaved grouping)",
                        [("const int64_t hk = h / group;",
                          "const int64_t hk = h % a->n_kv_heads; (void)group;")]),
    "scale-sqrt-of-kv-dim": ("the default scale from the kv heads, not head_dim",
                             [("1.0f / sqrtf((float)D)", "1.0f / sqrtf((float)(D * group))")]),
    # decode (q_len 1) fast paths that forget what only other shapes had exercised
    "decode-causal-ignored": ("a query row alone reads the whole cache (the causal edge "
                              "ignored in decode)",
                              [(CAUSAL, "if (a->q_len > 1 && a->is_causal && a->start_pos + i"
                                        " + 1 < n) n = a->start_pos + i + 1;")]),
    "decode-batch0-kv": ("decode reads batch 0's K and V for every sequence",
                         [("visit_range(a, b, i, hk, q, lo, hi, &part[s], p);",
                           "visit_range(a, a->q_len == 1 ? 0 : b, i, hk, q, lo, hi,"
                           " &part[s], p);")]),
    "decode-batch0-only": ("decode computes the first sequence of a batch alone",
                           [("for (int64_t b = 0; b < a->batch; b++)",
                             "for (int64_t b = 0; b < (a->q_len == 1 ? 1 : a->batch); b++)")]),
    "sym-scales-no-batch-stride": ("symmetric int8's scales read without their batch stride",
                                   [("* t->scale[qo];", "* t->scale[t->zero_point ? qo"
                                                         " : qo - b * t->qstride[0]];")]),
    "strides-as-uint32": ("element offsets from strides kept as unsigned 32-bit values",
                          [(ELEM_OFF, ELEM_OFF.replace("t->stride[", "(int64_t)(uint32_t)"
                                                       "t->stride["))]),
    # precision: the weights or the dequantised cache rounded on their way to the products
    "p-in-f16": ("P rounded to F16 for the P.V products (the sum in F32)",
                 [(V_ELEM, "st->acc[d] += (float)(_Float16)w * elem(&a->v, b, j, hk, d);")]),
    "p-in-bf16": ("P rounded to BF16 for the P.V products (one vdpbf16ps piece)",
                  [(V_ELEM, "{ float w_ = w; uint32_t u_; memcpy(&u_, &w_, 4);"
                            " u_ = (u_ + 0x7fffu + ((u_ >> 16) & 1u)) & 0xffff0000u;"
                            " memcpy(&w_, &u_, 4);"
                            " st->acc[d] += w_ * elem(&a->v, b, j, hk, d); }")]),
    "k-dequant-f16": ("int8 K dequantised into F16 before Q.K",
                      [(K_DOT, K_DOT.replace("q[d] * elem(&a->k, b, j, hk, d)",
                                             "q[d] * (a->k.dtype == SDPA_I8 ? (float)(_Float16)"
                                             "elem(&a->k, b, j, hk, d)"
                                             " : elem(&a->k, b, j, hk, d))"))]),
    "v-dequant-f16": ("int8 V dequantised into F16 before P.V",
                      [(V_ELEM, "st->acc[d] += w * (a->v.dtype == SDPA_I8 ? (float)(_Float16)"
                                "elem(&a->v, b, j, hk, d) : elem(&a->v, b, j, hk, d));")]),
    "pv-fixed-point": ("int8: P x v_scale rounded to 24-bit fixed point below the block's "
                       "largest V scale (the integer P.V tried and not kept)",
                       [(WEIGHT, WEIGHT + " float wq_ = w; if (a->v.dtype == SDPA_I8) {"
                                 " float smx_ = 0.0f; for (int64_t t_ = j0; t_ < j1; t_++) {"
                                 " const float x_ = " + V_SCALE.format(j="t_") + ";"
                                 " if (x_ > smx_) smx_ = x_; } const float sj_ = "
                                 + V_SCALE.format(j="j") + "; int e_; frexpf(smx_, &e_);"
                                 " wq_ = ldexpf(rintf(ldexpf(w * sj_, 24 - e_)), e_ - 24)"
                                 " / sj_; }"),
                        (V_ELEM, V_ELEM.replace("w * elem", "wq_ * elem"))]),
    # reads whose values are thrown away: no output shows them, the fenced layouts fault
    "k-tail-vector-read": ("each K row read as whole 16-float vectors (past head_dim)",
                           [(SCORE, SCORE + " { volatile float x_ = elem(&a->k, b, j, hk,"
                                            " (D + 15) / 16 * 16 - 1); (void)x_; }")]),
    "v-tail-vector-read": ("each V row read as whole 16-float vectors (past head_dim)",
                           [(WEIGHT, WEIGHT + " { volatile float x_ = elem(&a->v, b, j, hk,"
                                              " (D + 15) / 16 * 16 - 1); (void)x_; }")]),
    "k-block-read": ("K read for the whole last block of BLOCK keys (past kv_len)",
                     [(SCORE, SCORE + " if (j == j1 - 1) { volatile float x_ = elem(&a->k, b,"
                                      " j0 + BLOCK - 1, hk, D - 1); (void)x_; }")]),
    "mask-block-read": ("each mask row read in blocks of 16 keys (past kv_len)",
                        [(SCORE, SCORE + " if (a->mask) { volatile float x_ = a->mask["
                                         "i * a->mask_row_stride + j / 16 * 16 + 15];"
                                         " (void)x_; }")]),
    "q-read-before": ("each Q row's element d - 1 read at d = 0 (before the buffer)",
                      [(Q_ELEM, "{ volatile float x_ = elem(&a->q, b, i, h, d - 1); (void)x_; "
                                + Q_ELEM + " }")]),
}


def mutate(src: str, edits: list[tuple[str, str]], name: str) -> str:
    for old, new in edits:
        if src.count(old) != 1:
            raise SystemExit(f"mutant {name}: {old!r} occurs {src.count(old)} times")
        src = src.replace(old, new)
    return src


def retile(src: str, block: int | None, splits: int | None) -> str:
    """The example with another BLOCK / SPLITS: a bug a 32-key block exposes may
    hide behind a 512-key one (a masked prefix must then span a whole block)."""
    for name, value in (("BLOCK", block), ("SPLITS", splits)):
        if value is None:
            continue
        if value < 1:
            raise SystemExit(f"--{name.lower()} must be at least 1, not {value}")
        src, n = re.subn(rf"^#define {name} \d+", f"#define {name} {value}", src, flags=re.M)
        if n != 1:
            raise SystemExit(f"online_sdpa.c: #define {name} occurs {n} times")
    return src


def run_check(kernel: Path, suite: str, jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "check.json"
        probe = [sys.executable, "-c", "from sdpa_probe.cli import main; main()"]
        proc = subprocess.run([*probe, "check", "--kernel", str(kernel), "--suite", suite,
                               "--jobs", str(jobs), "--json", str(out)],
                              capture_output=True, text=True)
        if not out.exists():
            return {"error": (proc.stderr.strip().splitlines() or ["no record"])[-1]}
        doc = json.loads(out.read_text())
    failed = [r for r in doc["records"] if r["status"] not in ("pass", "unsupported")]
    return {"run": len(doc["records"]), "caught": len(failed), "cases": [r["case"] for r in failed],
            "first": failed[0]["case"] + ": " + failed[0]["reason"] if failed else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="default")
    ap.add_argument("--only", default="", help="comma-separated mutant names")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--block", type=int, default=None, help="the example's BLOCK (keys)")
    ap.add_argument("--splits", type=int, default=None, help="the example's SPLITS")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        ap.error(f"unknown mutant(s): {', '.join(unknown)}")
    src = retile(ONLINE.read_text(), args.block, args.splits)
    tiling = {"block": int(re.search(r"#define BLOCK (\d+)", src)[1]),
              "splits": int(re.search(r"#define SPLITS (\d+)", src)[1])}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        unmutated = Path(tmp) / "online_sdpa.c"
        unmutated.write_text(src)
        base = run_check(unmutated, args.suite, args.jobs)
        print(f"unmutated online_sdpa.c (BLOCK {tiling['block']}, SPLITS {tiling['splits']}): "
              f"{base.get('caught')} of {base.get('run')} cases fail", file=sys.stderr)
        for name in names:
            what, edits = MUTANTS[name]
            path = Path(tmp) / f"{name}.c"
            path.write_text(mutate(src, edits, name))
            results[name] = {"bug": what, **run_check(path, args.suite, args.jobs)}
            r = results[name]
            print(f"{name}: {r.get('caught', r.get('error'))}", file=sys.stderr)
    print("| mutant | bug | cases that catch it |\n|---|---|--:|")
    for name, r in results.items():
        caught = r.get("caught", f"build error: {r.get('error')}")
        print(f"| `{name}` | {r['bug']} | {caught} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"suite": args.suite, **tiling, "baseline": base,
                                               "mutants": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
