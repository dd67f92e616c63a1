#!/bin/bash
# Fetches Debian 13's Docker 26 engine (docker.io, docker-cli, containerd) into DIR, for lab
# hosts that run today's Docker on this Debian 12 machine (../shared/LAB-NOTES.md, last section).
#   fetch-engine.sh DIR
# Nothing is installed: apt-get downloads the packages with its own source list and lists
# (trixie's release is signed by a key in Debian 12's debian-archive-keyring), and dpkg -x
# unpacks each into DIR. Debian 13's runc needs GLIBC_2.38: hosts keep Debian 12's /usr/sbin/runc.
# Idempotent: DIR/.complete marks a finished fetch.
set -euo pipefail

dir=$1
packages=(docker.io docker-cli containerd)
[[ -e $dir/.complete ]] && exit 0

work="$dir.partial"
rm -rf "$work"
mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/debs" "$work/root"
# The machine's own Debian mirror, suite trixie.
mirror=$( (sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources; sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?//p' /etc/apt/sources.list) 2>/dev/null \
    | awk '{print $1}' | grep -E '/debian/?$' | head -n 1 || true)
echo "deb ${mirror:-http://deb.debian.org/debian} trixie main" >"$work/sources.list"
apt_opts=(
    -q
    -o "Dir::Etc::SourceList=$work/sources.list"
    -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists"
    -o "Dir::Cache::archives=$work/archives"
    -o APT::Sandbox::User=root
)
apt-get "${apt_opts[@]}" update >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; exit 1; }
(cd "$work/debs" && apt-get "${apt_opts[@]}" download "${packages[@]}") >>"$work/apt.log" 2>&1 \
    || { cat "$work/apt.log" >&2; exit 1; }
for deb in "$work"/debs/*.deb; do
    dpkg -x "$deb" "$work/root"
done
for tool in usr/sbin/dockerd usr/bin/docker usr/bin/containerd usr/bin/containerd-shim-runc-v2; do
    [[ -x $work/root/$tool ]] || { echo "fetch-engine.sh: $tool missing after unpacking" >&2; exit 1; }
done
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
mv "$work/root" "$dir"
ls "$work"/debs >"$dir/.packages"
rm -rf "$work"
touch "$dir/.complete"
