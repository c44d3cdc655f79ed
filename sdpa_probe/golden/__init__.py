"""Golden data: stored float64 oracle outputs for a subset of the case matrix, so
tests and `probe check --golden` need no oracle (and no torch SDPA) call, and a
change in what the oracle returns (a new torch, a new machine, an edited
reference) shows up as a reviewed diff instead of being inherited silently.

Layout of a golden directory (docs/golden.md):

    manifest.json        schema, versions, semantics, the header's sha256, and per
                         case: id, parameters, seed, file, size, sha256 of the file,
                         sha256 of the inputs, sha256 of the whole record
    <case id>.npz        `ref` float64 [B, Lq, H, D] and `torch_err` float64 scalar
                         (NaN: torch has no path for the dtype)

Inputs are not stored: `inputs.materialise(case)` regenerates them from the seed,
and the manifest's `inputs_sha256` proves they are the inputs the reference was
computed from. Each case's record_sha256 covers its manifest entry, the manifest's
header and its arrays; verify also recomputes the reference and torch's error from the
inputs, so an edit that kept every digest consistent is found too. The .npz files
are written without compression and with fixed zip metadata, so the same arrays
always give the same bytes.

The rooms: format (bytes, digests, where the set is), manifest (reading a stored
set), provenance (versions and semantics), drift (how a case moved, two sets'
diff), recompute (a stored case against its inputs recomputed), verification
(`probe golden verify`, and check --golden's check of the set), lookup (the references
`--golden` reads), regen (select, plan, write)."""

from .drift import DRIFT_FRACTION, TORCH_ERR_DRIFT, compare, count_statuses, diff_sets
from .format import (
    ARRAYS,
    DEFAULT_SUITE,
    GENERATOR,
    MANIFEST,
    SCHEMA,
    SCHEMA_VERSION,
    GoldenError,
    default_dir,
    inputs_digest,
    manifest_bytes,
    npz_bytes,
    record_digest,
    seal,
    sha256,
    show_path,
)
from .lookup import GoldenStore, store
from .manifest import (
    CaseProblem,
    Problem,
    check_blob,
    inputs_mismatch,
    load_case,
    parse_blob,
    read_case,
    read_manifest,
)
from .provenance import semantics, torch_err_comparable, versions
from .recompute import REF_BOUND, TORCH_ERR_FACTOR, TORCH_ERR_REL, made_here
from .regen import (
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
from .verification import GoldenProblems, VerifyResult, golden_root, verify

__all__ = [
    "ARRAYS", "DEFAULT_SUITE", "DRIFT_FRACTION", "GENERATOR", "MANIFEST", "REF_BOUND",
    "SCHEMA", "SCHEMA_VERSION", "TORCH_ERR_DRIFT", "TORCH_ERR_FACTOR", "TORCH_ERR_REL",
    "CaseProblem", "Entry", "GoldenError", "GoldenProblems", "GoldenStore", "Problem",
    "RegenPlan", "VerifyResult", "build_manifest", "check_blob", "compare", "count_statuses",
    "default_dir", "diff_sets", "generate", "inputs_digest", "inputs_mismatch", "load_case",
    "made_here", "manifest_bytes", "npz_bytes", "parse_blob", "plan_regen", "read_case",
    "read_manifest", "record_digest", "reference_suite", "regenerate", "seal",
    "select_cases", "semantics", "sha256", "show_path", "store", "torch_err_comparable",
    "versions", "golden_root", "verify", "write_plan",
]
