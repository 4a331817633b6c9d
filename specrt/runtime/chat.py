"""Chat templates: a conversation → the prompt text an instruct model was trained on.

A Hugging Face chat template is a Jinja2 program shipped with the tokenizer. This module renders it
the way transformers' ``apply_chat_template(..., tokenize=False)`` does (same sandbox, options,
filters, globals and variables; see ``transformers/utils/chat_template_utils.py``), with jinja2 alone:
the runtime never imports transformers. Templates come from model repos, i.e. they are untrusted
code; they run in Jinja's immutable sandbox, within a time, output and memory budget (:mod:`.chat_limits`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ChatTemplateError, ConfigError
from .chat_limits import (
    LimitExceeded,
    RenderLimits,
    check_arguments,
    check_binop,
    check_format,
    check_size,
    guarded,
    time_and_memory,
)

Message = Mapping[str, Any]


class _TemplateRaised(jinja2.TemplateError):
    """What a template's ``raise_exception(message)`` throws: its message is meant for the user."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters (<, >, &, '); transformers replaces it with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """The ``dict`` global: builds plain dicts without handing the template the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore attributes (a path towards CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: namespace(self=...) works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` marks assistant text for training masks; rendering
    keeps the body unchanged (transformers' AssistantTracker does the same when not tracking)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _Nesting(threading.local):
    """How deep the calls on this thread are nested: a server renders one template on several threads."""

    depth = 0


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every call, filter and size-making operator checked against :class:`RenderLimits` before
    it runs (see chat_limits: one C call can build gigabytes before any line-level check sees it)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, limits: RenderLimits, **options: Any) -> None:
        super().__init__(**options)
        self.limits = limits
        self._nesting = _Nesting()

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        check_binop(operator, left, right, self.limits)
        return check_size(super().call_binop(context, operator, left, right), self.limits)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's names)
        check_arguments(args, kwargs, __self.limits)
        depth = __self._nesting.depth
        if depth >= __self.limits.max_depth:
            raise LimitExceeded(f"it nested calls more than {__self.limits.max_depth} deep (a macro calling itself?)")
        __self._nesting.depth = depth + 1
        try:
            return check_size(super().call(__context, __obj, *args, **kwargs), __self.limits)
        finally:
            __self._nesting.depth = depth

    def wrap_str_format(self, value: Any) -> Any:
        wrapper = super().wrap_str_format(value)
        if wrapper is not None:  # a str.format / format_map about to be called: its widths are in the string
            check_format(value.__self__, self.limits)
        return wrapper


def _environment(limits: RenderLimits) -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(limits, trim_blocks=True, lstrip_blocks=True,
                              extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: guarded(f, limits, formats=name == "format") for name, f in env.filters.items()}
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                       namespace=_TemplateNamespace)
    return env


def _plain(value: Any, where: str) -> Any:
    """JSON-like data only: the sandbox must not see objects whose methods it cannot judge."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for base in (str, bool, int, float):  # subclasses (str enums, ...) carry methods of their own
        if isinstance(value, base):
            return str.__str__(value) if base is str else base(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(_plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise ConfigError(f"{where} is a {type(value).__name__}; chat messages hold strings, numbers, lists and dicts")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate a conversation and return plain copies of its messages.

    Each message is a dict with string ``role`` and ``content``; other keys (say ``tool_calls``) are
    passed to the template as they are. Keys whose value is None are dropped, as transformers does
    (templates test for a key's presence, and would print "None")."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ConfigError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
                          f"got {type(messages).__name__}")
    if not messages:
        raise ConfigError("messages is empty: a conversation needs at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ConfigError(f"message {i} must be a dict with 'role' and 'content', got {type(m).__name__}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                got = "missing" if m.get(key) is None else f"a {type(m[key]).__name__}"
                raise ConfigError(f"message {i} needs a string {key!r} ({key} is {got})")
        out.append(_plain({k: v for k, v in m.items() if v is not None}, f"message {i}"))
    return out


class ChatTemplate:
    """A compiled chat template plus the special-token strings it reads (``bos_token``, ``eos_token``, ...).

    >>> t = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", {"bos_token": "<s>"})
    >>> t.render([{"role": "user", "content": "hi"}])
    '<s>hi'
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None, *,
                 limits: RenderLimits = RenderLimits()) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.limits = limits
        try:
            self._template = _environment(limits).from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the chat template does not compile (line {e.lineno}): {e.message}") from None
        except LimitExceeded as e:  # Jinja folds filters of constants while compiling: `"x"|center(10**10)`
            raise ChatTemplateError(f"the chat template was stopped while compiling: {e}") from None

    @classmethod
    def from_file(cls, path: str | Path, special_tokens: Mapping[str, str] | None = None) -> "ChatTemplate":
        try:
            source = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"cannot read the chat template {path}: {e}") from None
        return cls(source, special_tokens)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True, **variables: Any) -> str:
        """The prompt text for ``messages``; ``add_generation_prompt`` appends the assistant turn's header.

        The template sees ``messages``, ``add_generation_prompt``, ``tools=None``, ``documents=None``, the
        special tokens and ``variables`` (which override them), as under transformers. A template's
        ``raise_exception`` (e.g. "Conversation roles must alternate user/assistant/...") becomes a
        :class:`ChatTemplateError` carrying its message, and so does a render past :attr:`limits`."""
        context = {**self.special_tokens, **_plain(variables, "template variable")}
        messages = check_messages(messages)  # outside the try: a ConfigError is a ValueError too
        try:
            return self._bounded_render(dict(messages=messages, tools=None, documents=None,
                                             add_generation_prompt=bool(add_generation_prompt), **context))
        except LimitExceeded as e:
            raise ChatTemplateError(f"the chat template was stopped: {e}") from None
        except _TemplateRaised as e:
            raise ChatTemplateError(f"the chat template refused the messages: {e.message}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e.message}") from None
        except (TypeError, ValueError, LookupError, ArithmeticError, RecursionError, MemoryError) as e:
            # Python errors inside template code (a macro calling itself ends in RecursionError)
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None

    def _bounded_render(self, variables: dict[str, Any]) -> str:
        """The render, consumed piece by piece so that output past ``max_chars`` stops it, all of it under the
        time and memory bounds."""
        pieces, size = [], 0
        with time_and_memory(self.limits):
            for piece in self._template.generate(**variables):
                size += len(piece)
                if size > self.limits.max_chars:
                    raise LimitExceeded(f"it wrote more than {self.limits.max_chars} characters")
                pieces.append(piece)
        return "".join(pieces)
