"""The Backend registry: names parsed in one place, a new backend added with one
module and one registry line, and judged as every other backend is."""

from __future__ import annotations

import pytest
from toy_backend import ToyBackend, ToyBackendIgnoringMasks

from sdpa_probe import backends
from sdpa_probe.backends import registry
from sdpa_probe.cases import Case
from sdpa_probe.check.calls import run_one
from sdpa_probe.errors import ProbeError
from sdpa_probe.oracle import prepare_case


def test_a_name_is_a_registered_backend_one_of_our_kernels_or_a_kernel_file():
    assert backends.parse("torch") == registry.BackendSpec("registered", "torch")
    assert backends.parse("flash") == registry.BackendSpec("native", "flash")
    spec = backends.parse("kernels/mine.cpp")
    assert (spec.kind, spec.name, spec.label) == ("file", "kernels/mine.cpp", "mine.cpp")
    # a record written before a file was its own name reads back as the same file
    assert backends.parse("user:kernels/mine.cpp") == spec
    with pytest.raises(ProbeError, match="unknown backend 'flsh'.*flash.*torch"):
        backends.parse("flsh")


def test_lists_are_split_expanded_and_kept_once_in_order():
    specs = backends.parse_list(["torch,flash", "flash", "all"])
    names = [s.name for s in specs]
    assert names[:2] == ["torch", "flash"] and len(names) == len(set(names))
    assert set(names) >= {"decomposed", "flash_maskskip", "quant_int8"}
    assert set(names) >= set(registry.REGISTERED)  # ("all" is every backend)
    default = [s.name for s in backends.default_specs()]
    assert "torch" in default and "executorch" not in default  # (runtimes by name only)


def test_every_registered_backend_follows_the_protocol():
    for name, cls in registry.REGISTERED.items():
        assert cls.name == name
        why = cls.why_unavailable()
        assert why is None or isinstance(why, str)
        if why is None:
            b = cls()
            assert isinstance(b.version(), str) and b.version()
            # (a backend of one precision, openvino-f16, takes the decode case in its dtype)
            assert any(b.supports(Case("decode", dtype=d)) is None for d in ("f32", "f16", "bf16"))


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(registry.REGISTERED, "toy", ToyBackend)  # the one registry line
    monkeypatch.setitem(registry.REGISTERED, "toy-nomask", ToyBackendIgnoringMasks)


CASES = [Case("decode", kv_len=100), Case("causal", q_len=7, kv_len=40, causal=True,
                                          start_pos=33),
         Case("masked-rows", q_len=8, kv_len=64, mask="rows:middle"),
         Case("dtype", dtype="f16")]


def test_a_new_backend_is_one_module_and_one_registry_line(toy_registered):
    spec = backends.parse("toy")
    assert spec.kind == "registered" and spec.why_unavailable() is None
    toy = backends.make(spec)
    assert toy.version() == "toy 1.0"
    got = {c.id: run_one(toy, c, prepare_case(c))["status"] for c in CASES}
    assert list(got.values()) == ["pass", "pass", "pass", "unsupported"], got


def test_a_new_backend_gets_the_same_verdicts(toy_registered):
    """A backend that ignores the mask is caught on the masked case, and only there."""
    bad = backends.make("toy-nomask")
    recs = [run_one(bad, c, prepare_case(c)) for c in CASES[:3]]
    assert [r["status"] for r in recs] == ["pass", "pass", "fail"]
    assert "toy-nomask" in recs[2]["repro"] and recs[2]["reason"]


def test_each_runtime_gets_worker_processes_of_its_own():
    """Our kernels, kernel files and torch share workers; a runtime's module has its
    own, so its thread pools and state never sit beside another backend's calls."""
    specs = backends.parse_list(["flash,onnxruntime,torch,ggml,onnxruntime-gqa,ggml-nofa,"
                                 "mine.c,openvino,openvino-stateful"])
    groups = registry.worker_groups(specs)
    assert groups[0] == ["flash", "torch", "mine.c"]
    assert ["ggml", "ggml-nofa"] in groups and ["onnxruntime"] in groups
    assert sorted(n for g in groups for n in g) == sorted(s.name for s in specs)
    assert all(len({registry.REGISTERED[n].__module__ for n in g}) == 1 for g in groups[1:])
