# The vLLM container's entrypoint (bash -c), PID 1's only child. Docker restarts this container
# after a crash (with its own backoff) and after a reboot; each start goes through here:
#   vllm-launcher --executor ray|mp --expect-ips IP,IP --gpus N --wait-seconds S --scripts DIR \
#                 --compile-cache DIR --execute-seconds-cold S --execute-seconds-warm S \
#                 [--key-file F] [--rendezvous IP:PORT --peers name=IP,... [--health-url URL]] \
#                 -- <vllm serve arguments>
# 1. Refuse to serve without the API key file: vLLM would start with no authentication. A
#    headless node (executor mp, no --key-file) serves no API and never holds the key.
# 2. vLLM's limit on one step of the model (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS): the cold one
#    when this node's compile cache holds no file (the first requests compile kernels, which
#    vLLM's 300 s cuts short with EngineDeadError), else the warm one. Chosen here, at each
#    start, so the container's environment is the same for both (stacks/plan/arguments.py).
# 3. Back off when the previous start ended soon after it began (a crash loop whose every
#    attempt runs past Docker's 10 s reset, such as a model load that fails late).
# 4. Ray: wait, bounded, until Ray has every configured node and GPU again (after a head restart
#    the workers rejoin on their own), so the server never binds to a partial cluster.
# 5. The ready marker (/var/tmp/spark-vllm-ready, in the container's own filesystem): removed at
#    every attempt, written by a small watcher once the server answers --health-url. The memory
#    guard stops only a server without it (components/scripts/memory_guard.py).
# 6. Read the key into VLLM_API_KEY (never in `docker inspect` or `ps`), then become the server;
#    with executor mp, run it under mp_supervisor.py, which stops it when a node's ranks leave
#    the rendezvous (vLLM does not notice that by itself), so every node restarts together.
set -uo pipefail
say() { printf 'spark-vllm launcher: %s\n' "$*" >&2; }
executor=ray expect_ips="" gpus="" wait_seconds=600 key_file="" scripts=""
rendezvous="" peers="" health_url="" compile_cache="" execute_cold="" execute_warm=""
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    --executor) executor="$2"; shift 2 ;;
    --expect-ips) expect_ips="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --wait-seconds) wait_seconds="$2"; shift 2 ;;
    --key-file) key_file="$2"; shift 2 ;;
    --scripts) scripts="$2"; shift 2 ;;
    --rendezvous) rendezvous="$2"; shift 2 ;;
    --peers) peers="$2"; shift 2 ;;
    --health-url) health_url="$2"; shift 2 ;;
    --compile-cache) compile_cache="$2"; shift 2 ;;
    --execute-seconds-cold) execute_cold="$2"; shift 2 ;;
    --execute-seconds-warm) execute_warm="$2"; shift 2 ;;
    *) say "unknown launcher flag $1"; exit 2 ;;
  esac
done
[ "${1:-}" = -- ] && shift
if [ -z "$scripts" ] || { [ "$executor" = ray ] && [ -z "$key_file" ]; } \
   || { [ "$executor" = mp ] && [ -z "$rendezvous" ]; }; then
  say "--scripts, and --key-file (ray) or --rendezvous (mp), are required (a bug in spark-vllm: please report it)"
  exit 2
fi

if [ -n "$key_file" ] && [ ! -s "$key_file" ]; then
  say "no API key in $key_file: refusing to serve without authentication (run 'pulumi up' to write it again)"
  sleep 5  # with Docker's own backoff: a slow loop until the key is back
  exit 1
fi

if [ -n "$execute_cold" ] && [ -n "$execute_warm" ]; then
  if [ -n "$(find "$compile_cache" -type f -print -quit 2>/dev/null)" ]; then
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="$execute_warm"
    say "compile cache $compile_cache holds a previous start's kernels: vLLM's execute timeout ${execute_warm}s"
  else
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="$execute_cold"
    say "compile cache $compile_cache is empty (a first start compiles its kernels): vLLM's execute timeout ${execute_cold}s"
  fi
  export VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
fi

# The container's own filesystem outlives its restarts: remember when each attempt began.
record="${SPARK_VLLM_LAUNCHER_RECORD:-/var/tmp/spark-vllm-launcher}"  # the tests point it away
now=$(date +%s)
delay=0
if [ -s "$record" ]; then
  read -r last_start last_delay < "$record"
  if [ $(( now - last_start )) -lt 600 ]; then
    delay=$(( last_delay > 0 ? last_delay * 2 : 5 ))
    [ "$delay" -le 300 ] || delay=300
  fi
fi
if [ "$delay" -gt 0 ]; then
  say "the previous start ended after less than 10 minutes: waiting ${delay}s before this one"
  sleep "$delay"
fi
echo "$(date +%s) $delay" > "$record"

ready_marker=/var/tmp/spark-vllm-ready
rm -f "$ready_marker"
if [ -n "$health_url" ]; then
  # Outlives the exec below as the server's sibling; goes with the container.
  python3 -c '
import sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
while True:
    try:
        with opener.open(sys.argv[1], timeout=3) as answer:
            if answer.status == 200:
                open(sys.argv[2], "w").close()
                break
    except OSError:
        pass
    time.sleep(2)
' "$health_url" "$ready_marker" </dev/null >/dev/null 2>&1 &
fi

if [ "$executor" = ray ] && [ -n "$expect_ips" ]; then
  deadline=$(( SECONDS + wait_seconds ))
  last=""
  while :; do
    verdict="$(timeout 60 python3 "$scripts/ray_probe.py" "$expect_ips" "$gpus" observe 2>/dev/null | tail -n 1)" || verdict=""
    case "$verdict" in
      ready*) say "Ray ${verdict}"; break ;;
    esac
    if [ "$verdict" != "$last" ]; then say "waiting for Ray: ${verdict:-no answer from the head}"; last="$verdict"; fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      say "Ray did not gather $gpus GPU(s) on $expect_ips within ${wait_seconds}s: exiting (Docker restarts this container)"
      exit 1
    fi
    sleep 3
  done
fi

if [ -n "$key_file" ]; then
  VLLM_API_KEY="$(cat "$key_file")"
  export VLLM_API_KEY
  # With executor ray, vLLM copies the driver's VLLM_* variables to every Ray worker over Ray's
  # unencrypted channel, except those its config root lists here (vllm/ray/ray_env.py,
  # RAY_NON_CARRY_OVER_ENV_VARS_FILE; the root: vllm/envs.py VLLM_CONFIG_ROOT).
  config_root="${VLLM_CONFIG_ROOT:-${XDG_CONFIG_HOME:-$HOME/.config}/vllm}"
  mkdir -p "$config_root" && python3 - "$config_root/ray_non_carry_over_env_vars.json" <<'PY'
import json, os, sys
path = sys.argv[1]
try:
    names = set(json.load(open(path))) if os.path.exists(path) else set()
except ValueError:
    names = set()
json.dump(sorted(names | {"VLLM_API_KEY"}), open(path, "w"))
PY
fi
if [ "$executor" = mp ]; then
  exec python3 "$scripts/mp_supervisor.py" --rendezvous "$rendezvous" --peers "$peers" \
    --join-seconds "$wait_seconds" ${health_url:+--health-url "$health_url"} -- vllm serve "$@"
fi
exec vllm serve "$@"
