"""Test support for SFT data: a tiny tokenizer folder trained on the spot (nothing downloaded)
and random conversations, for megafmt's tests, the cross-package ones and the benchmark."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

#: the special tokens the prompt formats use, and an eos
SPECIAL_TOKENS = ["<unk>", "</s>", "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<SPECIAL_233>"]

#: a chat template for the ``default`` prompt format
CHAT_TEMPLATE = (
    "{% for m in messages %}<SPECIAL_11>{{ m['role'] }}\n{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<SPECIAL_11>assistant\n{% endif %}"
)

WORDS = ["hello", "world", "tokens", "cat", "sat", "on", "a", "mat", "why", "/think", "42", "ok"]


def random_text(rng: random.Random, words: int = 12) -> str:
    """Words, spaces and the odd newline, sometimes with whitespace to strip at either end."""
    body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, words)))
    if rng.random() < 0.2:
        body = body.replace(" ", "\n", 1)
    return rng.choice(["", " ", "\n"]) + body + rng.choice(["", " ", "\n"])


def write_sft_tokenizer(directory: str | Path, vocab_size: int = 320) -> Path:
    """A byte-level BPE with the prompt formats' special tokens, saved with its config (eos
    ``</s>``, a chat template) as transformers and megafmt's ``SFTTokenizer`` load it."""
    import tokenizers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    rng = random.Random(0)
    tokenizer.train_from_iterator([random_text(rng, 30) for _ in range(500)], trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def random_messages(
    rng: random.Random, conversations: int = 2, turns: int = 3
) -> list[dict[str, Any]]:
    """A line's ``messages``: ``conversations`` packed conversations, each a system turn and up
    to ``turns`` user/assistant exchanges (sometimes through a tool turn)."""
    messages: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, conversations)):
        messages.append({"role": "system", "content": random_text(rng, 6)})
        for _ in range(rng.randint(1, turns)):
            messages.append({"role": "user", "content": random_text(rng)})
            if rng.random() < 0.1:
                messages.append({"role": "tool", "content": random_text(rng, 4)})
            messages.append({"role": "assistant", "content": random_text(rng, 20).strip() or "ok"})
    return messages


def write_sft_jsonl(path: str | Path, lines: int, seed: int = 0, **shape: int) -> list[list[dict]]:
    """``lines`` random lines of ``random_messages`` written to ``path``; their messages."""
    rng = random.Random(seed)
    records = [random_messages(rng, **shape) for _ in range(lines)]
    with open(path, "w", encoding="utf-8") as stream:
        for messages in records:
            stream.write(json.dumps({"messages": messages}) + "\n")
    return records
