#!/bin/bash
# Starts a simulated host's daemons inside its namespaces (run there by `nsenter -t <init> -a`).
# Idempotent: a daemon whose pid file names a live process is left alone. Each daemon is started
# in the background so this script returns; the host's PID 1 (tini) adopts and reaps them.
set -euo pipefail

hostdir=$1        # <state dir>/hosts/<name>
with_docker=$2    # 1 for Spark hosts, 0 for the bastion
cgroup_parent=$3  # cgroup (per controller) under which dockerd puts containers

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
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
    setsid dockerd \
        --data-root "$hostdir/docker" \
        --exec-root /run/docker \
        --pidfile /run/docker.pid \
        -H unix:///run/docker.sock \
        --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
        --cgroup-parent="/$cgroup_parent" \
        --storage-driver=overlay2 \
        </dev/null >>"$logdir/dockerd.log" 2>&1 &
fi
