"""Where a backend's kernel runs (`probe check --target`): this process (`host`), an
aarch64 build under qemu-aarch64 (`aarch64`, or `aarch64-sveN` at a fixed SVE vector
length of N bits), or a Linux device over ssh (`ssh://[user@]host[:port]`). A backend
checked on a target other than the host is named `backend@target` in records and
columns. This module only parses and describes; building is targets/build.py's and
running targets/remote.py's."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

from ..errors import ProbeError

TARGET_HELP = ("Where the kernels run: host (this CPU), aarch64 (built with "
               "aarch64-linux-gnu-gcc, run under qemu-aarch64), aarch64-sve128|256|512|2048 "
               "(SVE at that vector length), ssh://[user@]host[:port] (a Linux device). "
               "Repeat or comma-separate: one column per backend and target. probe info "
               "--targets says which ones this machine can run.")

HOST = "host"
SVE_BITS = (128, 256, 512, 2048)
# (sve-max-vq counts 128-bit quadwords; Arm allows any multiple of 128 up to 2048)
_SVE = re.compile(r"aarch64-sve(\d+)\Z")
_SSH = re.compile(r"ssh://(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9a-fA-F:]+\])"
                  r"(?::(?P<port>\d+))?/?\Z")
# a backend name's target suffix: name@aarch64, name@aarch64-sve512, name@ssh://u@h:22
_SUFFIX = re.compile(r"@(aarch64(?:-sve\d+)?|ssh://\S+)\Z")

QEMU = "qemu-aarch64"
QEMU_SLOWDOWN = 10.0  # (Target.timeout_factor)
CROSS_CC = "aarch64-linux-gnu-gcc"
# what to apt-get install for each tool a target needs
APT = {QEMU: "qemu-user", CROSS_CC: "gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
       "ssh": "openssh-client"}
KNOWN = ("host", "aarch64", *(f"aarch64-sve{b}" for b in SVE_BITS), "ssh://[user@]host[:port]")


@dataclasses.dataclass(frozen=True)
class Target:
    name: str               # as given: host, aarch64, aarch64-sve256, ssh://pi@board:2222
    kind: str               # host | qemu | ssh
    sve_bits: int = 0       # qemu: the SVE vector length (0: plain aarch64, NEON only)
    user: str = ""
    host: str = ""
    port: int = 0

    @property
    def is_host(self) -> bool:
        return self.kind == "host"

    @property
    def timeout_factor(self) -> float:
        """--timeout is for a case on this CPU; under qemu it is this many times longer
        (measured on a loaded 2-core machine, the example kernel's kv 70001 int8 case:
        0.45 s on the host, 3.6 s under qemu with NEON, minutes with SVE, whose gathers
        and predicated loops GCC vectorised it into and qemu emulates one by one)."""
        return QEMU_SLOWDOWN if self.kind == "qemu" else 1.0

    def qemu_cpu(self) -> str:
        """qemu-aarch64's -cpu: every feature of its `max` CPU, the SVE vector length
        fixed for an -sveN target (sve-max-vq in 128-bit units), SVE off for plain
        aarch64 (a NEON build has none to use)."""
        if not self.sve_bits:
            return "max,sve=off"
        return f"max,sve-max-vq={self.sve_bits // 128}"

    def ssh_destination(self) -> list[str]:
        """ssh's arguments naming the device: [-p PORT] [user@]host."""
        where = f"{self.user}@{self.host}" if self.user else self.host
        return (["-p", str(self.port)] if self.port else []) + [where.strip("[]")]


def parse_target(text: str) -> Target:
    """One --target value; ProbeError naming the known forms for anything else."""
    t = text.strip()
    if t == HOST:
        return Target(t, "host")
    if t == "aarch64":
        return Target(t, "qemu")
    m = _SVE.match(t)
    if m:
        bits = int(m.group(1))
        if bits % 128 or not 128 <= bits <= 2048:
            raise ProbeError(f"--target {t}: an SVE vector length is a multiple of 128 bits "
                             f"from 128 to 2048 (e.g. {', '.join(map(str, SVE_BITS))})")
        return Target(t, "qemu", sve_bits=bits)
    if t.startswith("ssh://"):
        m = _SSH.match(t)
        if not m:
            raise ProbeError(f"--target {t}: write ssh://[user@]host[:port]")
        port = int(m.group("port") or 0)
        if port > 65535:
            raise ProbeError(f"--target {t}: port {port} is past 65535")
        return Target(t, "ssh", user=m.group("user") or "", host=m.group("host"), port=port)
    raise ProbeError(f"unknown target {t!r}; known: {', '.join(KNOWN)}")


def parse_targets(values: list[str] | None) -> list[Target]:
    """--target's values (repeated or comma-separated; ssh:// ones hold no comma), in
    order, each once; [host] when none is given."""
    found = [parse_target(p) for v in values or () for p in v.split(",") if p.strip()]
    if values and not found:
        raise ProbeError(f"--target is empty; known: {', '.join(KNOWN)}")
    return list(dict.fromkeys(found)) or [Target(HOST, "host")]


def timeout_factor(names: list[str]) -> float:
    """The largest timeout factor of the targets these backend names run on."""
    return max((parse_target(split_target(n)[1] or HOST).timeout_factor for n in names),
               default=1.0)


def split_target(name: str) -> tuple[str, str]:
    """A backend name as (the backend, its target's name; "" on the host)."""
    m = _SUFFIX.search(name)
    if not m:
        return name, ""
    return name[:m.start()], m.group(1)


def with_target(name: str, target: Target) -> str:
    """The name a backend checked on `target` goes by (the backend's own on the host)."""
    return name if target.is_host else f"{name}@{target.name}"


def missing_tools(target: Target) -> list[str]:
    """The programs this machine lacks to run `target` (empty: usable)."""
    if target.kind == "qemu":
        return [t for t in (CROSS_CC, QEMU) if shutil.which(t) is None]
    if target.kind == "ssh":
        return [t for t in ("ssh",) if shutil.which(t) is None]
    return []


def install_hint(tools: list[str]) -> str:
    """The apt-get line that brings the tools."""
    pkgs = " ".join(dict.fromkeys(APT[t] for t in tools))
    return f"apt-get install {pkgs}"


def why_unusable(target: Target) -> str | None:
    """None if `target` can run here, else a one-line reason with what to install."""
    missing = missing_tools(target)
    if not missing:
        return None
    return (f"target {target.name} needs {' and '.join(missing)}, not found on PATH "
            f"({install_hint(missing)})")


def _tool_version(tool: str) -> str:
    """The first line a tool says of its version ("" if it cannot say)."""
    try:
        out = subprocess.run([tool, "--version"] if tool != "ssh" else [tool, "-V"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return ((out.stdout or out.stderr).splitlines() or [""])[0].strip()


def target_report() -> list[dict]:
    """Every kind of target: usable here or not, what it needs, the apt-get line for
    what is missing (probe info --targets)."""
    rows = []
    for name in ("host", "aarch64", *(f"aarch64-sve{b}" for b in SVE_BITS),
                 "ssh://[user@]host[:port]"):
        t = parse_target("ssh://device") if name.startswith("ssh") else parse_target(name)
        needs = {"qemu": [CROSS_CC, QEMU], "ssh": ["ssh"]}.get(t.kind, [])
        missing = missing_tools(t)
        rows.append({"target": name, "usable": not missing,
                     "needs": {tool: _tool_version(tool) if tool not in missing else None
                               for tool in needs},
                     "install": install_hint(missing) if missing else None,
                     "runs": _RUNS[t.kind] + (f" -cpu {t.qemu_cpu()}" if t.kind == "qemu"
                                              else "")})
    return rows


_RUNS = {"host": "this CPU", "qemu": "qemu-aarch64",
         "ssh": "the device (an aarch64 one's worker is built with the cross compiler)"}
