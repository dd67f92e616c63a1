#!/usr/bin/env bash
# On the server's node, once it is ready (vllm.benchmark): vLLM's own load generator (`vllm bench
# serve`, in the serving image) inside the server's container against vLLM's port, one
# concurrency after another. The key reaches it as OPENAI_API_KEY from the mounted key file, in
# the container only, and never through a proxy (its client, aiohttp with trust_env, would use
# one the image or vllm.env names: the proxy variables are unset for it). Prints one `benchmark: {json}` line per concurrency (bench_summary.py).
#   vllm-bench.sh --host H --container C --key-file F --port P --served-name N --model ID --revision R
#     --concurrencies 1,4 --input-tokens I --output-tokens O --requests-per-stream K
#     --timeout-seconds S --trust-remote-code yes|no --tokenizer-mode MODE_OR_EMPTY
#     [--server-host IP]   (where vLLM listens: the head's loopback, or a worker's fabric IP)
. "$(dirname "$0")/lib.sh"
parse_flags "$@"
require host container key-file port served-name model revision concurrencies input-tokens \
  output-tokens requests-per-stream timeout-seconds trust-remote-code tokenizer-mode
here="$(dirname "$0")"
tokenizer_flags=()  # the tokenizer loads as the server's does
[ "$ARG_TRUST_REMOTE_CODE" != yes ] || tokenizer_flags+=(--trust-remote-code)
[ -z "$ARG_TOKENIZER_MODE" ] || tokenizer_flags+=(--tokenizer-mode "$ARG_TOKENIZER_MODE")
deadline=$(( SECONDS + ARG_TIMEOUT_SECONDS ))
# The tokenizer: the snapshot the server loaded (vLLM's tool has no --revision flag).
find_snapshot='import sys; from huggingface_hub import snapshot_download as s; print(s(sys.argv[1], revision=sys.argv[2], local_files_only=True))'
errors="$(mktemp)"
trap 'rm -f "$errors"' EXIT
tokenizer="$(timeout 120 docker exec "$ARG_CONTAINER" python3 -c "$find_snapshot" "$ARG_MODEL" "$ARG_REVISION" 2>"$errors")" \
  || fail "the model's snapshot is not in the server's cache: $(tail -n 1 "$errors")" \
    "the weights were removed after the server started; run 'pulumi up'"
tokenizer="${tokenizer##*$'\n'}"  # its last line: the path (anything printed before is not)
results=/tmp/spark-vllm-bench
IFS=, read -r -a concurrencies <<<"$ARG_CONCURRENCIES"
for concurrency in "${concurrencies[@]}"; do
  left=$(( deadline - SECONDS ))
  [ "$left" -gt 0 ] || fail "vllm.benchmark took longer than ${ARG_TIMEOUT_SECONDS}s before concurrency $concurrency" \
    "fewer concurrencies or requestsPerStream, or a longer vllm.benchmark.timeoutMinutes"
  prompts=$(( concurrency * ARG_REQUESTS_PER_STREAM ))
  # The time limit inside the container: a client killed here would leave the load running.
  if ! out="$(timeout $(( left + 30 )) docker exec "$ARG_CONTAINER" timeout -k 10 "$left" sh -c \
      'key="$1"; shift; unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY
       OPENAI_API_KEY="$(cat "$key")" exec vllm bench serve "$@"' sh "$ARG_KEY_FILE" \
      --backend openai --base-url "http://${ARG_SERVER_HOST:-127.0.0.1}:$ARG_PORT" --endpoint /v1/completions \
      --model "$ARG_SERVED_NAME" --tokenizer "$tokenizer" "${tokenizer_flags[@]}" \
      --dataset-name random \
      --random-input-len "$ARG_INPUT_TOKENS" --random-output-len "$ARG_OUTPUT_TOKENS" \
      --ignore-eos --num-prompts "$prompts" --max-concurrency "$concurrency" \
      --request-rate inf --temperature 0 --seed 0 --percentile-metrics ttft,tpot,itl,e2el \
      --metric-percentiles 50,90,99 --disable-tqdm --ready-check-timeout-sec 60 \
      --save-result --result-dir "$results" --result-filename "c$concurrency.json" 2>&1)"; then
    fail "vllm bench serve failed at concurrency $concurrency: $(printf '%s' "$out" | tail -n 3 | tr '\n' ' ')" \
      "the server stopped answering, or the image's vLLM has no 'bench serve' (vLLM 0.11 on)"
  fi
  timeout 60 docker exec "$ARG_CONTAINER" sh -c 'cat "$1" && rm -f "$1"' sh "$results/c$concurrency.json" \
    | python3 "$here/bench_summary.py" "$concurrency" "$prompts" \
    || fail "vllm bench serve at concurrency $concurrency: see above" \
      "the server refused or dropped requests under load (its log: docker logs $ARG_CONTAINER)"
done
