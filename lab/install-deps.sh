#!/bin/bash
# Installs the Debian packages the lab (lab/, `python -m lab up`) needs. Idempotent: does nothing
# when everything is already installed; otherwise one `apt-get update` and one install.
# Run as root on Debian 12 (bookworm). CI calls it on a fresh machine.
set -euo pipefail

packages=(
    docker.io        # dockerd, containerd, runc, docker CLI: one daemon per simulated host
    openssh-server   # one sshd per simulated host and the bastion
    openssh-client   # ssh, ssh-keygen (client key, host keys, probes)
    iproute2         # ip netns/link/route, tc (optional fabric shaping)
    util-linux       # nsenter, unshare
    tini             # PID 1 of every simulated host
    busybox-static   # small static tools for throwaway test images
    zstd             # image transfer tests (compressed docker save)
    curl             # probes, and copied into the lab image
    procps           # ps/pkill in hosts and in the lab image
    python3          # Debian's /usr/bin/python3 (3.11): the lab image's Python
    g++ python3.11-dev  # in the real-vLLM lab image: torch.compile's C++ kernels (lab/image.py)
    ca-certificates  # copied into the lab image
    haproxy          # the front (HAProxy, as the official image users pull), in the lab image
    iptables         # the firewall guard runs the host's iptables and ip6tables
    openssl          # the front's table handover key pair, made on the head (front-keys-file.sh)
    docker-registry  # a registry on a host's loopback: repo digests for the pinned-ref tests
    prometheus       # scrapes the vLLM stand-in: the dashboards' queries are checked against it
    prometheus-node-exporter  # node_exporter, in the lab's monitoring image (the official one: no registry)
    tar gzip findutils coreutils bash dash debianutils grep sed
)

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [[ $status == installed ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
    echo "lab deps: all ${#packages[@]} packages already installed"
    exit 0
fi

echo "lab deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
