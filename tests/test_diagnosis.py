"""A failure report says which nearby semantics a wrong output matches: each of the
single-point bugs below, put into the example kernel, is named by its hypothesis on a
case that shows it, and a correct kernel's output matches none of them."""

import numpy as np
import pytest
from kernels_for_tests import BUGS, SRC

from sdpa_probe.backends import NativeBackend, make
from sdpa_probe.cases import judged_tolerance, suite
from sdpa_probe.check.calls import run_one
from sdpa_probe.diagnosis import (
    BY_NAME,
    HYPOTHESES,
    Context,
    DiagnosisBudget,
    attend,
    diagnose,
    diagnose_record,
    matches,
    true_setting,
)
from sdpa_probe.judge import repeat
from sdpa_probe.native import load_user_kernel
from sdpa_probe.oracle import prepare_case
from sdpa_probe.records import diagnosis_lines

CASES = {c.id: c for c in (*suite("default"), *suite("smoke"))}
DECODE = "decode-h8gqa4-q4-kv100-d64-f32-causal96"   # start_pos = kv_len - q_len
CAUSAL = "causal-h4gqa2-q5-kv80-d64-f32-causal40"    # start_pos != kv_len - q_len
MASKED = "mask-h4gqa2-q6-kv140-d64-f32-random"
BATCHED = "prefill-b3-h4gqa2-q20-kv45-d64-f32-causal25"
NAN_CASE = "nan-h6gqa2-q3-kv100-d64-f32-causal97-nan-inputs"
CAUSAL_LINE = "if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;"

# bug -> ((find, replace) in the example kernel, a case that shows it, the hypothesis)
SINGLE_POINT_BUGS = {
    "top-left-causal": (BUGS["ignore-start-pos"], DECODE, "start-pos-zero"),
    "causal-off-by-one": (
        (CAUSAL_LINE, "if (a->is_causal && a->start_pos + i + 2 < n) n = a->start_pos + i + 2;"),
        CAUSAL, "causal-one-late"),
    "mask-ignored": (("if (a->mask) s += a->mask[i * a->mask_row_stride + j];", ""),
                     MASKED, "mask-ignored"),
    "mask-row-stride": (BUGS["mask-stride-is-kv"], MASKED, "mask-row-stride-kv"),
    "gqa-modulo": (BUGS["gqa-modulo"], DECODE, "gqa-modulo"),
    "dropped-tail-block": (BUGS["drop-partial-block"], DECODE, "tail-block-dropped-64"),
    "f16-rounded-q": (("s += load(&a->q, b, i, h, d)",
                       "s += f16_to_f32(f32_to_f16(load(&a->q, b, i, h, d)))"),
                      DECODE, "q-rounded-f16"),
    "scale-1/d": (("1.0f / sqrtf((float)D)", "1.0f / (float)D"), DECODE, "scale-1/d"),
    "first-batch-only": (("for (int64_t b = 0; b < a->batch; b++)",
                          "for (int64_t b = 0; b < 1; b++)"), BATCHED, "first-batch-only"),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """torch on one thread, as in a check worker: the oracles are small, and threads only
    contend on a shared machine."""
    import torch  # (only this fixture sets its threads)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _kernel(tmp_path, name: str, find: str, replace: str) -> NativeBackend:
    assert find in SRC, name
    path = tmp_path / (name.replace("/", "-") + ".c")
    path.write_text(SRC.replace(find, replace))
    return NativeBackend(str(path), load_user_kernel(path))


def _diagnosed(backend, case_id: str):
    case = CASES[case_id]
    prep = prepare_case(case)
    rec = run_one(backend, case, prep, keep_output=True)
    diagnose_record(rec, case, prep)
    return rec


@pytest.mark.parametrize("bug", SINGLE_POINT_BUGS)
def test_a_single_point_bug_is_named_by_its_hypothesis(tmp_path, bug):
    (find, replace), case_id, hypothesis = SINGLE_POINT_BUGS[bug]
    rec = _diagnosed(_kernel(tmp_path, bug, find, replace), case_id)
    assert rec.status == "fail", rec.reason
    claimed = [m["hypothesis"] for m in rec.diagnosis["matches"]]
    assert claimed == [hypothesis], (claimed, rec.reason)
    says = diagnosis_lines(rec.diagnosis)[0]
    assert says.startswith("your output equals the reference computed with"), says
    assert BY_NAME[hypothesis].meaning(CASES[case_id]) in says


def test_the_report_states_the_case_in_words_and_its_diagnosis(tmp_path):
    from rich.console import Console  # (rendered as a terminal shows it)

    from sdpa_probe.cli.check_render import failure_list

    (find, replace), case_id, _ = SINGLE_POINT_BUGS["top-left-causal"]
    rec = _diagnosed(_kernel(tmp_path, "top-left", find, replace), case_id)
    console = Console(width=100, record=True, file=open("/dev/null", "w"))
    console.print(failure_list([rec], 100))
    text = console.export_text()
    assert "causal, bottom-right with start_pos 96" in text
    assert "8 query heads over 2 kv heads" in text and "layout bshd" in text
    assert "diagnosis: your output equals the reference computed with start_pos = 0" in text
    assert "the causal offset is ignored" in text


def test_nan_provenance_names_the_input_and_the_rows_it_should_reach(tmp_path):
    rec = _diagnosed(_kernel(tmp_path, "nan-row-unseen", *BUGS["nan-row-unseen"]), NAN_CASE)
    assert rec.status == "fail", rec.reason
    nan = rec.diagnosis["nan"]
    # Q's NaN (row 0 of the last head) should reach that row alone; the kernel gave zeros
    q_line = next(x for x in nan if x.startswith("Q[b=0 pos=0 head=5 d=3] holds NaN"))
    assert "should reach 1 row: b0 query rows 0 x heads 5; your output is NaN/Inf in 0" in q_line
    assert any(x.startswith("K[b=0 pos=") and "kv head=0" in x for x in nan), nan
    assert any(x.startswith("finite where the reference is NaN/Inf: 1 row") for x in nan), nan


@pytest.mark.parametrize("backend", ["example", "flash"])
def test_a_correct_kernel_matches_no_nearby_semantics(tmp_path, backend, monkeypatch):
    """Every hypothesis that differs from the ABI on a case is told apart from a correct
    output there: a correct kernel failing for another reason is never mis-diagnosed."""
    monkeypatch.setattr(repeat, "LEAK_CHECK", False)  # (the verdict alone is needed here)
    kernel = (_kernel(tmp_path, "example", "", "") if backend == "example" else make(backend))
    for case_id in (DECODE, CAUSAL, MASKED, BATCHED, NAN_CASE, "dtype-h8gqa4-q1-kv65-d64-f16"):
        case = CASES[case_id]
        prep = prepare_case(case)
        rec = run_one(kernel, case, prep, keep_output=True)
        assert rec.status == "pass", (case_id, rec.reason)
        out = rec.output.values()
        atol, rtol = judged_tolerance(case, prep.torch_err)
        ctx = Context(case, true_setting(case, prep.data), prep.data.mask)
        truth = attend(ctx.truth)
        for h in HYPOTHESES:
            if not h.applies(case):
                continue
            pred = h.predict(ctx)
            if np.array_equal(pred, truth, equal_nan=True):
                continue
            assert not matches(out, pred, atol, rtol)[0], (case_id, h.name)


def test_start_pos_not_read_is_named_by_its_nan_alone(tmp_path):
    """A kernel that aligns the causal edge to the cache's end reads the stale slots past
    start_pos + q_len, which hold NaN in every causal case: its output is all NaN, and
    `end-aligned` is named as one semantics its NaN matches, not claimed."""
    src = SRC.replace(CAUSAL_LINE, "if (a->is_causal && kv - a->q_len + i + 1 < n) "
                                   "n = kv - a->q_len + i + 1;")
    rec = _diagnosed(_kernel(tmp_path, "end-aligned", SRC, src), CAUSAL)
    assert rec.diagnosis["matches"] == []
    assert "end-aligned" in [w["hypothesis"] for w in rec.diagnosis["nan_only"]]


def test_an_all_nan_output_is_not_explained_by_a_hypothesis(tmp_path):
    """Causal as an additive -inf over every slot reads the stale (NaN) cache slots in
    every row: all NaN. So would `causal-ignored`, but an output with no finite element
    is no evidence for one semantics over another: the NaN trace says what happened."""
    hide = "if (a->is_causal && j > a->start_pos + i) s += -INFINITY;"
    src = SRC.replace(CAUSAL_LINE, "").replace("s *= scale;", "s *= scale;\n" + hide)
    rec = _diagnosed(_kernel(tmp_path, "additive-causal", SRC, src), CAUSAL)
    assert rec.status == "fail" and "NaN in 20 of 20 output rows" in rec.reason, rec.reason
    assert rec.diagnosis["matches"] == [], rec.diagnosis["matches"]
    weak = [w["hypothesis"] for w in rec.diagnosis["nan_only"]]
    assert "causal-ignored" in weak, rec.diagnosis
    assert "no finite element to tell them apart: " in diagnosis_lines(rec.diagnosis)[0]
    assert any("stale cache slots" in x for x in rec.diagnosis["nan"]), rec.diagnosis["nan"]


# cases on which every hypothesis applies somewhere, without stale slots in every row
EACH = (DECODE, MASKED, BATCHED, "causal-h4gqa2-q4-kv100-d64-f32-pos40",
        "logits-h4gqa2-q3-kv130-d64-f32-scale0.5", "nan-h12gqa4-q1-kv69-d64-f32-nan-inputs",
        "gqa-h8gqa1-q1-kv129-d64-f32", "window-h4gqa2-q4-kv300-d64-f32-causal296-window100",
        CAUSAL)


@pytest.mark.parametrize("name", [h.name for h in HYPOTHESES])
def test_each_hypothesis_names_its_own_output(name):
    """An output made by a hypothesis's own oracle (stored as F32) is claimed for it (or it
    is named the same on that case): each is recognised, none shadowed by another."""
    h = BY_NAME[name]
    for case_id in EACH:
        case = CASES[case_id]
        if not h.applies(case):
            continue
        prep = prepare_case(case)
        ctx = Context(case, true_setting(case, prep.data), prep.data.mask)
        pred = h.predict(ctx)
        if np.array_equal(pred, attend(ctx.truth), equal_nan=True):
            continue
        atol, rtol = judged_tolerance(case, prep.torch_err)
        diag = diagnose(case, prep.data, prep.ref, pred.astype(np.float32).astype(np.float64),
                        atol, rtol)
        named = [[m["hypothesis"], *m["same_as"]] for m in diag["matches"]]
        if case_id == CAUSAL:  # (its stale slots are NaN: read in every row, NaN alone)
            named.append([w["hypothesis"] for w in diag["nan_only"]])
        assert any(name in n for n in named), (case_id, diag["matches"], diag["nan_only"])
        return
    pytest.fail(f"{name} applies to none of the cases here")


def test_the_diagnosis_is_bounded(tmp_path, monkeypatch):
    """A worker's diagnosis time per backend is capped (past it a failure says how to get
    one), and so is the size of a case diagnosed."""
    from sdpa_probe.diagnosis import explain  # (its limits, patched)

    (find, replace), case_id, _ = SINGLE_POINT_BUGS["top-left-causal"]
    kernel = _kernel(tmp_path, "top-left", find, replace)
    case = CASES[case_id]
    prep = prepare_case(case)
    budget = DiagnosisBudget(seconds=0.0)
    first, second = (run_one(kernel, case, prep, keep_output=True) for _ in range(2))
    budget.diagnose(first, case, prep)
    budget.diagnose(second, case, prep)
    assert first.diagnosis["matches"] and not second.diagnosis["matches"]
    assert "--repro diagnoses the case" in second.diagnosis["note"]
    monkeypatch.setattr(explain, "DIAGNOSIS_MAX_MACS", 1000)
    third = run_one(kernel, case, prep, keep_output=True)
    diagnose_record(third, case, prep)
    assert third.diagnosis["note"].startswith("not diagnosed: the case is too large")


def test_a_kind_of_failure_says_for_how_many_the_diagnosis_holds():
    from rich.console import Console  # (rendered as a terminal shows it)

    from sdpa_probe.cli.check_render import failure_list
    from sdpa_probe.records import Record

    def rec(case: str, hypothesis: str | None) -> Record:
        matches = [{"hypothesis": hypothesis, "says": f"matches {hypothesis}", "same_as": [],
                    "max_abs_err": 1e-7}] if hypothesis else []
        return Record("k.c", case, "decode", status="fail", reason="error above tolerance",
                      case_in_words="batch 1", diagnosis={"matches": matches, "tried": ["x"],
                                                          "nan_only": [], "nan": [], "note": ""})

    records = [rec("a", "gqa-modulo"), rec("b", "gqa-modulo"), rec("c", None),
               rec("d", "gqa-modulo")]
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(failure_list(records, 80))
    text = console.export_text()
    assert "diagnosis: matches gqa-modulo" in text
    assert "diagnosis: the same for 2 of the 3 others" in text
