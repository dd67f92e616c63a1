#!/usr/bin/env bash
# Keep the API key in a private file that the server's container mounts read-only (alone in its
# directory), so it is never on a command line or in the container's configuration. The key
# arrives on stdin.
# With --bearer B (the head's), B: the one Authorization header the front admits (its pattern
# file), in the front's own secrets directory, which no other container mounts.
#   api-key-file.sh write|remove --host H --file F [--bearer B]
. "$(dirname "$0")/lib.sh"
action="$1"; shift
parse_flags "$@"
require host file
case "$action" in
  write)
    mkdir -p -m 700 "$(dirname "$ARG_FILE")"
    umask 077
    IFS= read -r key || true
    printf '%s' "$key" > "$ARG_FILE.tmp"
    mv "$ARG_FILE.tmp" "$ARG_FILE"
    # What earlier versions kept beside the key, in the directory the server's container
    # mounts: the front's files, now in its own (--bearer, front-keys-file.sh), and Grafana's
    # password derived from the key, now its own secret (grafana-password.sh).
    rm -f "$(dirname "$ARG_FILE")/bearer" "$(dirname "$ARG_FILE")/keys.map" \
      "$(dirname "$ARG_FILE")/upstream.map" "$(dirname "$ARG_FILE")/grafana-admin"
    if [ -n "${ARG_BEARER:-}" ]; then
      mkdir -p -m 700 "$(dirname "$ARG_BEARER")"
      printf 'Bearer %s\n' "$key" > "$ARG_BEARER.tmp"
      mv "$ARG_BEARER.tmp" "$ARG_BEARER"
    fi
    if [ -n "$key" ]; then echo "API key file written"; else echo "no API key configured: the endpoint is open"; fi
    ;;
  remove)
    rm -f "$ARG_FILE" "$(dirname "$ARG_FILE")/bearer" "$(dirname "$ARG_FILE")/grafana-admin"
    rmdir "$(dirname "$ARG_FILE")" 2>/dev/null || true
    if [ -n "${ARG_BEARER:-}" ]; then
      rm -f "$ARG_BEARER"; rmdir "$(dirname "$ARG_BEARER")" 2>/dev/null || true
    fi
    ;;
  *) fail "unknown action '$action'" "a bug in spark-vllm: please report it" ;;
esac
