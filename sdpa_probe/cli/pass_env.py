"""--pass-env, the option of every command that runs kernels in processes of their own
(check, run, bench, profile): what of the caller's environment those get beyond the
allow-list (sandbox.ENV_NAMES, docs/reliability.md)."""

from __future__ import annotations

import typer

PASS_ENV = typer.Option(
    None, "--pass-env", metavar="NAME[=VALUE]",
    help="Give the processes that call kernels this environment variable too (repeatable): "
         "NAME with its value here, NAME=VALUE with that one. They get only an allow-list "
         "of the caller's (PATH, HOME, LANG/LC_*, TMPDIR, thread and library settings, "
         "SDPA_PROBE_*; docs/reliability.md).")
