"""The `probe` command line: one module per command group."""

from __future__ import annotations

import functools
import sys

import typer

from ..errors import ProbeError

app = typer.Typer(
    name="probe",
    help="Profile and check CPU scaled-dot-product attention (SDPA) kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def command(*args, **kwargs):
    """app.command plus the error policy: a ProbeError is one line on stderr, exit 2."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*a, **kw):
            try:
                return fn(*a, **kw)
            except ProbeError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(exc.exit_code) from None
            except KeyboardInterrupt:
                typer.echo("interrupted", err=True)
                raise typer.Exit(130) from None

        return app.command(*args, **kwargs)(run)

    return wrap


def _register() -> None:
    # imported for their @command side effects
    from . import build_cmd, kernels_cmd  # noqa: F401
    for optional in ("info_cmd", "check_cmd", "run_cmd", "sizing_cmd", "profile_cmd", "bench_cmd",
                     "golden_cmd"):
        try:
            __import__(f"{__name__}.{optional}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{optional}":
                raise


_register()


def main() -> None:
    sys.exit(app())
