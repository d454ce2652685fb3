"""The conversations of an SFT jsonl line: what a valid line holds, and where it splits.

A line is a JSON object whose ``messages`` is a non-empty list of ``{"role", "content"}`` turns
(both strings). One line may pack several conversations: each ``system`` turn starts a new one
(Megatron-LM's SFT dataset splits there too). What else a line must hold depends on the prompt
format, as it does in the seed commit, whose SFT tokenizer checks turns only while it masks
prompts (``nemotron-h-aligned``, ``nemotron-nano-v2``; :func:`conversation_problem`); the
unmasked formats (``identity``, ``default``) train on any such line: an empty assistant turn,
a conversation that opens with the assistant, any role.
"""

from __future__ import annotations

import json
from typing import Any

#: the roles a turn may have
ROLES = frozenset({"system", "user", "assistant", "tool"})

#: roles an assistant turn may answer
ANSWERED_ROLES = frozenset({"user", "tool"})

Message = dict[str, Any]


def parse_line(raw: bytes, masked_turns: bool = True) -> tuple[list[Message] | None, str | None]:
    """The ``messages`` of the jsonl line ``raw`` and None, or None and why the line cannot be
    an SFT example (with ``masked_turns``: in a prompt format that masks prompts)."""
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
    problem = messages_problem(record["messages"], masked_turns)
    return (None, problem) if problem else (record["messages"], None)


def line_problem(raw: bytes, masked_turns: bool = True) -> str | None:
    """Why the jsonl line ``raw`` cannot be an SFT example, or None when it can."""
    return parse_line(raw, masked_turns)[1]


def messages_problem(messages: Any, masked_turns: bool = True) -> str | None:
    """Why ``messages`` is not a valid list of turns, or None (the first problem found); with
    ``masked_turns``, each conversation is also checked as a masking prompt format checks it."""
    if not isinstance(messages, list) or not messages:
        return f"'messages' must be a non-empty list, found {messages!r:.80}"
    for number, turn in enumerate(messages):
        if not isinstance(turn, dict) or not isinstance(turn.get("content"), str):
            return (
                f"messages[{number}] must be an object with a string 'content', found {turn!r:.80}"
            )
        if not isinstance(turn.get("role"), str):
            return f"messages[{number}] must have a string 'role', found {turn.get('role')!r:.80}"
        for field in ("role", "content"):
            where = lone_surrogate_at(turn[field])
            if where is not None:
                return (
                    f"messages[{number}].{field} holds a lone surrogate "
                    f"({turn[field][where]!r} at character {where}): a \\u escape that is half "
                    "of a pair, which no tokenizer can encode; expected text that is valid UTF-8"
                )
    if not masked_turns:
        return None
    first = 0
    for conversation in split_conversations(messages):
        problem = conversation_problem(conversation)
        if problem is not None:
            return f"messages[{first}:{first + len(conversation)}] (a conversation): {problem}"
        first += len(conversation)
    return None


def lone_surrogate_at(text: str) -> int | None:
    """The position of the first lone surrogate in ``text`` (JSON's ``\\ud800`` decodes to
    one; UTF-8 cannot encode it, so a tokenizer fails on it), or None. Checked for every turn
    of every line scanned: ASCII text, which holds none, is not encoded (``isascii`` reads a
    flag of the string, the encoding copies it)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def conversation_problem(conversation: list[Message]) -> str | None:
    """Why a prompt format that masks prompts cannot tokenize ``conversation``, or None: the
    seed's SFT tokenizer refuses an empty assistant turn, an assistant turn that does not answer
    a ``user`` or ``tool`` turn (roles compared lower-cased; the turn before the first is the
    conversation's last, as the seed indexes it) and a role it does not know."""
    for number, turn in enumerate(conversation):
        role = turn["role"].lower()
        if role == "assistant":
            if not turn["content"]:
                return f"turn {number} is an empty assistant turn"
            previous = conversation[number - 1]["role"]
            if previous.lower() not in ANSWERED_ROLES:
                return (
                    f"turn {number} is an assistant turn after a {previous!r} turn; it must "
                    "answer a 'user' or 'tool' turn"
                )
        if role not in ROLES:
            return f"turn {number} has role {turn['role']!r}; expected one of {sorted(ROLES)}"
    return None


def split_conversations(messages: list[Message]) -> list[list[Message]]:
    """The conversations packed in one line's ``messages``: a new one at every system turn."""
    conversations: list[list[Message]] = []
    for turn in messages:
        if turn["role"] == "system" or not conversations:
            conversations.append([])
        conversations[-1].append(turn)
    return conversations
