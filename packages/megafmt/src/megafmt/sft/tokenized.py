"""Pre-tokenized SFT data: a jsonl's conversations as a ``.bin``/``.idx`` pair and a loss mask.

``mega preprocess --sft`` tokenizes every good line once, so training skips tokenization. Each
conversation is one sequence and each jsonl line one document (its conversations, in order), in
Megatron's format, readable by any of its tools. Beside the pair, ``<prefix>.lossmask`` holds
one byte per token (1: the target is the token, 0: a prompt position, ``IGNORE_INDEX``), in the
``.bin``'s order, so a sequence's targets are ``where(mask, tokens, -100)``. The dataset reads
this form as it reads the jsonl and gives the same samples.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

import numpy

from megafmt.atomic import atomic_write
from megafmt.builder import IndexedDatasetBuilder
from megafmt.dataset import IndexedDataset
from megafmt.dtypes import DType
from megafmt.errors import FormatError
from megafmt.fingerprint import corpus_fingerprint, file_version
from megafmt.format import LOSS_MASK_SUFFIX, get_bin_path, get_idx_path, get_loss_mask_path
from megafmt.limits import naming_full_disk
from megafmt.manifest import read_manifest, remove_manifest, write_manifest
from megafmt.progress import Progress
from megafmt.readers import is_url
from megafmt.readers import pool as reader_pool
from megafmt.readers.file_reader import FileBinReader
from megafmt.redaction import redact
from megafmt.remote import file_size, read_range
from megafmt.sft.lines import JsonlLineIndex, stat_identity
from megafmt.sft.tokenizer import DEFAULT_PROMPT_FORMAT, IGNORE_INDEX, SFTTokenizer, tokenize_line

#: the json key the output is named after, as preprocess names ``<prefix>_<key>_document``
SFT_KEY = "messages"


def write_tokenized(lines: JsonlLineIndex, tokenizer: Any, output_prefix: str) -> int:
    """Tokenize every good line of ``lines`` into ``output_prefix``'s pair and loss mask; the
    number of conversations written."""
    conversations = 0
    mask_path = get_loss_mask_path(output_prefix)
    for path in (get_bin_path(output_prefix), get_idx_path(output_prefix), mask_path):
        if os.path.isdir(path):  # found before any file is written, not after the pair's commit
            raise IsADirectoryError(
                f"{path}: a folder is where the pre-tokenized SFT corpus's file goes; move it "
                "or choose another --output-prefix"
            )
    builder = IndexedDatasetBuilder(
        get_bin_path(output_prefix), dtype=DType.optimal_dtype(tokenizer.vocab_size)
    )
    try:
        with (
            naming_full_disk(builder.bin_path, get_idx_path(output_prefix), mask_path),
            atomic_write(mask_path) as mask,
            Progress(
                f"tokenizing {lines.path}", len(lines), "lines", also=("conversations",)
            ) as progress,
        ):
            for idx in range(len(lines)):
                pieces = tokenize_line(lines[idx], tokenizer)
                tokens = numpy.concatenate([tokens for tokens, _ in pieces])
                targets = numpy.concatenate([targets for _, targets in pieces])
                builder.add_document(tokens, lengths=[len(tokens) for tokens, _ in pieces])
                mask.write((targets != IGNORE_INDEX).astype(numpy.uint8).tobytes())
                conversations += len(pieces)
                progress.update(1, conversations=len(pieces))
            builder.finalize(get_idx_path(output_prefix))
    except BaseException:
        builder.abort()
        raise
    return conversations


def preprocess_sft(
    input_path: str,
    output_prefix: str,
    tokenizer_path: str,
    prompt_format: str = DEFAULT_PROMPT_FORMAT,
    skip_bad_lines: bool = False,
) -> str:
    """``mega preprocess --sft``: index and check the jsonl at ``input_path``, tokenize it with
    the SFT tokenizer at ``tokenizer_path`` into ``<output_prefix>_messages_document``; that
    prefix (the dataset path to train on)."""
    tokenizer = SFTTokenizer(tokenizer_path, prompt_format)
    lines = JsonlLineIndex(
        input_path, skip_bad_lines=skip_bad_lines, masked_turns=tokenizer.format.masks
    )
    prefix = f"{output_prefix}_{SFT_KEY}_document"
    remove_manifest(prefix)  # an old corpus's never describes the new one
    conversations = write_tokenized(lines, tokenizer, prefix)
    manifest = sft_manifest(tokenizer, input_path, len(lines), conversations)
    write_manifest(prefix, {**manifest, **companion_versions(prefix)})
    print(
        f"{redact(input_path)}: {len(lines)} lines, {conversations} conversations -> "
        f"{prefix}.bin/.idx/{LOSS_MASK_SUFFIX[1:]} ({lines.bad_lines} bad lines skipped)"
    )
    return prefix


def sft_manifest(
    tokenizer: SFTTokenizer, input_path: str, lines: int, conversations: int
) -> dict[str, Any]:
    """What a pre-tokenized SFT corpus records of how it was made: the tokenizer (folder,
    prompt format, fingerprint, sizes) its ids and loss mask depend on, and its input."""
    return {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "megafmt": version("megafmt"),
        "kind": "sft",
        "tokenizer": {
            "type": "SFTTokenizer",
            "path": tokenizer.path,
            "prompt_format": tokenizer.prompt_format,
            "fingerprint": tokenizer.fingerprint,
            "vocab_size": tokenizer.vocab_size,
            "eod": tokenizer.eod,
            "pad": tokenizer.pad,
        },
        "inputs": [{"path": input_path, "size": file_size(input_path)}],
        "lines": lines,
        "conversations": conversations,
    }


def companion_versions(path_prefix: str) -> dict[str, Any]:
    """What ties the corpus's three files together in its manifest: the pair's fingerprint
    (the whole ``.idx``'s checksum, sampled ``.bin`` blocks) and the ``.lossmask``'s sampled
    blocks, so a mask of another corpus of the same size, or a pair replaced under the mask, is
    noticed at open without reading the files through."""
    mask_bytes, mask_hash = file_version(get_loss_mask_path(path_prefix), "loss mask")
    return {
        "pair": corpus_fingerprint(path_prefix),
        "lossmask": {"bytes": mask_bytes, "hash": mask_hash},
    }


def check_companions(path_prefix: str, manifest: dict[str, Any]) -> None:
    """Refuse the corpus at ``path_prefix`` when its files are not those its ``manifest`` was
    written with (a corpus without a manifest, or one that records none, is not judged)."""
    if "pair" not in manifest or "lossmask" not in manifest:
        return
    found = companion_versions(path_prefix)
    for name, what in (("lossmask", "its .lossmask"), ("pair", "its .bin/.idx")):
        if found[name] != manifest[name]:
            raise FormatError(
                f"{path_prefix}: {what} is not the one mega preprocess --sft made with this "
                f"corpus (recorded {manifest[name]}, found {found[name]}): a file of another "
                "corpus, or one changed since; run mega preprocess --sft again"
            )


def check_vocabulary(path_prefix: str, vocab_size: int) -> None:
    """Refuse to train the pre-tokenized corpus at ``path_prefix`` with a tokenizer of a smaller
    vocabulary than the one it was made with (its ids would pass the model's embedding); for
    tokenizers other than megafmt's SFT tokenizer, whose files cannot be compared."""
    made = ((read_manifest(path_prefix) or {}).get("tokenizer") or {}).get("vocab_size")
    if isinstance(made, int) and made > vocab_size:
        raise FormatError(
            f"{path_prefix}: pre-tokenized with a vocabulary of {made} ids (its manifest), "
            f"trained with a tokenizer of {vocab_size}: ids at or past {vocab_size} would pass "
            "the model's embedding. Train with the tokenizer it was made with"
        )


def check_made_with(path_prefix: str, manifest: dict[str, Any], tokenizer: SFTTokenizer) -> None:
    """Refuse to train the pre-tokenized corpus at ``path_prefix`` with an SFT tokenizer other
    than the one its ``manifest`` records (other ids, or prompts masked otherwise, would train
    without an error); a corpus without a manifest (made before it was written) is not judged."""
    made = manifest.get("tokenizer")
    if not made or made.get("type") != "SFTTokenizer":
        return
    given = {
        "prompt_format": tokenizer.prompt_format,
        "vocab_size": tokenizer.vocab_size,
        "fingerprint": tokenizer.fingerprint,
    }
    differ = [
        f"{key} {made.get(key)!r} -> {value!r}"
        for key, value in given.items()
        if made.get(key) != value
    ]
    if differ:
        raise FormatError(
            f"{path_prefix}: pre-tokenized with the SFT tokenizer at {made.get('path')} "
            f"({made.get('prompt_format')}), trained with the one at {tokenizer.path} "
            f"({tokenizer.prompt_format}); they differ in {', '.join(differ)}. Train with the "
            "tokenizer it was made with, or run mega preprocess --sft again with this one"
        )


class TokenizedConversations:
    """A pre-tokenized SFT corpus: one element per jsonl line, its conversations' ids and
    targets read from the pair and the loss mask. Given the SFT tokenizer it is trained with,
    that tokenizer must be the one its manifest records (:func:`check_made_with`)."""

    def __init__(self, path_prefix: str, tokenizer: Any = None) -> None:
        manifest = read_manifest(path_prefix) or {}  # read once for both checks
        if isinstance(tokenizer, SFTTokenizer):
            check_made_with(path_prefix, manifest, tokenizer)
        self.path_prefix = path_prefix
        self.tokens = IndexedDataset(path_prefix)
        self.mask_path = get_loss_mask_path(path_prefix)
        expected = int(self.tokens.sequence_lengths.sum(dtype=numpy.int64))
        found = file_size(self.mask_path)
        if found != expected:
            raise FormatError(
                f"{self.mask_path}: expected {expected} bytes (one per token of "
                f"{get_bin_path(path_prefix)}), found {found}"
            )
        self._mask_bytes = expected
        self._mask_identity: tuple[int, int, int, int] | None = None  # the file first opened
        # read, not mapped: a mask truncated under a mapping kills the process (SIGBUS); a
        # reader's short read is a FormatError naming the file and the byte. Its descriptor is
        # held in megafmt's pool of open readers: a blend of thousands keeps a bounded number
        self._mask: FileBinReader | None = None
        self.recently_read = False
        if not is_url(self.mask_path):
            self._open_mask()
        if not is_url(path_prefix):
            check_companions(path_prefix, manifest)

    def _open_mask(self) -> FileBinReader:
        """The loss mask's reader, pooled; opened again (after the pool released it, or in a
        copy of the corpus), the mask must be the very file first opened."""
        reader = FileBinReader(self.mask_path)
        identity = stat_identity(os.stat(self.mask_path))
        if reader.nbytes != self._mask_bytes:
            reader.close()
            raise FormatError(
                f"{self.mask_path}: reopened with {reader.nbytes} bytes, expected "
                f"{self._mask_bytes} (one per token of {get_bin_path(self.path_prefix)}): the "
                "loss mask changed since the corpus was opened"
            )
        if self._mask_identity is None:
            self._mask_identity = identity
        elif identity != self._mask_identity:
            reader.close()
            raise FormatError(
                f"{self.mask_path}: replaced or written since the corpus was opened (device, "
                f"inode, size, mtime_ns {self._mask_identity} then, {identity} now); its masks "
                f"would not be those of {get_bin_path(self.path_prefix)}'s tokens. Open the "
                "corpus again"
            )
        self._mask = reader
        reader_pool.POOL.opened(self)
        return reader

    def release_reader(self) -> None:
        """Drop the loss mask's reader (the pool of open readers calls this); the next read
        opens it again."""
        self._mask = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mask": None}  # reopened, and pooled, where it is read

    def __len__(self) -> int:
        return len(self.tokens.document_indices) - 1

    def _mask_of(self, start: int, length: int) -> numpy.ndarray:
        if is_url(self.mask_path):
            return numpy.frombuffer(read_range(self.mask_path, start, length), numpy.uint8)
        reader = self._mask
        if reader is None:
            reader = self._open_mask()
        self.recently_read = True
        return reader.read(numpy.uint8, length, start)

    def conversation(self, sequence: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        """The ids and targets of conversation (sequence) ``sequence`` of the corpus."""
        tokens = numpy.asarray(self.tokens[sequence], dtype=numpy.int64)
        start = int(self.tokens.sequence_pointers[sequence]) // self.tokens.index.dtype_size
        mask = self._mask_of(start, len(tokens))
        return tokens, numpy.where(mask != 0, tokens, IGNORE_INDEX)

    def tokenized_conversations(
        self, idx: int, tokenizer: Any = None
    ) -> list[tuple[numpy.ndarray, numpy.ndarray]]:
        """The ids and targets of line ``idx``'s conversations (``tokenizer`` is not needed:
        the corpus holds them)."""
        first, last = (int(i) for i in self.tokens.document_indices[idx : idx + 2])
        return [self.conversation(sequence) for sequence in range(first, last)]
