"""Another project using a spark-vllm deployment: its endpoint, model and API key arrive through a
StackReference (the key stays a secret), become an OpenAI client configuration on this machine,
and are checked with one real completion."""

from pathlib import Path

import pulumi
from consumer import client_config, endpoint_check

config = pulumi.Config()
vllm = pulumi.StackReference(config.require("vllmStack"))
endpoint = vllm.require_output("endpointUrl")
model = vllm.require_output("modelId")
api_key = vllm.require_output("apiKey")  # a secret there, a secret here

# Absolute (the program runs in this project's directory), so the delete finds it from anywhere.
config_path = Path(config.get("clientConfigPath") or "openai.env").resolve()
written = client_config("openai-config", config_path, endpoint, model, api_key)
if config.get_bool("checkEndpoint") is not False:
    endpoint_check("endpoint-check", endpoint, model, api_key, after=written)

pulumi.export("openaiBaseUrl", endpoint)
pulumi.export("model", model)
# Every model the endpoint serves (`models`: served name, id, nodes, measured speed); empty from a
# deployment made before that output existed.
pulumi.export(
    "models",
    vllm.get_output("models").apply(lambda models: [m["servedName"] for m in models or []]),
)
