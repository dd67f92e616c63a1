"""The SSH options this machine and the head hand to OpenSSH keep paths with a space or a quote
whole: checked with OpenSSH's own parser (`ssh -G` prints the configuration it would use)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from components.connection import docker_ssh_opts, ssh_option
from stacks.config import parse_stack_config
from stacks.credentials import SshAuth
from stacks.plan.cluster import plan_cluster
from tests.program.conftest import ConfigFactory

LIB = Path(__file__).resolve().parents[2] / "components" / "scripts" / "lib.sh"
ODD = '/tmp/spark vllm/it\'s "quoted" back\\slash'


def resolved(*options: str) -> dict[str, str]:
    """What `ssh` makes of `options` (no connection is made)."""
    out = subprocess.run(
        ["ssh", "-G", *options, "somehost"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_an_option_value_stays_one_word() -> None:
    assert resolved("-o", ssh_option("UserKnownHostsFile", ODD))["userknownhostsfile"] == ODD
    assert ssh_option("ControlPersist", 60) == "ControlPersist=60"  # plain values stay plain


def test_the_docker_providers_options_survive_odd_local_paths(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    plan = plan_cluster(parse_stack_config(make_config(hosts=2)), "p/s", None)
    auth = SshAuth(None, "/keys/id", 4, 15)
    worker = plan.workers[0]  # through the bastion: the ProxyCommand carries options too
    opts = docker_ssh_opts(worker, auth, Path(ODD) / "known_hosts", Path(ODD) / "cm")
    seen = resolved(*opts)
    assert seen["userknownhostsfile"] == f"{ODD}/known_hosts"
    assert seen["controlpath"].startswith(f"{ODD}/cm/")
    # The hop's own ssh (run by a shell) must parse the same file name.
    hop = seen["proxycommand"].replace("%h:%p", "somehost:22")  # ssh expands them when it runs
    inner = subprocess.run(
        ["bash", "-c", f'set -- {hop.removeprefix("ssh ")}; ssh -G "$@" 2>/dev/null'],
        capture_output=True,
        text=True,
    ).stdout
    assert f"userknownhostsfile {ODD}/known_hosts" in inner.splitlines()


def test_the_heads_fabric_ssh_keeps_an_odd_known_hosts_path_whole() -> None:
    quote = subprocess.run(
        ["bash", "-c", f'. {LIB} && ssh_option_value "$1"', "lib", ODD],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert resolved("-o", f"UserKnownHostsFile={quote}")["userknownhostsfile"] == ODD
