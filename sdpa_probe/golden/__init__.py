"""Golden data: stored float64 oracle outputs for a subset of the case matrix, so
tests and `probe check --golden` need no oracle (and no torch SDPA) call, and a
change in what the oracle returns (a new torch, a new machine, an edited
reference) shows up as a reviewed diff instead of being inherited silently.

Layout of a golden directory (docs/golden.md):

    manifest.json        schema, versions, semantics, and per case: id, parameters,
                         seed, file, size, sha256 of the file, sha256 of the inputs
    <case id>.npz        `ref` float64 [B, Lq, H, D] and `torch_err` float64 scalar
                         (NaN: torch has no path for the dtype)

Inputs are not stored: `inputs.materialise(case)` regenerates them from the seed,
and the manifest's `inputs_sha256` proves they are the inputs the reference was
computed from. The .npz files are written without compression and with fixed zip
metadata, so the same arrays always give the same bytes.

The rooms: format (bytes, digests, where the set is), manifest (reading a stored
set), provenance (versions and semantics), drift (how a case moved, two sets'
diff), verification (`probe golden verify`), lookup (the references `--golden` reads),
regen (select, plan, write)."""

from .drift import DRIFT_FRACTION, TORCH_ERR_DRIFT, compare, count_statuses, diff_sets
from .format import (
    ARRAYS,
    GENERATOR,
    MANIFEST,
    SCHEMA,
    SCHEMA_VERSION,
    GoldenError,
    default_dir,
    inputs_digest,
    manifest_bytes,
    npz_bytes,
    sha256,
    show_path,
)
from .lookup import GoldenStore, store
from .manifest import Problem, check_blob, inputs_mismatch, parse_blob, read_manifest
from .provenance import semantics, torch_err_comparable, versions
from .regen import (
    DEFAULT_SUITE,
    Entry,
    RegenPlan,
    build_manifest,
    generate,
    plan_regen,
    reference_suite,
    regenerate,
    select_cases,
    write_plan,
)
from .verification import VerifyResult, golden_root, verify

__all__ = [
    "ARRAYS", "DEFAULT_SUITE", "DRIFT_FRACTION", "GENERATOR", "MANIFEST", "SCHEMA",
    "SCHEMA_VERSION", "TORCH_ERR_DRIFT", "Entry", "GoldenError", "GoldenStore", "Problem",
    "RegenPlan", "VerifyResult", "build_manifest", "check_blob", "compare", "count_statuses",
    "default_dir", "diff_sets", "generate", "inputs_digest", "inputs_mismatch",
    "manifest_bytes", "npz_bytes", "parse_blob", "plan_regen", "read_manifest",
    "reference_suite", "regenerate", "select_cases", "semantics", "sha256", "show_path",
    "store", "torch_err_comparable", "versions", "golden_root", "verify", "write_plan",
]
