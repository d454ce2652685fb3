"""The SFT tokenizer: conversations to token ids, and targets with the prompts masked.

Same ids, targets and special ids as the seed commit's ``SFTTokenizer`` (Megatron-LM's
``--sft-tokenizer-prompt-format``) for a local HuggingFace tokenizer folder. A conversation is
rendered to text in its prompt format and encoded without added special tokens (what
transformers' ``apply_chat_template`` does); for the formats that mask, every turn is also
rendered and encoded alone, and its tokens are the prompt (system, user, tool: all of it;
assistant: the format's assistant prefix) or the answer. A conversation whose turns do not
encode to the pieces of the whole is refused, as the seed refuses it.

Formats:

- ``nemotron-h-aligned`` (the default): ``<SPECIAL_10>System\\n`` + system text,
  ``<SPECIAL_11>User\\n`` + user text + ``\\n<SPECIAL_11>Assistant\\n``, then the answer;
  each text stripped and ended by a newline. Pad: ``<SPECIAL_233>``.
- ``nemotron-nano-v2``: the same headers, the ``Assistant`` one opening the answer turn, which
  ends with ``\\n<SPECIAL_12>\\n``; ``/think`` and ``/no_think`` removed from system and user text;
  the 3-token assistant header masked. Pad: ``<unk>``.
- ``identity``: the contents back to back, nothing masked. Pad: ``<unk>``.
- ``default``: the tokenizer's own chat template (needs transformers), nothing masked. Pad: the
  tokenizer's pad token, else its eos.

The library is ``tokenizers`` (``pip install megafmt[huggingface]``); no file is downloaded.
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy

from megafmt.errors import FormatError, MissingFileError, PluginError
from megafmt.sft.messages import Message, conversation_problem, split_conversations
from megafmt.tokenizers.base import TokenizerOptions, fingerprint_of, import_library
from megafmt.tokenizers.huggingface import CONFIG_FILES, configured_tokens
from megafmt.tokenizers.identity import megatron_identifiers

#: a target position that takes no loss (the prompt)
IGNORE_INDEX = -100

SYSTEM_HEADER = "<SPECIAL_10>System\n"
USER_HEADER = "<SPECIAL_11>User\n"
ASSISTANT_HEADER = "<SPECIAL_11>Assistant\n"
NANO_END = "\n<SPECIAL_12>\n"


def _no_think(text: str) -> str:
    return text.replace("/think", "").replace("/no_think", "").strip()


def _render_h_aligned(turn: Message) -> str:
    role, content = turn["role"], turn["content"]
    if role == "system":
        return SYSTEM_HEADER + content.strip() + "\n"
    if role == "user":
        return USER_HEADER + content.strip() + "\n" + ASSISTANT_HEADER
    if role == "assistant":
        return content.strip() + "\n"
    return ""


def _render_nano_v2(turn: Message) -> str:
    role, content = turn["role"], turn["content"]
    if role == "system":
        return SYSTEM_HEADER + _no_think(content) + "\n"
    if role == "user":
        return USER_HEADER + _no_think(content) + "\n"
    if role == "assistant":
        return ASSISTANT_HEADER + content.strip() + NANO_END
    return ""


def _render_identity(turn: Message) -> str:
    return turn["content"]


@dataclass(frozen=True)
class PromptFormat:
    """How one ``--sft-tokenizer-prompt-format`` renders turns and masks them."""

    render: Callable[[Message], str] | None
    """one turn as text; None: the tokenizer's own chat template"""
    pad_token: str | None
    """the pad token's text; None: the tokenizer's pad token, else its eos"""
    masks: bool
    """whether prompts are masked in the targets"""
    assistant_prefix_len: int = 0
    """tokens at the start of an assistant turn that are masked too"""


PROMPT_FORMATS: dict[str, PromptFormat] = {
    "nemotron-h-aligned": PromptFormat(_render_h_aligned, "<SPECIAL_233>", masks=True),
    "nemotron-nano-v2": PromptFormat(_render_nano_v2, "<unk>", True, assistant_prefix_len=3),
    "identity": PromptFormat(_render_identity, "<unk>", masks=False),
    "default": PromptFormat(None, None, masks=False),
}

DEFAULT_PROMPT_FORMAT = "nemotron-h-aligned"


class SFTTokenizer:
    """A local HuggingFace tokenizer folder (``tokenizer.json`` and its config files) in one of
    the ``PROMPT_FORMATS``: ``tokenize_conversation``, ``eod``, ``pad``, ``vocab_size`` as the
    seed commit's SFT tokenizer (and its Megatron wrapper) give them."""

    def __init__(self, tokenizer_path: str, prompt_format: str = DEFAULT_PROMPT_FORMAT) -> None:
        if prompt_format not in PROMPT_FORMATS:
            raise PluginError(
                f"unknown SFT prompt format {prompt_format!r}; available: "
                f"{', '.join(sorted(PROMPT_FORMATS))}"
            )
        tokenizers: Any = import_library("tokenizers", "the SFT tokenizer", "tokenizers")
        path = os.path.join(tokenizer_path, "tokenizer.json")
        if not os.path.isfile(path):
            raise MissingFileError(f"SFT tokenizer {tokenizer_path}: no tokenizer.json there")
        self.path = tokenizer_path
        self.prompt_format = prompt_format
        self.format = PROMPT_FORMATS[prompt_format]
        try:
            self._encoder = tokenizers.Tokenizer.from_file(path)
        except Exception as error:  # the library raises a bare Exception for a damaged file
            raise FormatError(
                f"SFT tokenizer {path}: not a tokenizers tokenizer.json ({error})"
            ) from None
        tokens, _, configs = configured_tokens(tokenizer_path)
        self._chat = self._chat_template() if self.format.render is None else None
        self.vocab_size: int = self._encoder.get_vocab_size(with_added_tokens=True)
        self.eod = self._id_of(tokens.get("eos_token"), "eos_token", optional=True)
        self.bos_id = self._id_of(tokens.get("bos_token"), "bos_token", optional=True)
        if self.format.pad_token is not None:
            self.pad = self._id_of(self.format.pad_token, "pad token")
        else:
            pad = self._id_of(tokens.get("pad_token"), "pad_token", optional=True)
            self.pad = self.eod if pad is None else pad
        self.fingerprint = fingerprint_of("sft", [path, *configs], prompt_format)

    def _id_of(self, token: str | None, what: str, optional: bool = False) -> int | None:
        found = None if token is None else self._encoder.token_to_id(token)
        if found is None and not optional:
            raise FormatError(
                f"{self.path}: the {self.prompt_format} prompt format needs the {what} "
                f"{token!r}, which is not in the tokenizer's vocabulary"
            )
        return found

    def _chat_template(self) -> Any:
        transformers: Any = import_library(
            "transformers", "the default SFT prompt format", "transformers"
        )
        return transformers.AutoTokenizer.from_pretrained(self.path)

    @property
    def pad_id(self) -> int | None:
        return self.pad

    @functools.cached_property
    def fingerprint(self) -> str:
        """A digest of the files and the prompt format that decide the ids and targets: equal
        fingerprints, equal conversations (what a pre-tokenized corpus's manifest records)."""
        names = ("tokenizer.json", *CONFIG_FILES)
        files = [os.path.join(self.path, name) for name in names]
        existing = [path for path in files if os.path.isfile(path)]
        return fingerprint_of("SFTTokenizer", existing, self.prompt_format)

    @property
    def unique_identifiers(self) -> OrderedDict:
        """What the seed commit's build_tokenizer gives --tokenizer-type SFTTokenizer."""
        return megatron_identifiers(
            "SFTTokenizer", TokenizerOptions(model=self.path), self.prompt_format
        )

    def _encode(self, text: str) -> numpy.ndarray:
        return numpy.asarray(self._encoder.encode(text, add_special_tokens=False).ids, numpy.int64)

    def _render(self, conversation: list[Message], add_generation_prompt: bool) -> str:
        if self._chat is not None:
            return self._chat.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        return "".join(self.format.render(turn) for turn in conversation)

    def tokenize_conversation(
        self,
        conversation: list[Message],
        return_target: bool,
        add_generation_prompt: bool,
    ) -> numpy.ndarray | tuple[numpy.ndarray, numpy.ndarray]:
        """The ids of ``conversation`` and, with ``return_target``, its targets: the ids with
        every prompt position ``IGNORE_INDEX`` (unmasked formats: the ids)."""
        tokens = self._encode(self._render(conversation, add_generation_prompt))
        if not return_target:
            return tokens
        target = tokens.copy()
        if not self.format.masks:
            return tokens, target
        problem = conversation_problem(conversation)
        if problem is not None:  # the seed's SFT tokenizer refuses it too
            raise FormatError(f"{problem} in the conversation {conversation!r:.200}")
        position = 0
        for number, turn in enumerate(conversation):
            piece = self._encode(self.format.render(turn))
            end = position + len(piece)
            if not numpy.array_equal(tokens[position:end], piece):
                raise FormatError(
                    f"turn {number} ({turn['role']}) of the conversation encodes differently "
                    f"alone than within it, so its prompt cannot be masked: {conversation!r:.200}"
                )
            if turn["role"].lower() == "assistant":  # as the seed compares roles here
                target[position : position + self.format.assistant_prefix_len] = IGNORE_INDEX
            else:
                target[position:end] = IGNORE_INDEX
            position = end
        if position != len(tokens):
            raise FormatError(
                f"the conversation's turns cover {position} of its {len(tokens)} tokens: "
                f"{conversation!r:.200}"
            )
        return tokens, target

    def detokenize(self, ids: Any) -> str:
        """The text of ``ids``, special tokens included (for showing samples)."""
        return self._encoder.decode([int(i) for i in ids], skip_special_tokens=False)


def tokenize_line(
    messages: list[Message], tokenizer: Any
) -> list[tuple[numpy.ndarray, numpy.ndarray]]:
    """The ids and targets of each conversation packed in one line's ``messages``, in order,
    by any tokenizer with the seed's ``tokenize_conversation`` (this module's or Megatron's)."""
    return [
        tuple(tokenizer.tokenize_conversation(c, return_target=True, add_generation_prompt=False))
        for c in split_conversations(messages)
    ]
