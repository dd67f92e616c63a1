"""spark-vllm: one `pulumi up` from SSH-reachable GPU hosts to a tensor-parallel vLLM endpoint."""

import pulumi

from composition.deployment import build_deployment
from stacks.settings import load_settings

deployment = build_deployment(load_settings())
for name, value in deployment.outputs().items():
    pulumi.export(name, value)
