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
from typing import Any

import numpy

from megafmt.atomic import atomic_write
from megafmt.builder import IndexedDatasetBuilder
from megafmt.dataset import IndexedDataset
from megafmt.dtypes import DType
from megafmt.errors import FormatError
from megafmt.format import get_bin_path, get_idx_path
from megafmt.limits import naming_full_disk
from megafmt.progress import Progress
from megafmt.readers import is_url
from megafmt.readers.file_reader import FileBinReader
from megafmt.redaction import redact
from megafmt.remote import file_size, read_range
from megafmt.sft.lines import JsonlLineIndex
from megafmt.sft.tokenizer import DEFAULT_PROMPT_FORMAT, IGNORE_INDEX, SFTTokenizer, tokenize_line

LOSS_MASK_SUFFIX = ".lossmask"
#: the json key the output is named after, as preprocess names ``<prefix>_<key>_document``
SFT_KEY = "messages"


def get_loss_mask_path(path_prefix: str) -> str:
    """The loss-mask sidecar of the pre-tokenized SFT corpus at ``path_prefix``."""
    return path_prefix + LOSS_MASK_SUFFIX


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
    conversations = write_tokenized(lines, tokenizer, prefix)
    print(
        f"{redact(input_path)}: {len(lines)} lines, {conversations} conversations -> "
        f"{prefix}.bin/.idx/{LOSS_MASK_SUFFIX[1:]} ({lines.bad_lines} bad lines skipped)"
    )
    return prefix


class TokenizedConversations:
    """A pre-tokenized SFT corpus: one element per jsonl line, its conversations' ids and
    targets read from the pair and the loss mask."""

    def __init__(self, path_prefix: str) -> None:
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
        # read, not mapped: a mask truncated under a mapping kills the process (SIGBUS); a
        # reader's short read is a FormatError naming the file and the byte
        self._mask = None if is_url(self.mask_path) else FileBinReader(self.mask_path)

    def __len__(self) -> int:
        return len(self.tokens.document_indices) - 1

    def _mask_of(self, start: int, length: int) -> numpy.ndarray:
        if self._mask is not None:
            return self._mask.read(numpy.uint8, length, start)
        return numpy.frombuffer(read_range(self.mask_path, start, length), numpy.uint8)

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
