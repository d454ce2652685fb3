"""Mock GPT data, identical to megatron-core's, for runs without a corpus.

The low-level dataset holds 100000 documents of random length below 4096 (numpy's
``default_rng(0)``); document i counts 1, 2, ... (modulo the vocabulary) and ends with EOD.
"""

from __future__ import annotations

from typing import Any

import numpy

from megaindex.config import GPTDatasetConfig
from megaindex.errors import ConfigError
from megaindex.gpt_dataset import GPTDataset
from megaindex.utils import Split


class MockGPTLowLevelDataset:
    """Synthetic documents shaped like a tokenized corpus."""

    seed: int = 0
    size: int = 100000
    max_sequence_length: int = 4096

    def __init__(self, tokenizer: Any) -> None:
        self.vocab_size = tokenizer.vocab_size
        self.eod_token = tokenizer.eod
        rng = numpy.random.default_rng(seed=self.seed)
        self.sequence_lengths = rng.integers(
            low=1, high=self.max_sequence_length, size=self.size, dtype=numpy.int32
        )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> numpy.ndarray:
        length = int(self.sequence_lengths[idx])
        document = numpy.empty(length, dtype=numpy.int64)
        document[:-1] = (numpy.arange(length - 1) + 1) % self.vocab_size
        document[-1] = self.eod_token
        return document

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> numpy.ndarray:
        """Tokens ``offset`` to ``offset + length`` of document ``idx``."""
        if length is None:
            length = int(self.sequence_lengths[idx]) - offset
        return self[idx][offset : offset + length]


class MockGPTDataset(GPTDataset):
    """A GPTDataset over :class:`MockGPTLowLevelDataset`."""

    def __init__(
        self,
        dataset: MockGPTLowLevelDataset,
        dataset_path: str | None,
        indices: numpy.ndarray,
        num_samples: int,
        index_split: Split,
        config: GPTDatasetConfig,
    ) -> None:
        if not config.mock:
            raise ConfigError(
                "MockGPTDataset needs a mock config (neither blend nor blend_per_split given)"
            )
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: MockGPTLowLevelDataset) -> int:
        return len(low_level_dataset)

    @staticmethod
    def build_low_level_dataset(  # type: ignore[override]
        dataset_path: str | None, config: GPTDatasetConfig
    ) -> MockGPTLowLevelDataset:
        return MockGPTLowLevelDataset(config.tokenizer)
