"""`probe profile --kernel FILE` counts the kernel's heap allocations per step as `probe
bench` does (a worker with a counting malloc): the profile's own counter sees the native
library's allocator only, and a user kernel calls malloc."""

from __future__ import annotations

from conftest import EXAMPLE_KERNEL
from profile_cli import FAST, TINY, json_run

from sdpa_probe.profile import user_allocs

LAYERS = int(TINY[TINY.index("--layers") + 1])
ENTRY = "int st = sdpa_validate_args(a);"


def _sdpa(doc: dict) -> dict:
    return next(o for o in doc["ops"] if o["name"] == user_allocs.ATTENTION_OP)


def test_a_kernel_that_mallocs_every_call_shows_it_per_step(tmp_path):
    # the example kernel's two scratch buffers, and one more block of 1000 bytes
    k = tmp_path / "mallocs.c"
    k.write_text("#include <stdlib.h>\n" + EXAMPLE_KERNEL.read_text().replace(
        ENTRY, "char *volatile block = malloc(1000);\n  free(block);\n  " + ENTRY))
    assert "--no-allocs" in FAST  # (the other profile tests leave the count out)
    doc = json_run("--kernel", str(k), "--context", "12", "--allocs")  # (the last one counts)
    per_call = doc["runs"][0]["user_allocs"]
    assert per_call["allocs"] == 3 and per_call["frees"] == 3 and per_call["bytes"] > 1000
    sdpa = _sdpa(doc)
    assert sdpa["calls"] == LAYERS and sdpa["allocs_per_step"] == 3 * LAYERS
    assert doc["runs"][0]["allocs_per_step"] >= 3 * LAYERS
    # the profile's own counter alone: none of them
    doc = json_run("--kernel", str(k), "--context", "12", "--no-allocs")
    assert _sdpa(doc)["allocs_per_step"] == 0 and "user_allocs" not in doc["runs"][0]
