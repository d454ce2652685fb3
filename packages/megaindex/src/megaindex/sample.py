"""Turning windows of token ids into the samples GPTDataset returns, one or a batch at a time.

Values, dtypes, shapes and key order equal megatron-core's for every combination of
``reset_position_ids``, ``reset_attention_mask``, ``eod_mask_loss``, ``create_attention_mask``,
``add_extra_token_to_sequence`` and padding; a batch equals torch's default collation of the
samples. megatron-core loops over end-of-document tokens in Python, rewriting blocks of an
S x S float mask; here each document's extent is computed once for the whole batch
(``segment_starts``) and mask rows are filled directly.

A lone sample is made around its window: tokens and labels are views of it (overlapping by
all but one position, as megatron-core's are). A batch keeps tokens, labels, position ids and
loss mask in one allocation.
Tensors that do not depend on the data are built once and shared, as megatron-core shares its
cached ones: without resets a sample's ``position_ids`` is one cached tensor; without
``reset_attention_mask`` its ``attention_mask`` is one cached tensor, and a batch's is that
tensor expanded over the batch (equal values, stride 0 on the batch dimension; call
``.contiguous()`` for a dense copy). They are shared by every dataset of equal sample settings
(:meth:`SampleMaker.shared`: all the corpora of a blend): do not modify them in place.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy
import torch

from megaindex.helpers import fill_document_causal_mask
from megaindex.memory import check_fits


def segment_starts(tokens: numpy.ndarray, eod: int) -> numpy.ndarray:
    """For each position (of each row), where its document begins inside the window: just after
    the last EOD before it, or 0."""
    tokens = numpy.atleast_2d(tokens)
    positions = numpy.arange(tokens.shape[1])
    starts = numpy.zeros(tokens.shape, dtype=numpy.int64)
    starts[:, 1:] = numpy.where(tokens[:, :-1] == eod, positions[1:], 0)
    return numpy.maximum.accumulate(starts, axis=1)


#: the live makers, by their settings (:meth:`SampleMaker.shared`)
_SHARED_MAKERS: weakref.WeakValueDictionary[tuple, SampleMaker] = weakref.WeakValueDictionary()


class SampleMaker:
    """Builds samples and batches for one dataset configuration."""

    @classmethod
    def shared(cls, config: Any, pad_token_id: int) -> SampleMaker:
        """The maker of ``config``'s samples, one for every dataset of equal settings while any
        holds it: its position ids and causal mask (an S x S mask with
        ``create_attention_mask``) are built once for a blend of thousands of corpora, not once
        per corpus."""
        made = cls(config, pad_token_id)
        try:
            return _SHARED_MAKERS.setdefault(made.settings, made)
        except TypeError:  # settings that do not hash (a 0-d array as the EOD id): its own
            return made

    def __init__(self, config: Any, pad_token_id: int) -> None:
        self.sequence_length = config.sequence_length
        self.extra = bool(config.add_extra_token_to_sequence)
        self.pad = pad_token_id
        self.eod = config.tokenizer.eod
        self.reset_position_ids = bool(config.reset_position_ids)
        self.reset_attention_mask = bool(config.reset_attention_mask)
        self.eod_mask_loss = bool(config.eod_mask_loss)
        self.create_attention_mask = bool(config.create_attention_mask)
        #: what decides the samples made from a window: equal settings, equal samples
        self.settings = (
            self.sequence_length,
            self.extra,
            self.pad,
            self.eod,
            self.reset_position_ids,
            self.reset_attention_mask,
            self.eod_mask_loss,
            self.create_attention_mask,
        )
        self._needs_starts = self.reset_position_ids or (
            self.reset_attention_mask and self.create_attention_mask
        )
        self._check_fits()
        self._causal_mask: torch.Tensor | None = None
        self._expanded_masks: dict[int, torch.Tensor] = {}
        self._position_tensor: torch.Tensor | None = None
        self._position_array: numpy.ndarray | None = None

    def _check_fits(self) -> None:
        """Refuse a sequence length whose samples cannot fit in memory, before allocating."""
        length = self.sequence_length
        parts = {"a sample's tokens, labels and positions": 40 * (length + 1)}
        sizing = f"sequence_length {length}"
        if self.create_attention_mask:
            parts["its attention mask"] = length * length
            sizing += " with create_attention_mask (length squared)"
        check_fits("GPTDataset samples", parts, sizing)

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
        cannot hold the id), which spares a scan for it.

        ``text`` becomes the sample's storage: tokens and labels are views of it (with the
        extra token they overlap, one position apart, as megatron-core's do)."""
        length = self.sequence_length
        tokens = text[:length]
        if self.extra:
            labels = text[1 : length + 1]
        else:
            labels = numpy.empty(length, dtype=numpy.int64)
            labels[:-1] = text[1:length]
            labels[-1] = self.pad
        loss_mask = torch.ones(length, dtype=torch.float32)
        starts = None
        if self.eod_mask_loss or self._needs_starts:
            starts = self._mask_loss_and_segments(tokens[None], loss_mask.numpy()[None])
        sample: dict[str, Any] = {
            "tokens": torch.from_numpy(tokens),
            "labels": torch.from_numpy(labels),
        }
        if self.create_attention_mask:
            sample["attention_mask"] = (
                torch.from_numpy(self._document_masks(starts)[0])
                if self.reset_attention_mask
                else self.causal_mask
            )
        sample["loss_mask"] = loss_mask
        sample["position_ids"] = (
            torch.from_numpy(self._positions - starts[0])
            if self.reset_position_ids
            else self.positions
        )
        if self._holds_pads(text, may_hold_pad):
            self._clear_pads(tokens[None], labels[None], loss_mask.numpy()[None])
        if padding_sample:
            loss_mask.zero_()
        return sample

    def _batch_causal_mask(self, rows: int) -> torch.Tensor:
        """The causal mask expanded over ``rows`` samples (a view: stride 0 over the batch)."""
        mask = self._expanded_masks.get(rows)
        if mask is None:
            length = self.sequence_length
            mask = self._expanded_masks[rows] = self.causal_mask.expand(rows, 1, length, length)
        return mask

    @property
    def _positions(self) -> numpy.ndarray:
        """``0 .. S-1`` (int64); built once, when a first sample needs it."""
        if self._position_array is None:
            self._position_array = numpy.arange(self.sequence_length)
        return self._position_array

    @property
    def positions(self) -> torch.Tensor:
        """``[S]`` int64 position ids without resets; built once."""
        if self._position_tensor is None:
            self._position_tensor = torch.from_numpy(self._positions.copy())
        return self._position_tensor

    def batch(
        self, texts: numpy.ndarray, padding: list[bool], may_hold_pad: bool = True
    ) -> dict[str, Any]:
        """The collated samples of the rows of ``texts`` (int64, ``[B, S (+1)]``): tokens,
        labels and position ids (int64) then the loss mask (float32), one allocation. (Each
        tensor is made from its numpy view: torch's own view operations cost microseconds.)"""
        rows, length = len(texts), self.sequence_length
        size = rows * length
        buffer = numpy.empty(size * 28, dtype=numpy.uint8)
        tokens_np, labels_np, positions_np = (
            buffer[: size * 24].view(numpy.int64).reshape(3, rows, length)
        )
        loss_np = buffer[size * 24 :].view(numpy.float32).reshape(rows, length)
        loss_np.fill(1.0)
        tokens_np[:] = texts[:, :length]
        labels_np[:, : length - 1] = texts[:, 1:length]
        labels_np[:, length - 1] = texts[:, length] if self.extra else self.pad
        starts = self._mask_loss_and_segments(tokens_np, loss_np)
        positions_np[:] = self._positions
        if self.reset_position_ids:
            positions_np -= starts
        sample: dict[str, Any] = {
            "tokens": torch.from_numpy(tokens_np),
            "labels": torch.from_numpy(labels_np),
        }
        if self.create_attention_mask:
            sample["attention_mask"] = (
                torch.from_numpy(self._document_masks(starts))
                if self.reset_attention_mask
                else self._batch_causal_mask(rows)
            )
        sample["loss_mask"] = torch.from_numpy(loss_np)
        sample["position_ids"] = torch.from_numpy(positions_np)
        if self._holds_pads(texts, may_hold_pad):
            self._clear_pads(tokens_np, labels_np, loss_np)
        if any(padding):
            loss_np[numpy.asarray(padding, dtype=bool)] = 0.0
        return sample

    def _mask_loss_and_segments(
        self, tokens: numpy.ndarray, loss: numpy.ndarray
    ) -> numpy.ndarray | None:
        """No loss on EOD with ``eod_mask_loss``; where each position's document starts when
        position ids or the attention mask reset at documents (else None)."""
        if self.eod_mask_loss:
            loss[tokens == self.eod] = 0.0
        return segment_starts(tokens, self.eod) if self._needs_starts else None

    def _document_masks(self, starts: numpy.ndarray) -> numpy.ndarray:
        """``[B, 1, S, S]`` bool: causal attention within each document of each row."""
        rows, length = starts.shape
        mask = numpy.empty((rows, 1, length, length), dtype=numpy.bool_)
        threads = torch.get_num_threads()
        for row in range(rows):
            fill_document_causal_mask(starts[row], mask[row, 0], threads)
        return mask

    def _holds_pads(self, texts: numpy.ndarray, may_hold_pad: bool) -> bool:
        """Whether pads must be cleared: without the extra token the last label always is one;
        otherwise a window holds none unless it was padded (or the pad id is a real token)."""
        return not self.extra or (may_hold_pad and bool((texts == self.pad).any()))

    def _clear_pads(
        self, tokens: numpy.ndarray, labels: numpy.ndarray, loss: numpy.ndarray
    ) -> None:
        """No loss where the label is the pad id, and 0 in tokens and labels instead of it (an
        id the embedding takes). Both masks are found before either array changes: tokens and
        labels may share memory."""
        label_is_pad = labels == self.pad
        token_is_pad = tokens == self.pad
        loss[label_is_pad] = 0.0
        labels[label_is_pad] = 0
        tokens[token_is_pad] = 0
