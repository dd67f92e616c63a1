#!/bin/bash
# First process of a simulated host (bastion or Spark).
#
# Started by lab/hosts.py as
#   nsenter --net=/run/netns/<ns> -- unshare --mount --uts --ipc --pid --fork ... host-init.sh NAME HOSTDIR SHM
# so it runs as PID 1 of a fresh PID namespace, inside the host's network namespace, with a
# private copy of the machine's mounts. It makes that copy look like a separate machine, tells the
# lab it is ready, then idles under tini (which reaps orphaned daemons). Killing it ends the host.
set -euo pipefail

name=$1      # hostname, e.g. spark1
hostdir=$2   # <state dir>/hosts/<name>: this host's private files
shm_size=$3  # size of /dev/shm, e.g. 1g
engine_dir=${4:-}  # Docker 26's unpacked binaries (lab/engines.py); empty: the machine's Docker

hostname "$name"

# Nothing mounted here may leak back to the machine (or to other hosts).
mount --make-rprivate /

# A /proc that shows this host's PID namespace only.
mount -t proc proc /proc

# /sys must be remounted so /sys/class/net lists this network namespace's interfaces. Remounting
# drops the cgroup-v1 tree mounted below /sys/fs/cgroup (dockerd then fails with "Devices cgroup
# isn't mounted"), so stash the tree with an rbind first and move it back afterwards.
cgstash="$hostdir/mnt/cgroup"
mkdir -p "$cgstash"
mount --rbind /sys/fs/cgroup "$cgstash"
umount -l /sys
mount -t sysfs sysfs /sys
mount --move "$cgstash" /sys/fs/cgroup

# Private /run: docker socket, pid files, containerd and sshd state are per host.
mount -t tmpfs -o mode=0755,size=256m tmpfs /run
mkdir -p /run/sshd /run/lock
chmod 0755 /run/sshd

# A sized /dev/shm, like a real host's (Ray's object store lives there).
mount -t tmpfs -o "mode=1777,size=$shm_size" shm /dev/shm

# The host's own home, hosts file, docker and ssh config, and /tmp.
mount --bind "$hostdir/root" /root
mount --bind "$hostdir/etc/hosts" /etc/hosts
mount --bind "$hostdir/etc/hostname" /etc/hostname
mkdir -p /etc/docker
mount --bind "$hostdir/etc/docker" /etc/docker
mount --bind "$hostdir/etc/ssh" /etc/ssh  # its own host key, where sshd keeps it
mount --bind "$hostdir/tmp" /tmp

# A host on Docker 26 has its CLI too, wherever the machine keeps a docker CLI.
if [[ -n $engine_dir ]]; then
    for cli in /usr/bin/docker /usr/local/bin/docker; do
        [[ -e $cli ]] && mount --bind "$engine_dir/usr/bin/docker" "$cli"
    done
fi

# The lab waits for this file (outside the private mounts, so the machine sees it).
echo $$ > "$hostdir/init.ready"

exec tini -s -- sleep infinity
