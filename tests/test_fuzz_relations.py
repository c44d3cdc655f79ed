"""Each metamorphic relation has a kernel that breaks it alone: on its case the kernel
passes the oracle and every other relation, and the relation's check fails naming it
(in this process: a few small cases per kernel). (`probe check --corpus` reporting it
by name from a worker: test_fuzz.py.)"""

import dataclasses

import pytest
from fuzz_kernels import VIOLATORS, violator

from sdpa_probe import native
from sdpa_probe.backends import make, parse
from sdpa_probe.cases.case import RELATIONS
from sdpa_probe.cases.spec import parse_spec
from sdpa_probe.check.relations import applies, run_case
from sdpa_probe.oracle import prepare_case


def _backend(path):
    native.load_user_kernel(path)
    return make(parse(str(path)).name)


def test_every_relation_has_a_violator():
    assert set(VIOLATORS) == set(RELATIONS)


@pytest.mark.parametrize("relation", RELATIONS)
def test_violator_breaks_its_relation_alone(tmp_path, relation):
    backend = _backend(violator(tmp_path, relation))
    base = parse_spec(VIOLATORS[relation][1])
    prep = prepare_case(base)
    plain = run_case(backend, base, prep)
    assert plain.status == "pass", plain.reason
    failed = {}
    for rel in RELATIONS:
        if applies(rel, base) is not None:
            continue
        rec = run_case(backend, dataclasses.replace(base, relation=rel), prep)
        failed[rel] = rec.status != "pass"
        if rel == relation:
            assert rec.reason.startswith(f"property {relation}: "), rec.reason
    assert failed.pop(relation)
    assert not any(failed.values()), failed
