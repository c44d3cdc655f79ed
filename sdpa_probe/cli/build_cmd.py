"""`probe build`: compile the native kernel library (or a user kernel, or ggml for the
ggml backends) into the cache."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import ggml_build, native
from ..errors import ProbeError
from . import command
from .output import Output


@command("build")
def build_command(
    force: bool = typer.Option(False, "--force", help="Rebuild even if the cache has this build."),
    cc: str | None = typer.Option(None, "--cc", help="C compiler (default: $CC, then Python's)."),
    cflags: str | None = typer.Option(
        None, "--cflags", help='Extra compiler flags, e.g. "-O2"; they come after the defaults.'),
    kernel: Path | None = typer.Option(
        None, "--kernel",
        help="Build a user kernel file (.c / .cpp implementing sdpa_forward, or a .so)."),
    ggml: bool = typer.Option(
        False, "--ggml", help="Build ggml from llama.cpp's source for the ggml and ggml-nofa "
        f"backends (minutes; the {ggml_build.SDIST_PROJECT} {ggml_build.SDIST_VERSION} sdist, "
        f"downloaded or from ${ggml_build.SDIST_ENV})."),
    json_out: bool = typer.Option(False, "--json", help="Print the build record as JSON."),
) -> None:
    """Compile the native kernels into the build cache and say what was built where."""
    out = Output(json_out)
    if ggml:
        if kernel is not None or cc is not None or cflags is not None:
            raise ProbeError("--ggml builds ggml alone, with cmake's flags: not with --kernel, "
                             "--cc or --cflags (set $CC to choose its compiler)")
        _build_ggml(out, force, json_out)
        return
    if cc is not None and not cc.strip():  # (else read as not given: $CC or Python's)
        raise ProbeError("--cc is empty: give a C compiler, e.g. --cc gcc")
    # the options apply to this build only: no process-wide state is changed
    if kernel is not None:
        res = native.build(native.user_kernel_spec(kernel), force=force, cc=cc, cflags=cflags)
        native.load_user_module(res, kernel)  # it links: it defines sdpa_forward and its helpers
    else:
        res = native.build(native.lib_spec(), force=force, cc=cc, cflags=cflags)
        native.load(res)  # a build that does not import is not a build
    if json_out:
        out.emit_json(res.as_dict())
        return
    state = "cached" if res.cached else f"built in {res.seconds:.1f} s"
    out.print(f"[bold]{res.module_name}[/] ({state})")
    out.print(f"  path      {res.path}")
    out.print(f"  compiler  {res.cc}  ({res.cc_version})")
    if res.cxx:
        out.print(f"  c++       {res.cxx}")
    out.print(f"  flags     {' '.join(res.flags)}")
    if res.fallback:
        out.warn(f"-march=native failed ({res.fallback_reason}); built with portable flags")


def _build_ggml(out: Output, force: bool, json_out: bool) -> None:
    built = ggml_build.build(force=force)
    res = ggml_build.build_adapter(built, force=force)
    native.load(res)  # (it links: ggml's libraries are where its rpath says)
    if json_out:
        out.emit_json({"ggml": str(built.path), "cached": built.cached, **built.manifest,
                       "module": res.as_dict()})
        return
    state = "cached" if built.cached else f"built in {built.manifest['seconds']:.0f} s"
    out.print(f"[bold]{built.description}[/] ({state})")
    out.print(f"  path      {built.path}")
    out.print(f"  compiler  {built.manifest['cc']}  ({built.manifest['cc_version']})")
    out.print(f"  cmake     {' '.join(built.manifest['cmake_flags'])}")
    out.print(f"  module    {res.path}")
