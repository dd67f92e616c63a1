#!/usr/bin/env bash
# On the head: Grafana's admin password, its own secret (never derived from the API key): made
# once from the kernel's random source when the file is missing, private, in a directory only
# Grafana's container mounts; printed on one line for the stack's secret output
# `grafanaAdminPassword` (the step's output is a Pulumi secret and is not logged).
#   grafana-password.sh write|remove --host H --file F
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host file
case "$action" in
  write)
    mkdir -p -m 700 "$(dirname "$ARG_FILE")"
    umask 077
    if ! [ -s "$ARG_FILE" ]; then
      # 32 characters of [A-Za-z0-9_-]: 192 bits.
      python3 -c 'import secrets; print(secrets.token_urlsafe(24))' > "$ARG_FILE.tmp" \
        || fail "could not make Grafana's admin password" "python3 on $ARG_HOST"
      mv "$ARG_FILE.tmp" "$ARG_FILE"
    fi
    printf 'spark-vllm-grafana-password %s\n' "$(cat "$ARG_FILE")"
    ;;
  remove) rm -f "$ARG_FILE" "$ARG_FILE.tmp"; rmdir "$(dirname "$ARG_FILE")" 2>/dev/null || true ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
