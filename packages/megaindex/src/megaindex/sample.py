"""Turning windows of token ids into the samples GPTDataset returns, one or a batch at a time.

Values, dtypes, shapes and key order equal megatron-core's for every combination of
``reset_position_ids``, ``reset_attention_mask``, ``eod_mask_loss``, ``create_attention_mask``,
``add_extra_token_to_sequence`` and padding; a batch equals torch's default collation of the
samples. megatron-core loops over end-of-document tokens in Python, rewriting blocks of an
S x S float mask; here each document's extent is computed once for the whole batch
(``segment_starts``) and mask rows are filled directly.

A batch keeps tokens, labels, loss mask and position ids in one buffer, so a DataLoader worker
hands it to the trainer as one block of shared memory (a lone sample is never handed over
that way: it gets plain tensors). Tensors that do not depend on the data are
built once and shared, as megatron-core shares its cached ones: without
``reset_attention_mask`` a single sample's ``attention_mask`` is one cached tensor and a
batch's is that tensor expanded over the batch (equal values, stride 0 on the batch
dimension; call ``.contiguous()`` for a dense copy). Do not modify them in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy
import torch

from megaindex.helpers import fill_document_causal_mask


def segment_starts(tokens: numpy.ndarray, eod: int) -> numpy.ndarray:
    """For each position (of each row), where its document begins inside the window: just after
    the last EOD before it, or 0."""
    tokens = numpy.atleast_2d(tokens)
    positions = numpy.arange(tokens.shape[1])
    starts = numpy.zeros(tokens.shape, dtype=numpy.int64)
    starts[:, 1:] = numpy.where(tokens[:, :-1] == eod, positions[1:], 0)
    return numpy.maximum.accumulate(starts, axis=1)


class CollatedSamples(Sequence):
    """The samples of a batch as torch's ``__getitems__`` protocol wants them: a sequence of
    sample dicts, which any ``collate_fn`` (torch's default one, Megatron-LM's loader) takes as
    it takes ``[dataset[i] for i in indices]``. ``collated`` holds what torch's default
    collation gives, built in one pass; a loader that knows it (megaload) uses it as it is, and
    no sample is made one by one. Each sample is a view of its row, made when asked for."""

    def __init__(self, collated: dict[str, Any]) -> None:
        self.collated = collated
        self._rows = len(collated["tokens"])

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, row: Any) -> Any:
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(self._rows))]
        if not -self._rows <= row < self._rows:
            raise IndexError(f"sample {row} of a batch of {self._rows}")
        return {key: value[row] for key, value in self.collated.items()}


class SampleMaker:
    """Builds samples and batches for one dataset configuration."""

    def __init__(self, config: Any, pad_token_id: int) -> None:
        self.sequence_length = config.sequence_length
        self.extra = bool(config.add_extra_token_to_sequence)
        self.pad = pad_token_id
        self.eod = config.tokenizer.eod
        self.reset_position_ids = bool(config.reset_position_ids)
        self.reset_attention_mask = bool(config.reset_attention_mask)
        self.eod_mask_loss = bool(config.eod_mask_loss)
        self.create_attention_mask = bool(config.create_attention_mask)
        self._causal_mask: torch.Tensor | None = None
        self._positions = numpy.arange(self.sequence_length)

    @property
    def causal_mask(self) -> torch.Tensor:
        """``[1, S, S]`` bool, True above the diagonal (masked); built once."""
        if self._causal_mask is None:
            length = self.sequence_length
            self._causal_mask = torch.ones(length, length, dtype=torch.bool).triu_(1).unsqueeze(0)
        return self._causal_mask

    def __call__(
        self, text: numpy.ndarray, padding_sample: bool = False, may_hold_pad: bool = True
    ) -> dict[str, Any]:
        """The sample for ``text`` (int64, ``S + 1`` ids with the extra token, else ``S``);
        ``padding_sample`` (megatron-core's ``idx=None``) zeroes its loss mask. ``may_hold_pad``
        False says the text holds no pad id (its window was not padded, and the corpus's dtype
        cannot hold the id), which spares a scan for it."""
        return self._make(text[None, :], [padding_sample], True, may_hold_pad)

    def batch(
        self, texts: numpy.ndarray, padding: list[bool], may_hold_pad: bool = True
    ) -> dict[str, Any]:
        """The collated samples of the rows of ``texts`` (int64, ``[B, S (+1)]``)."""
        return self._make(texts, padding, False, may_hold_pad)

    def _make(
        self, texts: numpy.ndarray, padding: list[bool], single: bool, may_hold_pad: bool
    ) -> dict[str, Any]:
        rows, length = len(texts), self.sequence_length
        size = rows * length
        if single:
            integers = numpy.empty((3, length), dtype=numpy.int64)
            tokens, labels, position_ids = torch.from_numpy(integers).unbind(0)
            loss_mask = torch.ones(length, dtype=torch.float32)
        else:  # int64 tokens, labels and positions, then float32 loss mask: one buffer
            buffer = torch.empty(size * 28, dtype=torch.uint8)
            block = buffer[: size * 24].view(torch.int64)
            tokens, labels, position_ids = block.view(3, rows, length).unbind(0)
            loss_mask = buffer[size * 24 :].view(torch.float32).view(rows, length)
            loss_mask.fill_(1.0)
            integers = block.numpy()
        tokens_np, labels_np, positions_np = integers.reshape(3, rows, length)
        loss_np = loss_mask.numpy().reshape(rows, length)
        tokens_np[:] = texts[:, :length]
        labels_np[:, : length - 1] = texts[:, 1:length]
        labels_np[:, length - 1] = texts[:, length] if self.extra else self.pad

        if self.eod_mask_loss:
            loss_np[tokens_np == self.eod] = 0.0
        needs_starts = self.reset_position_ids or (
            self.reset_attention_mask and self.create_attention_mask
        )
        starts = segment_starts(tokens_np, self.eod) if needs_starts else None
        positions_np[:] = self._positions
        if self.reset_position_ids:
            positions_np -= starts

        sample: dict[str, Any] = {"tokens": tokens, "labels": labels}
        if self.create_attention_mask:
            if self.reset_attention_mask:
                mask = numpy.empty((rows, 1, length, length), dtype=numpy.bool_)
                threads = torch.get_num_threads()
                for row in range(rows):
                    fill_document_causal_mask(starts[row], mask[row, 0], threads)
                sample["attention_mask"] = torch.from_numpy(mask[0] if single else mask)
            elif single:
                sample["attention_mask"] = self.causal_mask
            else:
                sample["attention_mask"] = self.causal_mask.expand(rows, 1, length, length)
        sample["loss_mask"] = loss_mask
        sample["position_ids"] = position_ids

        # pad ids: no loss where the label is one, and 0 in tokens and labels (embeddable);
        # the window holds none unless it was padded (or the pad id is a real token)
        if not self.extra or (may_hold_pad and (texts == self.pad).any()):
            label_is_pad = labels_np == self.pad
            loss_np[label_is_pad] = 0.0
            labels_np[label_is_pad] = 0
            tokens_np[tokens_np == self.pad] = 0
        if any(padding):
            loss_np[numpy.asarray(padding, dtype=bool)] = 0.0
        return sample
