"""Decisions about a host's kernel and session set-up that preflight.sh and image-facts.sh would
otherwise make in shell; the scripts gather, these decide (pure functions, table-tested in
tests/program/test_host_rules.py). Standard library only: it runs with the hosts' python3.

  host_rules.py kho --host H --root DIR --allow yes|no
      Kexec HandOver on a 7.0-series kernel: refused (or, with --allow yes, a warning on stdout).
  host_rules.py shm --host H --path DIR --need-bytes N [--use-bytes N --memory-fraction F]
      /dev/shm (the containers share the host's, --ipc=host) smaller than the servers need; or,
      on unified memory, what they may put there more than the servers' fraction leaves.
  host_rules.py ipc --host H --root DIR --user U --uid N --image-uid N --rootless yes|no
                    --enable-linger yes|no
      systemd-logind's RemoveIPC deleting the servers' shared memory when the SSH user's last
      session ends: linger enabled (`loginctl enable-linger`), or refused with the command.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

from hostlib import StepFailed, require, run_step

GIB = 1024**3
MIB = 1024**2

# --- Kexec HandOver ---------------------------------------------------------------------------

# The kernel series whose RDMA registrations fail while KHO is on (NCCL's ibv_reg_mr_iova2
# ENOMEM at init, NV_ERR_NO_MEMORY wedges): the HWE 7.0 kernels turn KHO on by default
# (NVIDIA/NV-Kernels#590, #591; first reported as 7.0.0-1019-nvidia, eugr/spark-vllm-docker#389).
KHO_SERIES = {(7, 0)}
KHO_SOURCE = "NVIDIA/NV-Kernels#590, #591; eugr/spark-vllm-docker#389"
KHO_FIX = (
    "Kexec HandOver is on (the default of the HWE 7.0 kernels): add kho=off to "
    'GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, run "sudo update-grub" and reboot '
    "(or boot a 6.x kernel; preflight.allowKnownBad: true deploys anyway)"
)


def kernel_series(release: str) -> tuple[int, int] | None:
    """`7.0.0-1019-nvidia` -> (7, 0); None for what is not a release."""
    match = re.match(r"(\d+)\.(\d+)", release.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def kstrtobool(value: str) -> bool | None:
    """The kernel's kstrtobool, which parses `kho=`: y/Y/1/on true, n/N/0/off false."""
    first, second = value[:1].lower(), value[1:2].lower()
    if first in ("y", "1"):
        return True
    if first in ("n", "0"):
        return False
    if first == "o" and second == "n":
        return True
    if first == "o" and second == "f":
        return False
    return None


def kho_by_cmdline(cmdline: str) -> bool | None:
    """Whether the command line turns KHO on (True) or off (False); None when it does not say
    (the kernel's own default). The last parseable `kho=` wins, as early_param parses in order."""
    said = None
    for word in cmdline.split():
        if word.startswith("kho="):
            parsed = kstrtobool(word.removeprefix("kho="))
            said = parsed if parsed is not None else said
    return said


def kho_problem(release: str, cmdline: str, state: str) -> str | None:
    """What is wrong with running RDMA on this kernel, or None.

    `state` is KHO's state as the host shows it: `on` when its interface exists
    (/sys/kernel/debug/kho with CONFIG_KEXEC_HANDOVER_DEBUGFS, made only when KHO is enabled),
    `unknown` otherwise (debugfs is root's, or built without it): then the command line decides,
    and with no `kho=` there, the series' default (on)."""
    if kernel_series(release) not in KHO_SERIES:
        return None
    by_cmdline = kho_by_cmdline(cmdline)
    if state != "on" and by_cmdline is False:
        return None
    how = "its KHO interface is present" if state == "on" else "booted without kho=off"
    return (
        f"the kernel {release} runs Kexec HandOver ({how}): NCCL fails at init with "
        f"ibv_reg_mr_iova2 ENOMEM over RoCE, and hosts wedge on NV_ERR_NO_MEMORY ({KHO_SOURCE})"
    )


def kho_state(root: str) -> str:
    for path in ("sys/kernel/debug/kho", "sys/kernel/kho"):
        if os.path.isdir(os.path.join(root, path)):
            return "on"
    return "unknown"


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def check_kho(flags: dict[str, str]) -> None:
    require(flags, "root", "allow")
    root = flags["root"]
    release = read(os.path.join(root, "proc/sys/kernel/osrelease")).strip()
    cmdline = read(os.path.join(root, "proc/cmdline"))
    problem = kho_problem(release, cmdline, kho_state(root))
    if problem is None:
        return
    if flags["allow"] == "yes":
        print(problem)
        return
    raise StepFailed(problem, KHO_FIX)


# --- /dev/shm ---------------------------------------------------------------------------------


def shm_problem(size_bytes: int, need_bytes: int) -> tuple[str, str] | None:
    """A /dev/shm smaller than the servers on this node need (their containers share the host's:
    --ipc=host), with its fix; None when it is big enough."""
    if size_bytes >= need_bytes:
        return None
    return (
        f"/dev/shm holds {size_bytes / MIB:.0f} MiB, the servers on this node need "
        f"{need_bytes / MIB:.0f} MiB (they use the host's /dev/shm: --ipc=host; a full one kills "
        "vLLM with SIGBUS, vllm PR #48879)",
        "the host mounts a small tmpfs on /dev/shm: raise it (an fstab line `tmpfs /dev/shm tmpfs "
        "defaults,size=50% 0 0`, then `sudo mount -o remount,size=50% /dev/shm`), or lower "
        "docker.shmSizeMb",
    )


def shm_beside_servers_problem(
    use_bytes: int, total_bytes: int, fraction: float
) -> tuple[str, str] | None:
    """On unified memory, /dev/shm's pages are the GPU's memory too: what the containers may put
    there (docker.shmSizeMb for each, and Ray's object store) must fit in what the servers'
    fraction leaves of the node, or a full /dev/shm takes the memory vLLM was sized for and the
    host wedges (users report it with a 64 GB shm_size on a Spark). None when it fits, or when
    the fraction is decided later (auto, several servers: fraction 0)."""
    if fraction <= 0:
        return None
    left = int(total_bytes * (1 - fraction))
    if use_bytes <= left:
        return None
    return (
        f"the containers may put {use_bytes / GIB:.1f} GiB in /dev/shm (docker.shmSizeMb for "
        f"each Ray and vLLM container, and Ray's object store), but on this unified-memory node "
        f"the servers take {fraction:g} of {total_bytes / GIB:.1f} GiB, which leaves "
        f"{left / GIB:.1f} GiB: shared memory beyond that is taken from the GPU's, and the host "
        "freezes",
        "lower docker.shmSizeMb (vLLM's queues need well under 1 GiB; unset is 1024) or "
        "ray.objectStoreMemoryBytes, or lower vllm.gpuMemoryUtilization",
    )


def mem_total_bytes(meminfo: str) -> int:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemTotal in /proc/meminfo")


def check_shm(flags: dict[str, str]) -> None:
    require(flags, "path", "need-bytes")
    stat = os.statvfs(flags["path"])
    problem = shm_problem(stat.f_blocks * stat.f_frsize, int(flags["need_bytes"]))
    if problem is None and flags.get("use_bytes"):
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            total = mem_total_bytes(meminfo.read())
        problem = shm_beside_servers_problem(
            int(flags["use_bytes"]), total, float(flags.get("memory_fraction") or 0)
        )
    if problem is not None:
        raise StepFailed(*problem)


# --- systemd-logind's RemoveIPC ---------------------------------------------------------------

# Where logind reads its configuration (logind.conf(5)): the main file, then the drop-ins of
# every directory sorted by file name, a name in /etc hiding the same name in /run or /usr/lib.
LOGIND_MAIN = ("etc/systemd/logind.conf", "usr/lib/systemd/logind.conf")
LOGIND_DROPINS = (
    "etc/systemd/logind.conf.d",
    "run/systemd/logind.conf.d",
    "usr/lib/systemd/logind.conf.d",
)


def logind_files(root: str) -> list[str]:
    """logind's configuration files in the order it reads them."""
    main = next(
        (os.path.join(root, p) for p in LOGIND_MAIN if os.path.isfile(os.path.join(root, p))),
        None,
    )
    dropins: dict[str, str] = {}
    for directory in LOGIND_DROPINS:
        for path in glob.glob(os.path.join(root, directory, "*.conf")):
            dropins.setdefault(os.path.basename(path), path)
    return ([main] if main else []) + [dropins[name] for name in sorted(dropins)]


def remove_ipc(texts: list[str]) -> bool:
    """logind's RemoveIPC from its configuration files' texts in reading order: the last
    setting in a [Login] section wins; unset, yes (systemd's default)."""
    value = True
    for text in texts:
        section = ""
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[Login]" and line.split("=", 1)[0].strip() == "RemoveIPC":
                parsed = kstrtobool(line.split("=", 1)[1].strip()) if "=" in line else None
                value = parsed if parsed is not None else value
    return value


def sys_uid_max(login_defs: str) -> int:
    """SYS_UID_MAX from /etc/login.defs; 999 (Debian's and systemd's default) when unset."""
    for line in login_defs.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "SYS_UID_MAX" and words[1].isdigit():
            return int(words[1])
    return 999


def segments_owner(image_uid: int, rootless: bool, user_uid: int) -> int:
    """The host uid that owns what the servers put in /dev/shm: the image's user, which rootless
    Docker maps from its root to the user running dockerd (the SSH user)."""
    return user_uid if rootless and image_uid == 0 else image_uid


def ipc_decision(
    *,
    user: str,
    user_uid: int,
    owner_uid: int,
    system_uid_max: int,
    removes_ipc: bool,
    lingers: bool,
    rootless: bool,
    enable_linger: bool,
) -> tuple[str, str]:
    """What to do about logind's RemoveIPC for the servers on this host: (`ok`, why), (`linger`,
    why) to enable linger for `user`, or (`refuse`, why).

    logind removes a user's System V and POSIX IPC objects (its files in /dev/shm among them)
    when the user's last session ends, unless the user lingers, and never a system user's
    (uid <= SYS_UID_MAX) or root's (logind.conf(5) RemoveIPC=). Our containers run with the
    host's IPC namespace (--ipc=host), so vLLM's shared-memory ring is owned by the image's
    user: removed at logout only when that is the SSH user's uid (an image user with the same
    uid, or rootless Docker's root). Rootless Docker's daemon is also the user's own service,
    stopped at logout without linger, whatever RemoveIPC says."""
    if rootless and not lingers:
        return (
            "linger" if enable_linger else "refuse",
            f"Docker runs rootless as {user}: its daemon and the servers stop when {user}'s last "
            "SSH session ends",
        )
    if not removes_ipc:
        return "ok", "logind's RemoveIPC is off"
    if user_uid == 0 or user_uid <= system_uid_max:
        return "ok", f"{user} (uid {user_uid}) is a system user: RemoveIPC does not apply"
    if owner_uid != user_uid:
        return "ok", f"the servers' shared memory is uid {owner_uid}'s, not {user}'s"
    if lingers:
        return "ok", f"{user} lingers"
    return (
        "linger" if enable_linger else "refuse",
        f"logind's RemoveIPC=yes deletes {user}'s /dev/shm segments when their last SSH session "
        f"ends, and the servers' shared memory is {user}'s (uid {user_uid}): vLLM's shared-memory "
        "ring would vanish under a running server (vllm#54259)",
    )


def check_ipc(flags: dict[str, str]) -> None:
    require(flags, "root", "user", "uid", "image-uid", "rootless", "enable-linger")
    root, user = flags["root"], flags["user"]
    uid, rootless = int(flags["uid"]), flags["rootless"] == "yes"
    linger_file = os.path.join(root, "var/lib/systemd/linger", user)
    action, why = ipc_decision(
        user=user,
        user_uid=uid,
        owner_uid=segments_owner(int(flags["image_uid"]), rootless, uid),
        system_uid_max=sys_uid_max(read(os.path.join(root, "etc/login.defs"))),
        removes_ipc=remove_ipc([read(path) for path in logind_files(root)]),
        lingers=os.path.exists(linger_file),
        rootless=rootless,
        enable_linger=flags["enable_linger"] == "yes",
    )
    command = f"loginctl enable-linger {user}"
    if action == "ok":
        return
    if action == "linger":
        done = subprocess.run(["loginctl", "enable-linger"], capture_output=True, text=True,
                              timeout=30, check=False)  # fmt: skip
        if done.returncode == 0:
            print(f"spark-vllm: enabled linger for {user} ({why})", file=sys.stderr)
            return
        said = (done.stderr or done.stdout).strip().replace("\n", " ")
        raise StepFailed(
            f"{why}; `loginctl enable-linger` failed: {said or f'exit {done.returncode}'}",
            f'run "sudo {command}" on this host (or set RemoveIPC=no in '
            "/etc/systemd/logind.conf and restart systemd-logind), then run `pulumi up` again",
        )
    raise StepFailed(
        why,
        f'run "{command}" on this host (preflight.enableLinger: true does it for you), or set '
        "RemoveIPC=no in /etc/systemd/logind.conf and restart systemd-logind",
    )


CHECKS = {"kho": ("preflight", check_kho), "shm": ("preflight", check_shm),
          "ipc": ("image-facts", check_ipc)}  # fmt: skip


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CHECKS:
        print(__doc__, file=sys.stderr)
        return 2
    step, check = CHECKS[argv[0]]
    return run_step(step, argv[1:], check)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
