"""Data that ships with specrt: the prompt sets (export's quality gates and bench both read them) and the
logits summary graph GPU backends run."""

from __future__ import annotations

import json
from importlib import resources

from ..errors import ConfigError


def prompts(kind: str = "code") -> list[str]:
    """The prompt sets that ship with specrt: "code", "prose", "all" (code and prose: what the quality gates
    and bench read) or "chat" (user messages for an instruct model, the seeds EAGLE-3 training generates
    replies to; benchmarks/prompts/chat-heldout.json holds ones it never saw)."""
    data = json.loads(resources.files(__name__).joinpath("prompts.json").read_text())
    if kind == "all":
        return data["code"] + data["prose"]
    if kind not in data:
        raise ConfigError(f"unknown prompt set {kind!r}; choose code, prose, all or chat")
    return data[kind]
