"""Typed errors. Every user-facing error becomes one line on stderr and an exit code."""


class ProbeError(Exception):
    """A user mistake or an unusable environment: one line, exit code 2."""

    exit_code = 2


class KernelProblem(ProbeError):
    """A kernel under test found at fault before or while it is measured (it crashed or
    failed its trial call, gave wrong output, called a valid call invalid): one line,
    exit code 1, as check, run and bench report a failing kernel."""

    exit_code = 1


class BuildError(ProbeError):
    """The native code could not be compiled or loaded."""


class KernelError(Exception):
    """A kernel returned a non-OK status."""

    status = -1


class SdpaUnsupported(KernelError):
    status = 1


class SdpaInvalid(KernelError):
    status = 2


class CaseUnavailable(Exception):
    """This machine cannot build a case's inputs (e.g. the far layout's address space
    under strict overcommit): every backend's record is `unsupported`, with the reason."""
