"""Turning a window of token ids into the sample dict GPTDataset returns.

Values, dtypes, shapes and key order equal megatron-core's for every combination of
``reset_position_ids``, ``reset_attention_mask``, ``eod_mask_loss``, ``create_attention_mask``,
``add_extra_token_to_sequence`` and padding. megatron-core loops over end-of-document tokens in
Python, rewriting blocks of an S x S float mask; here each document's extent is computed once
(``segment_start``) and the mask rows are filled directly, and whatever does not depend on the
data (the causal mask, the position ids without resets) is built once per dataset.

Tensors that do not depend on the data are shared between samples, as megatron-core shares its
cached ones: do not modify a returned ``attention_mask`` or (without resets) ``position_ids`` in
place. As in megatron-core, ``labels`` is a view of the same buffer as ``tokens``, one token on.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from megaindex.backends import implementation


def segment_starts(tokens: numpy.ndarray, eod: int) -> numpy.ndarray:
    """For each position, where its document begins inside the window (after the last EOD)."""
    starts = numpy.zeros(len(tokens), dtype=numpy.int64)
    boundaries = numpy.flatnonzero(tokens == eod) + 1
    boundaries = boundaries[boundaries < len(tokens)]
    starts[boundaries] = boundaries
    numpy.maximum.accumulate(starts, out=starts)
    return starts


class SampleMaker:
    """Builds sample dicts for one dataset configuration."""

    def __init__(self, config: Any, pad_token_id: int) -> None:
        self.sequence_length = config.sequence_length
        self.extra = bool(config.add_extra_token_to_sequence)
        self.pad = pad_token_id
        self.eod = config.tokenizer.eod
        self.reset_position_ids = bool(config.reset_position_ids)
        self.reset_attention_mask = bool(config.reset_attention_mask)
        self.eod_mask_loss = bool(config.eod_mask_loss)
        self.create_attention_mask = bool(config.create_attention_mask)
        self.needs_segments = self.reset_position_ids or (
            self.reset_attention_mask and self.create_attention_mask
        )
        self._causal_mask: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None

    @property
    def causal_mask(self) -> torch.Tensor:
        """``[1, S, S]`` bool, True above the diagonal (masked); built once."""
        if self._causal_mask is None:
            length = self.sequence_length
            self._causal_mask = torch.ones(length, length, dtype=torch.bool).triu_(1).unsqueeze(0)
        return self._causal_mask

    @property
    def positions(self) -> torch.Tensor:
        """``0..S-1`` as int64; built once."""
        if self._positions is None:
            self._positions = torch.arange(self.sequence_length, dtype=torch.long)
        return self._positions

    def __call__(self, text: numpy.ndarray, padding_sample: bool = False) -> dict[str, Any]:
        """The sample for ``text`` (int64, ``S + 1`` ids with the extra token, else ``S``).

        ``text`` is modified in place (pad ids become 0) and shared by ``tokens`` and ``labels``.
        ``padding_sample`` (megatron-core's ``idx=None``) zeroes the whole loss mask.
        """
        if self.extra:
            tokens, labels = text[:-1], text[1:]
        else:
            tokens = text
            labels = numpy.empty_like(text)
            labels[:-1] = text[1:]
            labels[-1] = self.pad

        loss_mask = numpy.ones(self.sequence_length, dtype=numpy.float32)
        if self.eod_mask_loss:
            loss_mask[tokens == self.eod] = 0.0
        starts = segment_starts(tokens, self.eod) if self.needs_segments else None
        if self.reset_position_ids:
            position_ids = torch.from_numpy(numpy.arange(self.sequence_length) - starts)
        else:
            position_ids = self.positions
        if not self.create_attention_mask:
            attention_mask = None
        elif self.reset_attention_mask:
            mask = numpy.empty((self.sequence_length, self.sequence_length), dtype=numpy.bool_)
            implementation().fill_document_causal_mask(starts, mask, torch.get_num_threads())
            attention_mask = torch.from_numpy(mask).unsqueeze(0)
        else:
            attention_mask = self.causal_mask

        # pad ids: no loss where the label is one, and 0 in tokens and labels (embeddable)
        is_pad = text == self.pad
        if self.extra:
            if is_pad.any():
                loss_mask[is_pad[1:]] = 0.0
                text[is_pad] = 0
        else:
            label_is_pad = labels == self.pad
            loss_mask[label_is_pad] = 0.0
            labels[label_is_pad] = 0
            text[is_pad] = 0
        if padding_sample:
            loss_mask[:] = 0.0

        sample = {"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels)}
        if attention_mask is not None:
            sample["attention_mask"] = attention_mask
        sample["loss_mask"] = torch.from_numpy(loss_mask)
        sample["position_ids"] = position_ids
        return sample
