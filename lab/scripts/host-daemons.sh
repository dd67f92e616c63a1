#!/bin/bash
# Starts a simulated host's daemons inside its namespaces (run there by `nsenter -t <init> -a`).
# Idempotent: a daemon whose pid file names a live process is left alone. Each daemon is started
# in the background so this script returns; the host's PID 1 (tini) adopts and reaps them.
set -euo pipefail

hostdir=$1        # <state dir>/hosts/<name>
with_docker=$2    # 1 for Spark hosts, 0 for the bastion
cgroup_parent=$3  # cgroup (per controller) under which dockerd puts containers
engine_dir=${4:-}  # Docker 26's unpacked binaries (lab/engines.py); empty: the machine's Docker
storage_driver=${5-overlay2}  # empty with the containerd image store: its own snapshotter

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Docker 26 finds its own containerd, shims and docker-proxy first; runc (and docker-init)
# stay Debian 12's: Debian 13's runc needs a newer glibc.
[[ -z $engine_dir ]] || PATH="$engine_dir/usr/sbin:$engine_dir/usr/bin:$PATH"
logdir="$hostdir/log"
mkdir -p "$logdir"

alive() {  # alive PIDFILE: the pid file exists and names a running process
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

if ! alive /run/sshd.pid; then
    mkdir -p /run/sshd
    # sshd forks into the background itself once its listeners are bound.
    /usr/sbin/sshd -f "$hostdir/ssh/sshd_config" -E "$logdir/sshd.log"
fi

if [[ $with_docker == 1 ]] && ! alive /run/docker.pid; then
    # No iptables/bridge: hosts have no NAT and containers use the host network (like Ray on
    # Sparks). Data and exec roots are per host so the daemons share nothing.
    # Docker 26 starts its own containerd (state under the data and exec roots) when no
    # --containerd is given; 20.10 does too.
    setsid dockerd \
        --data-root "$hostdir/docker" \
        --exec-root /run/docker \
        --pidfile /run/docker.pid \
        -H unix:///run/docker.sock \
        --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
        --cgroup-parent="/$cgroup_parent" \
        ${storage_driver:+"--storage-driver=$storage_driver"} \
        </dev/null >>"$logdir/dockerd.log" 2>&1 &
fi
