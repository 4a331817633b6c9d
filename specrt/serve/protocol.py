"""The OpenAI wire format: request bodies checked into a :class:`GenerationRequest`, results and stream chunks
built back into OpenAI's JSON. Pure functions over dicts: no web framework, no generator.

Parameters OpenAI defines and specrt cannot honour (``n > 1``, ``logprobs``, penalties, ``tools``, ...) are
refused with a 400 that names them, never silently ignored: a client relying on one would get wrong output.
"""

from __future__ import annotations

import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

MAX_STOP = 4  # OpenAI's limit on stop sequences
COMPLETION_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions; chat defaults to the context left
FINISH = {"length": "length", "eos": "stop", "stop": "stop"}  # GenerationResult.finish_reason -> OpenAI's


class ApiError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class GenerationRequest:
    """One checked request: exactly one of ``prompt`` / ``messages``; the sampling settings of
    :meth:`SpeculativeGenerator.stream` under OpenAI's names."""

    prompt: str | None
    messages: tuple[dict[str, str], ...] | None
    max_tokens: int | None  # None: all the context the prompt leaves
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


# --- checking request bodies ----------------------------------------------------------------------------------

def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    # JSON true/false arrive as bool, which Python counts as int: refuse them explicitly.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(name, f"{name} must be a number, got {value!r}")
    if value < lo or value > hi or (lo_open and value == lo):
        raise invalid(name, f"{name} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # some clients serialise every number as a float
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise invalid(name, f"{name} must be an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")
                      + f", got {value}")
    return value


def _text(param: str, value: str) -> str:
    """``value``, unless it holds a lone surrogate: JSON's ``"\\ud800"`` escape decodes to one, and no tokenizer
    (nor UTF-8) can encode it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise invalid(param, f"{param} holds a lone surrogate (\\u{ord(value[e.start]):04x}): not text") from None
    return value


def _unsupported(body: Mapping[str, Any], allowed: Mapping[str, Sequence[Any]]) -> None:
    """Refuse parameters whose value specrt cannot honour; their neutral values (and absence) pass."""
    for name, neutral in allowed.items():
        if name in body and body[name] not in neutral:
            raise invalid(name, f"{name}={body[name]!r} is not supported by specrt (batch size 1, no logprobs, "
                                "no penalties)", code="unsupported_parameter")


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", "stop must be a string or a list of strings")
    if len(stops) > MAX_STOP:
        raise invalid("stop", f"stop takes at most {MAX_STOP} sequences, got {len(stops)}")
    return tuple(_text("stop", s) for s in stops if s)


def _common(body: Any, model: str, max_tokens_default: int | None) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object")
    name = body.get("model")
    if not isinstance(name, str):
        raise invalid("model", "model is required: the id GET /v1/models lists")
    if name != model:
        raise ApiError(404, f"the model {name!r} does not exist; this server serves {model!r}", param="model",
                       code="model_not_found")
    _unsupported(body, {"n": (1, None), "best_of": (1, None), "echo": (False, None), "logprobs": (None, False),
                        "top_logprobs": (None, 0), "presence_penalty": (0, None), "frequency_penalty": (0, None),
                        "logit_bias": (None, {}), "suffix": (None, ""), "tools": (None, []),
                        "functions": (None, []), "tool_choice": (None, "none"),
                        "response_format": (None, {"type": "text"})})
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid("stream", "stream must be true or false")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise invalid("stream_options", "stream_options is an object, and only with stream: true")
    include_usage = bool((options or {}).get("include_usage", False))
    seed = _integer(body, "seed", None, 0, 2**63 - 1)
    return dict(
        max_tokens=_integer(body, "max_tokens", max_tokens_default, 1),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=_integer(body, "top_k", 0, 0),  # not OpenAI's, but vLLM's and llama.cpp's: clients send it in extra_body
        # No seed: a fresh one, so unseeded sampling differs between requests as OpenAI's does.
        seed=secrets.randbits(63) if seed is None else seed,
        stop=_stop(body), stream=stream, include_usage=include_usage)


def parse_completion(body: Any, model: str) -> GenerationRequest:
    """A ``POST /v1/completions`` body → a request, or :class:`ApiError` 400/404 naming the bad parameter."""
    common = _common(body, model, COMPLETION_MAX_TOKENS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid("prompt", "prompt must be one string (token arrays and batches of prompts are not supported)")
    return GenerationRequest(prompt=_text("prompt", prompt), messages=None, **common)


def _content(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    # The content-parts form ([{"type": "text", "text": ...}, ...]) that newer clients send for text too.
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise invalid(f"messages[{i}].content", f"messages[{i}].content must be a string or a list of text parts")


def parse_chat(body: Any, model: str) -> GenerationRequest:
    """A ``POST /v1/chat/completions`` body → a request; ``max_tokens`` defaults to the context left."""
    common = _common(body, model, None)
    if body.get("max_completion_tokens") is not None:  # OpenAI's newer name for the same limit
        common["max_tokens"] = _integer(body, "max_completion_tokens", None, 1)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "messages must be a non-empty list of {role, content} objects")
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise invalid(f"messages[{i}]", f"messages[{i}] must be an object with a string role")
        checked.append({"role": _text(f"messages[{i}].role", m["role"]),
                        "content": _text(f"messages[{i}].content", _content(i, m.get("content")))})
    return GenerationRequest(prompt=None, messages=tuple(checked), **common)


# --- building responses ----------------------------------------------------------------------------------------

def new_id(req: GenerationRequest) -> str:
    return ("chatcmpl-" if req.is_chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens``: prompt tokens whose K/V the last request left (--reuse-prefix)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def extension(stats: Any, replica: str | None = None) -> dict[str, Any]:
    """The ``specrt`` object every final response carries: what speculation did for this request, and which
    replica did it."""
    return {"replica": replica, "method": stats.method, "drafted": stats.drafted, "accepted": stats.accepted,
            "acceptance_rate": stats.acceptance_rate, "alpha": stats.alpha_estimate,
            "target_passes": stats.target_passes, "tokens_per_target_pass": stats.tokens_per_target_pass,
            "tokens_per_second": stats.tokens_per_second}


def response(req: GenerationRequest, rid: str, model: str, result: Any, prompt_tokens: int,
             replica: str | None = None) -> dict[str, Any]:
    """The non-streaming body of a finished generation (``result``: a ``GenerationResult``)."""
    finish = FINISH[result.finish_reason]
    if req.is_chat:
        obj, choice = "chat.completion", {"index": 0, "message": {"role": "assistant", "content": result.text},
                                          "logprobs": None, "finish_reason": finish}
    else:
        obj, choice = "text_completion", {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": obj, "created": req.created, "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, len(result.token_ids), result.stats.reused_tokens),
            "specrt": extension(result.stats, replica)}


def chunk(req: GenerationRequest, rid: str, model: str, text: str | None = None, *, first: bool = False,
          finish: str | None = None) -> dict[str, Any]:
    """One streamed chunk: ``text`` for a piece, ``first`` for the chat role header, ``finish`` for the last."""
    if req.is_chat:
        delta: dict[str, str] = {"role": "assistant", "content": ""} if first else {}
        if text is not None:
            delta["content"] = text
        obj, choice = "chat.completion.chunk", {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        obj, choice = "text_completion", {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": obj, "created": req.created, "model": model, "choices": [choice]}
