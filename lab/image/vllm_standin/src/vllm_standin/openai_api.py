"""OpenAI-compatible request handling, as pure functions of (request body, served model).

Text is deterministic: the first token names the ranks' node IPs (so a lab test can see which
nodes served), the rest are words chosen by hashing the model, the prompt and those IPs.
Token counts are whitespace-separated words; good enough for `usage` and context-length checks.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TOKENS = 16
WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliett",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
)


class ApiError(Exception):
    """An error response in vLLM's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, error_type: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = {
            "error": {"message": message, "type": error_type, "param": param, "code": status}
        }


@dataclass(frozen=True)
class ServedModel:
    model: str
    served_names: tuple[str, ...]
    max_model_len: int
    rank_ips: tuple[str, ...]
    created: int


def models_response(served: ServedModel) -> dict[str, Any]:
    data: list[dict[str, Any]] = [
        {
            "id": name,
            "object": "model",
            "created": served.created,
            "owned_by": "vllm",
            "root": served.model,
            "parent": None,
            "max_model_len": served.max_model_len,
            "permission": [],
        }
        for name in served.served_names
    ]
    return {"object": "list", "data": data}


def resolve_model_name(body: dict[str, Any], served: ServedModel) -> str:
    """vLLM accepts a missing `model` (first served name) and 404s an unknown one."""
    requested = body.get("model")
    if not requested:
        return served.served_names[0]
    if requested not in served.served_names:
        # vLLM 0.32 names the served aliases (the front's own 404 names none: front.py).
        aliases = ", ".join(served.served_names)
        message = f"The model `{requested}` does not exist. Valid aliases: {aliases}."
        raise ApiError(404, message, "NotFoundError", "model")
    return str(requested)


def count_tokens(text: str) -> int:
    return max(1, len(text.split()))


def completion_prompts(body: dict[str, Any]) -> list[tuple[str, int]]:
    """(prompt text, prompt tokens) per choice; accepts str, [str], [int] and [[int]]."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [(prompt, count_tokens(prompt))]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, str) for item in prompt):
            return [(item, count_tokens(item)) for item in prompt]
        if all(isinstance(item, int) for item in prompt):
            return [(" ".join(map(str, prompt)), len(prompt))]
        if all(isinstance(item, list) for item in prompt):
            return [(" ".join(map(str, item)), max(1, len(item))) for item in prompt]
    raise ApiError(
        400,
        "`prompt` must be a string or a list of strings or token ids.",
        "BadRequestError",
        "prompt",
    )


def chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "`messages` must be a non-empty list.", "BadRequestError", "messages")
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            raise ApiError(400, "each message must be an object", "BadRequestError", "messages")
        content = message.get("content") or ""
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict)
            )
        parts.append(f"{message.get('role', 'user')}: {content}")
    text = "\n".join(parts)
    return text, count_tokens(text)


def requested_max_tokens(body: dict[str, Any], *keys: str) -> int:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ApiError(400, f"`{key}` must be a positive integer.", "BadRequestError", key)
        return value
    return DEFAULT_MAX_TOKENS


def allowed_max_tokens(prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """What vLLM 0.32 generates for a request: `max_tokens` above max_model_len and a prompt
    that fills the context alone are refused (its messages, `param` naming the parameter); a
    prompt and `max_tokens` that together overflow it are cut to fit, not refused."""
    if max_tokens > max_model_len:
        raise ApiError(
            400,
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            "BadRequestError",
            "max_tokens",
        )
    if prompt_tokens >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains at least {prompt_tokens} input tokens, which exceeds this limit "
            "even without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_tokens})",
            "BadRequestError",
            "input_tokens",
        )
    return min(max_tokens, max_model_len - prompt_tokens)


def generate_tokens(served: ServedModel, prompt: str, max_tokens: int) -> list[str]:
    tokens = ["ranks=" + ",".join(served.rank_ips)]
    seed = "\0".join((served.model, prompt, *served.rank_ips)).encode()
    counter = 0
    while len(tokens) < max_tokens:
        digest = hashlib.sha256(seed + counter.to_bytes(8, "big")).digest()
        tokens.extend(WORDS[byte % len(WORDS)] for byte in digest)
        counter += 1
    return tokens[:max_tokens]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class PlannedResponse:
    """A validated request: either a JSON body or a stream of SSE events."""

    body: dict[str, Any] | None = None
    events: Iterator[str] | None = None
    # For the metrics (metrics.py): what was asked and how many tokens it generates.
    prompt: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0


def plan_completion(body: dict[str, Any], served: ServedModel) -> PlannedResponse:
    model_name = resolve_model_name(body, served)
    max_tokens = requested_max_tokens(body, "max_tokens")
    prompts = completion_prompts(body)
    max_tokens = min(
        allowed_max_tokens(prompt_tokens, max_tokens, served.max_model_len)
        for _, prompt_tokens in prompts
    )
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    texts = [generate_tokens(served, prompt, max_tokens) for prompt, _ in prompts]
    total_prompt_tokens = sum(tokens for _, tokens in prompts)
    total_usage = usage(total_prompt_tokens, max_tokens * len(prompts))
    header = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model_name,
    }
    measured = {
        "prompt": "\n".join(prompt for prompt, _ in prompts),
        "prompt_tokens": total_prompt_tokens,
        "completion_tokens": total_usage["completion_tokens"],
    }
    if body.get("stream"):
        events = stream_completion(header, texts, total_usage, body)
        return PlannedResponse(events=events, **measured)
    choices = [
        {
            "index": index,
            "text": " ".join(tokens),
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        for index, tokens in enumerate(texts)
    ]
    return PlannedResponse(body={**header, "choices": choices, "usage": total_usage}, **measured)


def plan_chat_completion(body: dict[str, Any], served: ServedModel) -> PlannedResponse:
    model_name = resolve_model_name(body, served)
    max_tokens = requested_max_tokens(body, "max_completion_tokens", "max_tokens")
    prompt, prompt_tokens = chat_prompt(body)
    max_tokens = allowed_max_tokens(prompt_tokens, max_tokens, served.max_model_len)
    tokens = generate_tokens(served, prompt, max_tokens)
    header = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
    }
    total_usage = usage(prompt_tokens, max_tokens)
    measured = {"prompt": prompt, "prompt_tokens": prompt_tokens, "completion_tokens": max_tokens}
    if body.get("stream"):
        return PlannedResponse(events=stream_chat(header, tokens, total_usage, body), **measured)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": " ".join(tokens),
        "reasoning_content": None,
        "tool_calls": [],
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }
    return PlannedResponse(body={**header, "choices": [choice], "usage": total_usage}, **measured)


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"


def wants_usage_chunk(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def stream_completion(
    header: dict[str, Any],
    texts: list[list[str]],
    total_usage: dict[str, int],
    body: dict[str, Any],
) -> Iterator[str]:
    for index, tokens in enumerate(texts):
        for position, token in enumerate(tokens):
            last = position == len(tokens) - 1
            choice = {
                "index": index,
                "text": token if position == 0 else " " + token,
                "logprobs": None,
                "finish_reason": "length" if last else None,
            }
            yield sse({**header, "choices": [choice]})
    if wants_usage_chunk(body):
        yield sse({**header, "choices": [], "usage": total_usage})
    yield sse("[DONE]")


def stream_chat(
    header: dict[str, Any], tokens: list[str], total_usage: dict[str, int], body: dict[str, Any]
) -> Iterator[str]:
    chunk_header = {**header, "object": "chat.completion.chunk"}
    role_choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    yield sse({**chunk_header, "choices": [role_choice]})
    for position, token in enumerate(tokens):
        last = position == len(tokens) - 1
        choice = {
            "index": 0,
            "delta": {"content": token if position == 0 else " " + token},
            "logprobs": None,
            "finish_reason": "length" if last else None,
        }
        yield sse({**chunk_header, "choices": [choice]})
    if wants_usage_chunk(body):
        yield sse({**chunk_header, "choices": [], "usage": total_usage})
    yield sse("[DONE]")


def plan_invocation(body: dict[str, Any], served: ServedModel) -> PlannedResponse:
    """vLLM's /invocations: a chat completion when the body has `messages`, else a completion."""
    if "messages" in body:
        return plan_chat_completion(body, served)
    return plan_completion(body, served)


def plan_tokenize(body: dict[str, Any], served: ServedModel) -> PlannedResponse:
    """vLLM's /tokenize: the prompt's tokens (the stand-in's are word numbers)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string", "BadRequestError")
    tokens = [sum(map(ord, word)) % 50_000 for word in prompt.split()]
    return PlannedResponse(
        body={"count": len(tokens), "max_model_len": served.max_model_len, "tokens": tokens}
    )
