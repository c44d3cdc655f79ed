"""Where a profile ran: the machine line and the build line (compiler, flags, module,
user kernel) shown above its tables, in its SVG chart and in its trace."""

from __future__ import annotations

SHOWN_FLAGS_SKIP = ("-Wall", "-pthread", "-std=c11")


def short_cc(version: str) -> str:
    """'gcc (Debian 12.2.0-14+deb12u1) 12.2.0' -> 'gcc 12.2.0'."""
    parts = version.split()
    if len(parts) >= 2:
        return f"{parts[0]} {parts[-1]}"
    return version or "?"


def flags_text(flags: list[str]) -> str:
    return " ".join(f for f in flags if f not in SHOWN_FLAGS_SKIP)


def machine_line(doc: dict) -> str:
    m = doc.get("machine")
    if not m:
        return ""
    simd = "/".join(m.get("simd") or []) or "no SIMD flags seen"
    load = m.get("loadavg")
    text = (f"machine: {m['cpu']} ({simd}), {m['logical_cores']} logical cores, "
            f"{doc['threads']} thread(s)")
    if load:
        text += f", load {load[0]:.2f} at start"
    return text + f" | sdpa_probe {m['sdpa_probe']}, kernel ABI {m['abi_version']}"


def build_line(doc: dict, attention: str) -> str:
    """Compiler, flags and module of the build that ran `attention` (and its user kernel)."""
    label = doc.get("attention_builds", {}).get(attention)
    b = doc.get("builds", {}).get(label) if label else None
    if not b:
        return ""
    text = (f"build: {short_cc(b['cc_version'])} {flags_text(b['flags'])} -> {b['module']}")
    kern = doc["kernels"].get(attention) or ""
    u = doc.get("user_kernels", {}).get(kern)
    if u and u.get("prebuilt"):
        text += (f"\nuser kernel: {kern} (sha256 {u['sha256']}), a prebuilt .so linked "
                 f"through {u['module']}")
    elif u:
        text += (f"\nuser kernel: {kern} (sha256 {u['sha256']}) {flags_text(u['flags'])} -> "
                 f"{u['module']}")
    return text
