"""Diagnosis of a wrong output: which nearby semantics it matches (a list of small
counterfactual oracles, each a named hypothesis) and where a NaN came from and went.

counterfactual.py  the oracle's arithmetic over a Setting, on the stored inputs
hypotheses.py      the nearby semantics, each with the cases it applies to
nan_trace.py       NaN / Inf inputs and the output rows they should and did reach
explain.py         a failing output against them all, within a budget (a case's
                   parameters in words: cases.case_in_words)"""

from __future__ import annotations

from .counterfactual import Setting, attend, matches, true_setting
from .explain import DIAGNOSIS_MAX_MACS, DiagnosisBudget, diagnose, diagnose_record
from .hypotheses import BY_NAME, HYPOTHESES, Context, Hypothesis

__all__ = ["BY_NAME", "DIAGNOSIS_MAX_MACS", "HYPOTHESES", "Context", "DiagnosisBudget",
           "Hypothesis", "Setting", "attend", "diagnose", "diagnose_record", "matches",
           "true_setting"]
