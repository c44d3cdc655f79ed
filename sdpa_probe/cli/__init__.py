"""The `probe` command line: one module per command group."""

from __future__ import annotations

import functools
import sys

import typer

from .. import __version__, build_progress
from ..errors import ProbeError
from .output import native_stdout_to_stderr
from .progress import BuildProgress


def typer_app(name: str, help: str, completion: bool = False) -> typer.Typer:
    """A Typer app with the settings every `probe` command group shares (completion:
    the --install-completion and --show-completion options, the root's alone)."""
    return typer.Typer(name=name, help=help, no_args_is_help=True, add_completion=completion,
                       pretty_exceptions_enable=False, rich_markup_mode=None)


app = typer_app("probe", "Profile and check CPU scaled-dot-product attention (SDPA) kernels.",
                completion=True)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"sdpa_probe {__version__}")
        raise typer.Exit()


@app.callback()
def _options(ctx: typer.Context,
             version: bool = typer.Option(False, "--version", callback=_print_version,
                                          is_eager=True, help="Print the version and exit."),
             verbose: bool = typer.Option(False, "--verbose", "-v",
                                          help="Also show each compiler command of a build.")):
    """Profile and check CPU scaled-dot-product attention (SDPA) kernels."""
    # a native build anywhere in the command shows its progress on stderr
    ctx.with_resource(build_progress.watching(BuildProgress(verbose)))


def guarded(fn):
    """The error policy of every command: a ProbeError is one line on stderr and its
    exit code (2), an interrupt exits 130; never a traceback."""

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

    return run


def command(*args, typer_app: typer.Typer | None = None, **kwargs):
    """(typer_app or app).command plus the error policy of guarded()."""

    def wrap(fn):
        return (typer_app or app).command(*args, **kwargs)(guarded(fn))

    return wrap


# the commands, each registered by its module's @command (imported after `app` and
# `command` exist, which they use)
from . import (  # noqa: E402, F401, I001
    build_cmd,
    kernels_cmd,
    backends_cmd,
    info_cmd,
    check_cmd,
    fuzz_cmd,
    run_cmd,
    sizing_cmd,
    profile_cmd,
    bench_cmd,
    golden_cmd,
)


def main() -> None:
    """The console script: a usage error (a bad option value, an unknown option or
    command) is one line on stderr and exit 2, as the commands' own errors are, not the
    framework's boxed message."""
    try:
        with native_stdout_to_stderr():
            rv = app(standalone_mode=False)
    except Exception as exc:  # click's errors, duck-typed: typer vendors click privately
        show, code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
        if show is None or code is None:
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as asked
            exc.show()
            sys.exit(code)
        ctx = getattr(exc, "ctx", None)
        hint = f" (try '{ctx.command_path} --help')" if ctx is not None else ""
        typer.echo(f"error: {show()}{hint}", err=True)
        sys.exit(code)
    sys.exit(rv if isinstance(rv, int) else 0)
