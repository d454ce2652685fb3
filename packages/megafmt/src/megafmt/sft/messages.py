"""The conversations of an SFT jsonl line: what a valid line holds, and where it splits.

A line is a JSON object whose ``messages`` is a list of ``{"role", "content"}`` turns. One line
may pack several conversations: each ``system`` turn starts a new one (Megatron-LM's SFT
dataset splits there too). Roles are ``system``, ``user``, ``assistant`` and ``tool``; an
assistant turn must have content and follow a ``user`` or ``tool`` turn, as the seed commit's SFT
tokenizer asserts while it masks prompts.
"""

from __future__ import annotations

import json
from typing import Any

#: the roles a turn may have
ROLES = frozenset({"system", "user", "assistant", "tool"})

#: roles an assistant turn may answer
ANSWERED_ROLES = frozenset({"user", "tool"})

Message = dict[str, Any]


def parse_line(raw: bytes) -> tuple[list[Message] | None, str | None]:
    """The ``messages`` of the jsonl line ``raw`` and None, or None and why the line cannot be
    an SFT example."""
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as error:
        return None, f"invalid UTF-8 at byte {error.start}"
    except ValueError as error:
        return None, f"not JSON ({error})"
    if not isinstance(record, dict):
        return None, f"expected a JSON object, found {type(record).__name__}"
    if "messages" not in record:
        return None, "no 'messages' key"
    problem = messages_problem(record["messages"])
    return (None, problem) if problem else (record["messages"], None)


def line_problem(raw: bytes) -> str | None:
    """Why the jsonl line ``raw`` cannot be an SFT example, or None when it can."""
    return parse_line(raw)[1]


def messages_problem(messages: Any) -> str | None:
    """Why ``messages`` is not a valid list of turns, or None (the first problem found)."""
    if not isinstance(messages, list) or not messages:
        return f"'messages' must be a non-empty list, found {messages!r:.80}"
    previous = None
    for number, turn in enumerate(messages):
        if not isinstance(turn, dict) or not isinstance(turn.get("content"), str):
            return (
                f"messages[{number}] must be an object with a string 'content', found {turn!r:.80}"
            )
        role = turn.get("role")
        if role not in ROLES:
            return f"messages[{number}] has role {role!r}; expected one of {sorted(ROLES)}"
        if role == "assistant":
            if not turn["content"]:
                return f"messages[{number}] is an empty assistant turn"
            if previous not in ANSWERED_ROLES:
                return (
                    f"messages[{number}] is an assistant turn after a {previous!r} turn; it must "
                    "answer a 'user' or 'tool' turn"
                )
        previous = role
    return None


def split_conversations(messages: list[Message]) -> list[list[Message]]:
    """The conversations packed in one line's ``messages``: a new one at every system turn."""
    conversations: list[list[Message]] = []
    for turn in messages:
        if turn["role"] == "system" or not conversations:
            conversations.append([])
        conversations[-1].append(turn)
    return conversations
