"""Another project using a spark-vllm deployment: its endpoint, model and API key arrive through a
StackReference (the key stays a secret), become an OpenAI client configuration on this machine,
and are checked with one real completion. With a key of its own (one of the deployment's `keys`,
set here as the secret `apiKey`) and its `model`, it uses that key instead of the operator's."""

from pathlib import Path

import pulumi
from consumer import client_config, endpoint_check

config = pulumi.Config()
vllm = pulumi.StackReference(config.require("vllmStack"))
endpoint = vllm.require_output("endpointUrl")
# This project's own key and model when it has one (`keys` in the deployment: counted and
# limited apart, revoked without touching the others); else the operator's and the first model.
own_key = config.get_secret("apiKey") if config.get("apiKey") else None
if own_key is not None and not pulumi.runtime.is_config_secret(f"{pulumi.get_project()}:apiKey"):
    raise pulumi.RunError("apiKey: is stored in plain text; set it with --secret")
own_model = config.get("model")
model = own_model if own_model else vllm.require_output("modelId")
api_key = own_key if own_key is not None else vllm.require_output("apiKey")  # a secret

# With `front.tls` the deployment publishes the certificate its front serves: trusted for it.
certificate = vllm.get_output("frontCertificate")

# Absolute (the program runs in this project's directory), so the delete finds it from anywhere.
config_path = Path(config.get("clientConfigPath") or "openai.env").resolve()
written = client_config("openai-config", config_path, endpoint, model, api_key, certificate)
if config.get_bool("checkEndpoint") is not False:
    endpoint_check("endpoint-check", endpoint, model, api_key, written, config_path, certificate)

pulumi.export("openaiBaseUrl", endpoint)
pulumi.export("model", model)
# Every model the endpoint serves (`models`: served name, id, nodes, measured speed); empty from a
# deployment made before that output existed.
pulumi.export(
    "models",
    vllm.get_output("models").apply(lambda models: [m["servedName"] for m in models or []]),
)
