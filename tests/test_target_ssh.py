"""`probe check --target ssh://...` against a real sshd: one started here on 127.0.0.1 at a
free port, as this user, with a throwaway host key and client key (openssh-server; .ci/run
installs it). The smoke suite's verdicts over ssh are the host's; a device that drops the
connection mid-run costs the case in flight a clear error, and the run goes on."""

import contextlib
import getpass
import json
import os
import shutil
import socket
import subprocess
import time

import pytest
from conftest import EXAMPLE_KERNEL
from typer.testing import CliRunner

from sdpa_probe.cli import app
from sdpa_probe.targets.remote import SSH_OPTIONS_ENV

runner = CliRunner()
SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
pytestmark = [
    pytest.mark.skipif(SSHD is None or not shutil.which("ssh-keygen"),
                       reason="no sshd here (apt-get install openssh-server openssh-client)"),
    pytest.mark.slow,  # (check's workers, an sshd, a build of the worker: .ci/run runs it)
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def device(tmp_path, monkeypatch):
    """An sshd on 127.0.0.1 that lets this user in with a key of its own: the target's
    name, with ssh told the key (SDPA_PROBE_SSH_OPTIONS)."""
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(tmp_path / name)], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "client_key.pub").read_text())
    port = _free_port()
    (tmp_path / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path}/host_key\n"
        f"AuthorizedKeysFile {tmp_path}/authorized_keys\nPidFile {tmp_path}/sshd.pid\n"
        "StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nPermitRootLogin prohibit-password\nLogLevel ERROR\n")
    if os.geteuid() == 0:  # (sshd as root wants its privilege separation directory)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    sshd = subprocess.Popen([SSHD, "-f", str(tmp_path / "sshd_config"), "-D", "-e"],
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            break
        if sshd.poll() is not None:
            pytest.fail(f"sshd did not start: {sshd.stderr.read().decode()[-300:]}")
        time.sleep(0.1)
    monkeypatch.setenv(SSH_OPTIONS_ENV, f"-i {tmp_path}/client_key -o StrictHostKeyChecking=no "
                       f"-o UserKnownHostsFile={tmp_path}/known_hosts -o LogLevel=ERROR")
    yield f"ssh://{getpass.getuser()}@127.0.0.1:{port}"
    sshd.terminate()
    sshd.wait(10)


def _check(tmp_path, kernel, target: str) -> tuple[int, dict]:
    j = tmp_path / "r.json"
    res = runner.invoke(app, ["check", "--kernel", str(kernel), "--target", f"host,{target}",
                              "--suite", "smoke", "-j", "1", "--json", str(j)])
    assert res.exit_code in (0, 1), res.output
    by: dict[str, dict[str, dict]] = {}
    for r in json.loads(j.read_text())["records"]:
        by.setdefault(r["backend"], {})[r["case"]] = r
    return res.exit_code, by


def test_smoke_suite_over_ssh_gives_the_hosts_verdicts(tmp_path, device):
    code, by = _check(tmp_path, EXAMPLE_KERNEL, device)
    host, remote = by[str(EXAMPLE_KERNEL)], by[f"{EXAMPLE_KERNEL}@{device}"]
    assert code == 0
    assert {c: r["status"] for c, r in remote.items()} == {c: r["status"] for c, r in host.items()}
    assert set(r["status"] for r in remote.values()) == {"pass"}
    assert all(r["leak_bytes_per_call"] == 0 for r in remote.values())


# the kernel ends the sshd process that serves its connection on the BF16 case
DROP = """
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static void drop_connection(void) {
  int pid = (int)getppid();
  for (int up = 0; up < 8 && pid > 1; up++) {
    char path[64], comm[64] = "", state;
    int ppid = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fscanf(f, "%*d (%63[^)]) %c %d", comm, &state, &ppid) != 3) ppid = 0;
    fclose(f);
    if (!strcmp(comm, "sshd")) { kill(pid, SIGKILL); sleep(2); return; }
    pid = ppid;
  }
}
"""


def test_a_dropped_connection_is_that_cases_error_and_the_run_goes_on(tmp_path, device):
    src = EXAMPLE_KERNEL.read_text().replace('#include "sdpa_probe.h"\n',
                                             '#include "sdpa_probe.h"\n' + DROP)
    src = src.replace("  if (a->batch == 0 || a->q_len == 0) return SDPA_OK;\n",
                      "  if (a->batch == 0 || a->q_len == 0) return SDPA_OK;\n"
                      "  if (a->k.dtype == SDPA_BF16 && getenv(\"SSH_CONNECTION\"))"
                      " drop_connection();\n", 1)
    kernel = tmp_path / "drops.c"
    kernel.write_text(src)
    code, by = _check(tmp_path, kernel, device)
    remote = by[f"{kernel}@{device}"]
    assert code == 1
    bf16 = next(r for c, r in remote.items() if c.endswith("bf16"))
    assert bf16["status"] == "error" and "lost the connection to ssh://" in bf16["reason"]
    others = [r for c, r in remote.items() if not c.endswith("bf16")]
    assert len(others) == 9 and all(r["status"] == "pass" for r in others)
    assert all(r["status"] == "pass" for r in by[str(kernel)].values())
