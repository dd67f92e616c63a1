"""How the head reaches a worker over the fabric for a copy (copy_engine.py): short questions,
each bounded in time, and the words of a stream's receiving end. Standard library only.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from hostlib import StepFailed, ssh_option_value

# Every question to a worker is bounded: a wedged daemon answers nothing, and the copy that
# follows then fails on its watchdog, naming the worker, instead of hanging on the question.
PROBE_SECONDS = 60


class Fabric:
    """The head reaching the workers over the fabric (lib.sh fabric_ssh has the same options and
    says why: a dead peer noticed within ~30 s, AES-GCM first). Short questions share one
    connection per worker (an OpenSSH ControlMaster, ended by `close`); a call that forwards
    the relay agent opens its own."""

    def __init__(self, key: str = "", known_hosts: str = "") -> None:
        self.key, self.known_hosts = key, known_hosts
        self.mux = tempfile.mkdtemp(prefix="spark-vllm-mux.")

    def options(self, forward: bool = False) -> list[str]:
        options = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=10",
                   "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR",
                   "-o", "Ciphers=^aes128-gcm@openssh.com"]  # fmt: skip
        if self.key:
            options += ["-i", self.key, "-o", "IdentitiesOnly=yes",
                        "-o", f"UserKnownHostsFile={ssh_option_value(self.known_hosts)}",
                        "-o", "StrictHostKeyChecking=yes"]  # fmt: skip
        if forward:
            options.append("-A")
        else:
            options += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.mux}/%C",
                        "-o", "ControlPersist=10"]  # fmt: skip
        return options

    def command(self, destination: str, remote: str, forward: bool = False) -> list[str]:
        return ["ssh", *self.options(forward), destination, remote]

    def run(
        self, destination: str, remote: str, stdin: str = "", seconds: int = PROBE_SECONDS
    ) -> tuple[int, str, str]:
        """`remote` run on `destination`: its exit status, stdout and stderr; 124 when it did
        not answer within `seconds`."""
        try:
            done = subprocess.run(
                self.command(destination, remote),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=seconds,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 124, "", ""
        return done.returncode, done.stdout, done.stderr

    def ask(
        self, destination: str, remote: str, stdin: str = "", seconds: int = PROBE_SECONDS
    ) -> tuple[int, str]:
        """`remote`'s exit status and all it said (stdout, then stderr)."""
        status, out, err = self.run(destination, remote, stdin, seconds)
        return status, out + err

    def output(self, destination: str, remote: str, stdin: str = "") -> str | None:
        """`remote`'s stdout on `destination`, None when it failed or did not answer."""
        status, out, _ = self.run(destination, remote, stdin)
        return out if status == 0 else None

    def check(self, destination: str) -> None:
        """Fail clearly when the head cannot open a session to a worker."""
        status, said = self.ask(destination, "true")
        if status != 0:
            said = " ".join(said.split())
            raise StepFailed(
                f"the head cannot SSH to {destination} over the fabric: {said or 'no answer'} "
                f"(ssh exit {status})",
                "the worker's sshd is down or not listening on its fabric IP, the fabric link is "
                "down, the fabric trust (key/known host) is missing, or (Permission denied) the "
                "head reaches it from an address other than its fabricIp, the one address the "
                "key is authorized from (`ip route get <worker fabricIp>` on the head must say "
                "`src <head fabricIp>`)",
            )

    def close(self) -> None:
        for socket in Path(self.mux).glob("*"):
            subprocess.run(
                ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "spark-vllm-mux"],
                capture_output=True,
                timeout=15,
                check=False,
            )
        shutil.rmtree(self.mux, ignore_errors=True)


def ssh_sink(fabric: Fabric, destination: str, remote: str, forward: bool = False) -> str:
    """The bash words that run `remote` on `destination` with its stdin from the stream."""
    return shlex.join(fabric.command(destination, remote, forward))
