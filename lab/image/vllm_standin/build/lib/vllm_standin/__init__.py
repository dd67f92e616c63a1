"""vllm-standin: the spark-vllm lab's TEST DOUBLE for vLLM (not vLLM).

It accepts vLLM's `serve` command line, joins the Ray cluster the way vLLM's Ray executor does,
checks on every rank what a real worker would need (model snapshot on that node, Gloo interface)
and serves an OpenAI-compatible API with deterministic text, so that everything around vLLM in
the lab runs for real.
"""

VERSION = "0.0.0+spark-vllm-lab-standin"
BANNER = "vllm-standin (spark-vllm lab test double, not vLLM)"
