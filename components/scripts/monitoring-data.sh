#!/usr/bin/env bash
# Prometheus's data directory on the head (monitoring.enabled), bound into its container.
#   monitoring-data.sh report --host H --dir D
#   monitoring-data.sh remove --host H --dir D --image IMAGE
# Prometheus writes as root (its container's user: what it reads is the deploying user's, in
# a directory of mode 700): `remove` empties the directory from the serving image as root where
# this user cannot (lib.sh empty), then removes it. The directory is this deployment's (the
# caller checks the leaf's owner).
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host dir

case "$action" in
  report)
    mkdir -p "$ARG_DIR"
    echo "prometheus data: $(du -sh "$ARG_DIR" 2>/dev/null | cut -f1) in $ARG_DIR"
    ;;
  remove)
    require image
    [ -d "$ARG_DIR" ] || exit 0
    empty "$ARG_DIR"
    rmdir "$ARG_DIR"
    echo "prometheus data removed from $ARG_DIR"
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
