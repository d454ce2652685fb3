"""The tour's default data: two corpora of real English text that ship with Python, and a
byte-level BPE tokenizer trained on them.

Nothing comes from the network: ``pydoc_data.topics`` (the help texts of the language reference)
and the docstrings of the standard library's modules, classes and functions, read from their
source files with ``ast`` (nothing is imported).
"""

from __future__ import annotations

import ast
import json
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

from megafmt.errors import PluginError

#: the trained tokenizer's end-of-document token (its tokenizer_config.json names it eos_token)
EOD_TOKEN = "<|endoftext|>"


def reference_topics() -> list[str]:
    """The language reference's help topics, one document per paragraph block of a topic."""
    from pydoc_data.topics import topics

    documents = []
    for name in sorted(topics):
        blocks = [block.strip() for block in topics[name].split("\n\n\n")]
        documents += [block for block in blocks if len(block) > 40]
    return documents


def library_docstrings(limit: int) -> list[str]:
    """Up to ``limit`` docstrings of the standard library, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    documents: list[str] = []
    skipped = {"site-packages", "test", "tests", "idle_test"}
    for path in sorted(stdlib.rglob("*.py")):
        if skipped & set(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                text = ast.get_docstring(node)
                if text and len(text) > 40:
                    documents.append(text)
                    if len(documents) == limit:
                        return documents
    return documents


def write_jsonl(path: Path, documents: list[str]) -> None:
    """One ``{"text": ...}`` line per document."""
    with open(path, "w", encoding="utf-8") as stream:
        for text in documents:
            stream.write(json.dumps({"text": text}) + "\n")


def iter_jsonl_texts(path: Path, key: str = "text") -> Iterator[str]:
    """The ``key`` field of every line of a jsonl file, streamed (lines without it are left
    out)."""
    with open(path, encoding="utf-8") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} line {number}: expected a JSON object: {error}") from None
            value = record.get(key) if isinstance(record, dict) else None
            if isinstance(value, str):
                yield value


def train_tokenizer(documents: Iterable[str], folder: Path, vocab_size: int) -> Path:
    """A byte-level BPE ``tokenizer.json`` trained on ``documents`` (offline, seconds), with a
    ``tokenizer_config.json`` naming its end-of-document token, as a HuggingFace folder has."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise PluginError(
            "the tour trains its tokenizer with the 'tokenizers' library: pip install "
            "'megafmt[huggingface]', or give a tokenizer with --tokenizer-type and its files"
        ) from None

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOD_TOKEN}))
    return folder
