# The vLLM container's entrypoint (bash -c): read the API key from the mounted file into
# VLLM_API_KEY, so it never appears in `docker inspect` or `ps`, then become `vllm serve`.
if [ -s /run/spark-vllm/api-key ]; then
  VLLM_API_KEY="$(cat /run/spark-vllm/api-key)"
  export VLLM_API_KEY
fi
exec vllm serve "$@"
