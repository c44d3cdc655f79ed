"""The cache-sizing suite under the import path `probe check` still uses; the suite
lives in sdpa_probe.sizing (remove this module once check_cmd imports from there)."""

from .sizing import run_suite  # noqa: F401
