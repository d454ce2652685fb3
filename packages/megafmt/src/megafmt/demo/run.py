"""What the stages of ``mega demo`` share: the tour's settings, its corpora, and what each stage
leaves for the next.

The tour crosses all four packages, and none of them may depend on the others' code; each
package contributes its stages (entry-point group ``mega.demo_stages``) and they meet only here,
in objects megafmt declares. A stage reads the fields earlier stages filled and fills its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy

from megafmt.tokenizers import Tokenizer, TokenizerOptions


@dataclass(frozen=True)
class DemoSettings:
    """The tour's sizes and Megatron's usual flags."""

    folder: Path
    """Where the corpora, the tokenizer, the cache and the plot go."""
    seq_length: int
    micro_batch_size: int
    steps: int
    """Micro-batches each data-parallel rank reads."""
    samples: tuple[int, int, int]
    """Samples asked of the train, valid and test splits."""
    split: str = "90,8,2"
    seed: int = 1234
    num_workers: int = 2
    data_parallel_size: int = 2
    get_batch_steps: int = 3
    """Micro-batches sent through get_batch on the TP x CP layout."""
    docstrings: int = 20000
    """Most docstrings in the default corpus of the standard library's docstrings."""
    vocab_size: int = 8000
    """The vocabulary of the tokenizer the tour trains when none is given."""


@dataclass
class DemoCorpus:
    """One corpus of the blend, as the stages learn about it."""

    name: str
    prefix: str
    """Path prefix of its ``.bin``/``.idx``."""
    weight: float | None
    source: Path | None = None
    """A jsonl file of its documents, when the tour preprocesses it (a decoded sample is
    looked up in its text)."""
    lengths: numpy.ndarray | None = None
    """Tokens per document, once it is preprocessed and verified."""
    tokens_per_epoch: int | None = None
    """Tokens one epoch of the training split reads from it."""
    epochs_indexed: int | None = None
    samples_read: int = 0


class TrainingSplits(Protocol):
    """What the loader stage needs of a split: a map-style dataset."""

    def __len__(self) -> int: ...

    def __getitem__(self, idx: int) -> Mapping[str, Any]: ...


@dataclass
class DemoRun:
    """The state of one tour, filled stage by stage."""

    settings: DemoSettings
    corpora: list[DemoCorpus] = field(default_factory=list)
    tokenizer_type: str | None = None
    tokenizer_options: TokenizerOptions | None = None
    tokenizer: Tokenizer | None = None
    """The tokenizer the tokenizer stage loaded from ``tokenizer_type`` and its options."""
    eod: int | None = None
    datasets: list[TrainingSplits | None] = field(default_factory=list)
    """The train, valid and test splits of the blend (None: a split of no samples)."""
    weights: list[float] | None = None
    """The blend's normalised weights, as the index stage built it."""
    batches: list[list[Mapping[str, Any]]] = field(default_factory=list)
    """Per data-parallel rank, the micro-batches it read (tensors or arrays by key)."""
    loader_seconds: float | None = None
    checks: dict[str, bool] = field(default_factory=dict)
    """Named checks the stages made; the tour fails if one is False."""
    facts: dict[str, Any] = field(default_factory=dict)
    """Figures for the summary, by name, in the order the stages report them."""
    seconds: dict[str, float] = field(default_factory=dict)
    completed: list[str] = field(default_factory=list)

    def tokenizer_flags(self) -> tuple[str, TokenizerOptions]:
        """``--tokenizer-type`` and the options of the tour's tokenizer, once it has one."""
        if self.tokenizer_type is None:
            raise ValueError("the tour has no tokenizer yet: the tokenizer stage did not run")
        return self.tokenizer_type, self.tokenizer_options or TokenizerOptions()


class DemoStage(Protocol):
    """One stage of ``mega demo``: the entry point names a class, the tour instantiates it."""

    title: str
    """What the stage shows, one line."""
    order: int
    """Where it runs in the tour (lower first)."""
    needs: Sequence[str]
    """Stages that must have completed first; without them it is skipped, and says why."""

    def check(self, run: DemoRun) -> None:
        """Refuse settings the stage cannot work with (a ``ValueError`` naming the flag, what
        it needs and what it was given), before any stage of the tour starts."""
        ...

    def run(self, run: DemoRun) -> None:
        """Do the stage's work on ``run``, printing what it shows."""
        ...
