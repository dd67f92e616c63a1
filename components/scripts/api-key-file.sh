#!/usr/bin/env bash
# On the head: keep the API key in a private file that the vLLM container mounts read-only, so it
# is never on a command line or in the container's configuration. The key arrives on stdin.
# Beside it, `bearer`: the one Authorization header the front admits (its pattern file).
# With --grafana yes (the head's), `grafana-admin` too: Grafana's admin password, derived from the
# key one way (a password of its own that tells nothing of the key, and changes with it).
#   api-key-file.sh write|remove --host H --file F [--grafana yes]
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host file
case "$action" in
  write)
    mkdir -p -m 700 "$(dirname "$ARG_FILE")"
    umask 077
    IFS= read -r key || true
    bearer="$(dirname "$ARG_FILE")/bearer"
    printf '%s' "$key" > "$ARG_FILE.tmp"
    printf 'Bearer %s\n' "$key" > "$bearer.tmp"
    mv "$ARG_FILE.tmp" "$ARG_FILE"
    mv "$bearer.tmp" "$bearer"
    if [ "${ARG_GRAFANA:-}" = yes ]; then
      grafana="$(dirname "$ARG_FILE")/grafana-admin"
      printf 'spark-vllm grafana admin\n%s' "$key" | sha256sum | cut -c1-32 > "$grafana.tmp"
      mv "$grafana.tmp" "$grafana"
    fi
    if [ -n "$key" ]; then echo "API key file written"; else echo "no API key configured: the endpoint is open"; fi
    ;;
  remove) rm -f "$ARG_FILE" "$(dirname "$ARG_FILE")/bearer" "$(dirname "$ARG_FILE")/grafana-admin"; rmdir "$(dirname "$ARG_FILE")" 2>/dev/null || true ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
