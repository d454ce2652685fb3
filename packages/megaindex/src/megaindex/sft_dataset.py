"""``SFTDataset``: supervised fine-tuning samples, packed conversations in THD form.

Drop-in for the seed commit's ``megatron.training.datasets.sft_dataset.SFTDataset`` (what
``pretrain_gpt.py --sft`` builds): the same constructor and static methods, ``len`` the requested
sample count with indices wrapping over the split's lines, and the same sample dict: ``tokens``,
``labels`` (prompt positions -100), ``loss_mask`` (0 at pads and prompts), ``position_ids``
(restarting in each conversation), ``cu_seqlens`` (int32) and ``max_seqlen`` (0-d int32). The
tokenizer is the configuration's (``tokenize_conversation``, ``eod``, ``pad``): megafmt's
``SFTTokenizer`` or Megatron's.

Beyond it: the low-level dataset is megafmt's jsonl line index (a cached byte-offset index, bad
lines named or counted with ``SFTDatasetConfig.skip_bad_lines``), not a ``datasets`` copy of the
file, or a pre-tokenized corpus (``mega preprocess --sft``) when ``<path>.idx`` exists; a
conversation cut or left out by packing is counted and warned about; ``__getitems__`` assembles
a batch, ``cu_seqlens`` padded to the longest by repeating its last boundary (zero-length
sequences, Megatron's convention for padded boundaries), so batches of more than one row
collate; ``merge_batches`` merges SFT batches the same way, so a blend of SFT corpora batches at
any micro-batch size.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from megafmt import IndexedDataset
from megafmt.protocols import CollatedBatch, ConversationSource
from megafmt.sft import (
    BadInputError,
    JsonlLineIndex,
    SFTTokenizer,
    TokenizedConversations,
    check_vocabulary,
    describe_tokens,
    tokenize_line,
)
from megaindex.batch_merge import in_row_order
from megaindex.config import GPTDatasetConfig, SizedVocabulary
from megaindex.errors import ConfigError, EmptySplitError
from megaindex.megatron_dataset import MegatronDataset
from megaindex.sft_pack import IGNORE_INDEX, Pack, pack_conversations
from megaindex.utils import Split


@dataclass
class SFTDatasetConfig(GPTDatasetConfig):
    """``GPTDatasetConfig`` (what Megatron-LM builds its SFT dataset with) plus the jsonl
    reader's choice for bad lines; what SFT packing requires is the default."""

    reset_position_ids: bool | None = False
    reset_attention_mask: bool | None = False
    eod_mask_loss: bool | None = False
    create_attention_mask: bool = False
    skip_bad_lines: bool = False
    """count, skip and report jsonl lines that are not valid examples instead of failing at the
    first (named by file and line either way)"""

    check_lines: str = "all"
    """when the jsonl's lines are checked: ``"all"`` while it is first indexed, or
    ``"on_read"``: indexed from its line ends alone, each line checked when a sample reads it"""


def masks_prompts(tokenizer: Any) -> bool:
    """Whether the lines are checked for a prompt format that masks prompts (the seed trains
    on any line in the others): megafmt's SFT tokenizer says; any other tokenizer (Megatron's)
    checks its conversations itself when a sample reads them."""
    return isinstance(tokenizer, SFTTokenizer) and tokenizer.format.masks


class SFTDataset(MegatronDataset):
    """Packed SFT samples over the lines ``indices`` of an SFT jsonl (or its pre-tokenized
    form); sample ``idx`` packs line ``indices[idx % len(indices)]``."""

    cut_conversations = 0
    """conversations cut short at the sequence length, one per cut sample (in this process)"""
    left_out_conversations = 0
    """conversations left out after a cut (in this process)"""
    _next_report = 1

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: Any) -> int:
        return len(low_level_dataset)

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: GPTDatasetConfig) -> Any:
        """The pre-tokenized corpus at ``dataset_path`` when its ``.idx`` exists, else the jsonl
        at ``dataset_path`` (local or any fsspec URL) through its cached line index."""
        if IndexedDataset.exists(dataset_path):  # checked against the tokenizer it was made with
            if isinstance(config.tokenizer, SizedVocabulary):
                check_vocabulary(dataset_path, config.tokenizer.vocab_size)
            return TokenizedConversations(dataset_path, config.tokenizer)
        masked = masks_prompts(config.tokenizer)
        if isinstance(config, SFTDatasetConfig):
            return JsonlLineIndex(
                dataset_path, config.skip_bad_lines, check=config.check_lines, masked_turns=masked
            )
        return JsonlLineIndex(dataset_path, masked_turns=masked)

    def __init__(
        self,
        dataset: Any,
        dataset_path: str | None,
        indices: numpy.ndarray | range | None,
        num_samples: int | None,
        index_split: Split,
        config: GPTDatasetConfig,
    ) -> None:
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)
        if indices is not None and len(indices) == 0 and num_samples:
            # the seed builds it and fails on the first read with ZeroDivisionError
            raise EmptySplitError(
                f"{num_samples} SFT samples are asked of the {index_split.name} split of "
                f"{dataset_path}, which holds no line (of {len(dataset)} in all); give the split "
                "a share of the lines, or ask nothing of it"
            )

    def __len__(self) -> int:
        return self.num_samples

    def line_of(self, idx: int) -> int:
        """The low-level element (jsonl line among the good ones) sample ``idx`` packs."""
        return int(self.indices[idx % len(self.indices)])

    def where(self, idx: int) -> str:
        """Which line sample ``idx`` packs, for messages: its number among the good lines and,
        for a jsonl, in the file."""
        line = self.line_of(idx)
        where = f"line {line} of {self.dataset_path}"
        if isinstance(self.dataset, JsonlLineIndex):
            where += f" (line {int(self.dataset.lines[line])} of the file)"
        return where

    def conversations(self, idx: int) -> list[tuple[numpy.ndarray, numpy.ndarray]]:
        """Ids and targets of each conversation sample ``idx`` packs, before packing; a line the
        tokenizer refuses (a masking prompt format's rules) is an error naming it."""
        line = self.line_of(idx)
        try:
            if isinstance(self.dataset, ConversationSource):
                return self.dataset.tokenized_conversations(line, self.config.tokenizer)
            return tokenize_line(self.dataset[line], self.config.tokenizer)
        except (ValueError, AssertionError) as error:
            if isinstance(error, BadInputError):  # names its file and line already
                raise
            raise BadInputError(f"SFT sample {idx} ({self.where(idx)}): {error}") from error

    def pack(self, idx: int) -> Pack:
        """Sample ``idx``'s pack (``sequence_length + 1`` tokens) before the shift."""
        config = self.config
        if config.reset_position_ids or config.reset_attention_mask or config.create_attention_mask:
            raise ConfigError(
                "SFTDataset packs conversations with cu_seqlens: reset_position_ids, "
                "reset_attention_mask and create_attention_mask must be off (found "
                f"{config.reset_position_ids}, {config.reset_attention_mask}, "
                f"{config.create_attention_mask})"
            )
        pack = pack_conversations(
            self.conversations(idx),
            self.config.sequence_length,
            self.config.tokenizer.pad,
            self.config.context_parallel_size or 1,
        )
        if pack.cut_tokens or pack.left_out:
            self._count_cut(idx, pack)
        return pack

    def _count_cut(self, idx: int, pack: Pack) -> None:
        self.cut_conversations += 1
        self.left_out_conversations += pack.left_out
        if self.cut_conversations >= self._next_report:  # 1, 10, 100, ... so logs stay short
            self._next_report *= 10
            warnings.warn(
                f"SFT sample {idx} ({self.where(idx)}) is longer "
                f"than sequence_length {self.config.sequence_length}: {pack.cut_tokens} tokens "
                f"cut, {pack.left_out} later conversations left out; so far in this process "
                f"{self.cut_conversations} samples cut, {self.left_out_conversations} "
                "conversations left out",
                stacklevel=3,
            )

    def describe(self, idx: int) -> list[str]:
        """Sample ``idx`` for a person (``mega index explain``): the line it packs, its
        segments (``cu_seqlens``) and, in each, the runs of prompt and loss tokens, decoded when
        the tokenizer is megafmt's SFT tokenizer (else ids)."""
        pack = self.pack(idx)
        tokenizer = self.config.tokenizer
        decode = tokenizer.detokenize if isinstance(tokenizer, SFTTokenizer) else None
        bounds = pack.cu_seqlens
        lengths = [end - start for start, end in itertools.pairwise(bounds)]
        lines = [
            f"sample {idx} packs {self.where(idx)}: cu_seqlens {bounds}, max_seqlen {max(lengths)}",
            f"  {pack.cut_tokens} tokens cut, {pack.left_out} conversations left out; a "
            "'loss' token is a label that takes loss (the token before it predicts it)",
        ]
        for number, (start, end) in enumerate(itertools.pairwise(bounds)):
            lines.append(f"  segment {number} [{start}, {end}): {end - start} tokens")
            lines += describe_tokens(
                pack.tokens[start:end], pack.targets[start:end], decode, tokenizer.pad, first=start
            )
        return lines

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return sample_of(self.pack(idx), self.config.tokenizer.pad)

    def __getitems__(self, indices: Sequence[int | None]) -> CollatedBatch:
        """The samples at ``indices`` collated in one pass, each as ``self[idx]`` reads it (a
        negative index too: it wraps modulo the split's lines, as the seed's ``__getitem__``
        wraps it, not from the end of ``len``); None is a padding sample, the first sample with
        no loss. ``cu_seqlens`` is padded to the longest with its last boundary."""
        samples = []
        for idx in indices:
            sample = self[0 if idx is None else idx]
            if idx is None:
                sample["loss_mask"] = torch.zeros_like(sample["loss_mask"])
            samples.append(sample)
        return CollatedBatch(collate_packed(samples))

    def merge_batches(
        self, batches: Sequence[CollatedBatch], rows: Sequence[Sequence[int]]
    ) -> CollatedBatch:
        """One batch with row ``j`` of ``batches[i]`` at row ``rows[i][j]`` (a blend of SFT
        datasets' batch), ``cu_seqlens`` padded to the longest as ``__getitems__`` pads it."""
        return CollatedBatch(collate_packed(in_row_order(batches, rows)))


def sample_of(pack: Pack, pad: int) -> dict[str, Any]:
    """The sample dict of ``pack``: the row shifted by one, the loss mask, the boundaries."""
    labels = torch.from_numpy(pack.targets[1:].copy())
    loss_mask = torch.ones(len(labels), dtype=torch.float32)
    loss_mask[(labels == pad) | (labels == IGNORE_INDEX)] = 0.0
    cu_seqlens = torch.tensor(pack.cu_seqlens, dtype=torch.int32)
    return {
        "tokens": torch.from_numpy(pack.tokens[:-1].copy()),
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": torch.from_numpy(pack.positions[:-1].astype(numpy.int64)),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": (cu_seqlens[1:] - cu_seqlens[:-1]).max(),
    }


def collate_packed(samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Packed samples stacked into a batch; ``cu_seqlens`` of different lengths padded to the
    longest by repeating each one's last boundary (for one row: torch's default collation)."""
    longest = max(len(sample["cu_seqlens"]) for sample in samples)
    batch = {}
    for key in samples[0]:
        values = [sample[key] for sample in samples]
        if key == "cu_seqlens":
            values = [torch.cat([v, v[-1:].expand(longest - len(v))]) for v in values]
        batch[key] = torch.stack(values)
    return batch
