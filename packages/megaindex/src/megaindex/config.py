"""Dataset configurations, with megatron-core's field names, order and defaults.

``BlendedMegatronDatasetConfig`` and ``GPTDatasetConfig`` are drop-in: the same keyword
arguments, or the same positional ones, build the same configuration and, through it, the
same cache keys. Validation that megatron-core does with ``assert`` raises
:class:`~megaindex.errors.ConfigError` here (an ``AssertionError`` and a ``ValueError``).

The additions are keyword-only fields after megatron-core's (so megatron-core's positional
order holds for both classes, subclass fields included): ``barrier_timeout`` bounds how long
ranks wait for each other while building (megatron-core hangs); ``stale_cache`` says what to
do when a cached index was built from a corpus that has changed since ("rebuild" with a
warning, or "error"); ``padded_vocab_size`` and ``check_token_ids`` say which token ids a
sample may hold (those the model's padded vocabulary has rows for; any, with the check off);
``resume_with_new_mix`` continues a run under a new blend (:mod:`megaindex.mix_resume`).
Code reads them through :func:`own_field`, so megatron-core's configs, which lack them, are
read with their defaults.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy

from megafmt.protocols import conforms
from megaindex.errors import ConfigError
from megaindex.utils import Split, normalize

if TYPE_CHECKING:  # mix_resume reads the datasets, which read this module
    from megaindex.mix_resume import MixState

logger = logging.getLogger(__name__)

STALE_CACHE_CHOICES = ("rebuild", "error")


@runtime_checkable
class SizedVocabulary(Protocol):
    """A tokenizer that states its vocabulary size (Megatron's do): every id is below it."""

    @property
    def vocab_size(self) -> int: ...


@runtime_checkable
class UniquelyIdentified(Protocol):
    """An object a dataset's description holds by its identifiers (Megatron's tokenizers)."""

    @property
    def unique_identifiers(self) -> Any: ...


@runtime_checkable
class EndOfDocument(Protocol):
    """A tokenizer that states its end-of-document id (Megatron's do)."""

    @property
    def eod(self) -> int: ...


def own_field(config: Any, owner: type, name: str) -> Any:
    """Field ``name``, one that megaindex's config class ``owner`` adds to megatron-core's (such
    as ``barrier_timeout`` or ``stale_cache``): ``config``'s value when it is an ``owner``, else
    the field's declared default. So megatron-core's and Megatron-LM's own configs, which lack
    these fields (a partly switched Megatron-LM hands them over), build and read as ours do."""
    if isinstance(config, owner):
        return getattr(config, name)
    for declared in dataclasses.fields(owner):
        if declared.name == name:
            return declared.default
    raise ConfigError(f"{owner.__name__} declares no field {name!r}")


def tokenizer_vocab_size(config: Any) -> int | None:
    """The vocabulary size ``config``'s tokenizer states (every id is below it), or None; for
    megatron-core's configs too, which lack the ``vocab_size`` property of ours."""
    tokenizer = config.tokenizer
    return tokenizer.vocab_size if conforms(tokenizer, SizedVocabulary) else None


@dataclass
class BlendedMegatronDatasetConfig:
    """How to build every split of a (possibly blended) dataset."""

    random_seed: int
    """The seed of every random draw made while building indices."""

    sequence_length: int
    """Tokens per sample (labels take one more when add_extra_token_to_sequence)."""

    blend: tuple[list[str], list[float] | None] | None = None
    """Dataset prefixes and optional weights, e.g. (["web", "code"], [0.3, 0.7])."""

    blend_per_split: list[tuple[list[str], list[float] | None] | None] | None = None
    """One blend per split (train, valid, test) instead of ``blend`` and ``split``."""

    multiple_validation_sets: bool | None = None
    """Keep the validation datasets of a blend separate instead of blending them."""

    full_validation: bool | None = None
    """Run a full epoch of validation each time validation occurs."""

    split: str | None = None
    """Comma-separated weights of the train, valid and test parts, e.g. "99,1,0"."""

    split_matrix: list[tuple[float, float] | None] | None = field(init=False, default=None)
    """The [begin, end) fraction of the corpus each split covers, derived from ``split``."""

    num_dataset_builder_threads: int = 1
    """Threads that build the datasets of a blend in parallel."""

    path_to_cache: str | None = None
    """Where index tables are cached; default: ``<prefix>/cache/<Class>_indices``."""

    mmap_bin_files: bool = True
    """Memory-map the .bin files (else positional reads)."""

    mock: bool = field(init=False, default=False)
    """Generate mock data: set when neither ``blend`` nor ``blend_per_split`` is given."""

    tokenizer: Any = None
    """The tokenizer: its ``eod``, ``pad``, ``vocab_size`` and ``unique_identifiers`` are used."""

    mid_level_dataset_surplus: float = 0.005
    """Extra fraction of samples each blended dataset builds beyond its share."""

    allow_ambiguous_pad_tokens: bool | None = False
    """Keep masking a pad id that collides with another special token (not recommended)."""

    fast_cache_load: bool = False
    """Trust that every cache exists and skip checking it (needs ``path_to_cache``)."""

    defer_npy_index_mmap: bool = False
    """Map the cached tables on first access instead of at construction."""

    _: KW_ONLY
    # megaindex's own fields: keyword-only, so positional arguments are megatron-core's

    barrier_timeout: float | None = 1800.0
    """Seconds a rank waits at a dataset-building barrier before failing with the ranks that
    never arrived (None: wait as long as the process group allows)."""

    resume_with_new_mix: MixState | None = None
    """Off (None, the default): the training split is Megatron's blend. Given the per-corpus
    state a loader saved (:class:`~megaindex.mix_resume.MixState`), the training blend continues
    each corpus at its next unseen sample, blended by this config's weights from the saved
    count on (:class:`~megaindex.mix_resume.MixResumedBlend`)."""

    def __post_init__(self) -> None:
        if self.fast_cache_load:
            if self.path_to_cache is None:
                raise ConfigError("fast_cache_load needs path_to_cache (--data-cache-path)")
            if self.blend is not None:
                raise ConfigError(
                    "fast_cache_load cannot be used with blend (--data-path); give the splits "
                    "with blend_per_split (--per-split-data-args-path or --train-data-path, "
                    "--valid-data-path and --test-data-path) instead"
                )
        if self.defer_npy_index_mmap and self.path_to_cache is None:
            raise ConfigError("defer_npy_index_mmap needs path_to_cache (--data-cache-path)")
        if self.blend_per_split is not None and any(self.blend_per_split):
            self._check_blend_per_split()
            return
        if self.blend is not None:
            _check_blend("blend", self.blend)
            if self.split is None:
                raise ConfigError("split must be given with blend, e.g. split='99,1,0'")
        else:
            self.mock = True
            logger.info("mock = True, as both blend and blend_per_split are None")
            self.split = "1,1,1"
            logger.info("split = %s, an arbitrary even split, as mock is True", self.split)
        self.split_matrix = convert_split_vector_to_split_matrix(
            parse_and_normalize_split(self.split)
        )
        logger.info("split_matrix = %s", self.split_matrix)

    def _check_blend_per_split(self) -> None:
        if self.blend is not None:
            raise ConfigError("blend and blend_per_split cannot both be given")
        if self.split is not None:
            raise ConfigError("split and blend_per_split cannot both be given")
        if len(self.blend_per_split) != len(Split):
            raise ConfigError(
                f"blend_per_split must hold {len(Split)} blends (train, valid, test), got "
                f"{len(self.blend_per_split)}"
            )
        for split in Split:
            blend = self.blend_per_split[split.value]
            if blend is None:
                logger.info("no blend given for the %s split", split.name)
            else:
                _check_blend(f"blend_per_split[{split.name}]", blend)


def _check_blend(name: str, blend: Any) -> None:
    prefixes, weights = blend
    if weights is not None and len(prefixes) != len(weights):
        raise ConfigError(
            f"{name} has {len(prefixes)} prefixes but {len(weights)} weights; they must pair up"
        )


@dataclass
class GPTDatasetConfig(BlendedMegatronDatasetConfig):
    """How to build GPT datasets: the base configuration plus sample construction options."""

    reset_position_ids: bool | None = None
    """Restart position ids after every end-of-document token."""

    reset_attention_mask: bool | None = None
    """Stop attention across end-of-document tokens."""

    eod_mask_loss: bool | None = None
    """Exclude end-of-document tokens from the loss."""

    create_attention_mask: bool = True
    """Build the attention mask (off when the attention kernel makes its own)."""

    drop_last_partial_validation_sequence: bool = True
    """Drop the last, shorter validation sample."""

    add_extra_token_to_sequence: bool = True
    """Draw one token more than the sequence length, so inputs and labels both have it."""

    object_storage_cache_path: str | None = None
    """Local directory for the .idx files of corpora in object storage."""

    data_parallel_size: int = 1
    """Data-parallel size (used for padding packed sequences)."""

    sequence_parallel_size: int = 0
    """Sequence-parallel size, 0 when sequence parallelism is off."""

    hybrid_context_parallel: bool = False
    """Hybrid context parallelism (samples divisible by dp * cp * 2)."""

    sequences_per_dataset: dict[str, Any] | None = None
    """[sequence count, document count] per prefix (Megatron-LM's
    ``--per-dataset-sequences-path``); checked against each ``.idx`` header on every path, and
    a disagreement is a :class:`~megaindex.errors.SequenceCountError`."""

    token_dtype_code: int | None = field(init=False, default=None)
    """The .bin dtype code implied by the vocabulary: 4 (int32) above 65536 ids, else 8.
    megatron-core reads corpora listed in ``sequences_per_dataset`` in it; megaindex reads
    them in their header's dtype and warns when the two differ."""

    context_parallel_size: int | None = None
    """The context-parallel size (padding of packed sequences)."""

    _: KW_ONLY

    stale_cache: str = "rebuild"
    """When a cached index was built from a corpus that changed since: "rebuild" it with a
    warning that says what changed, or "error"."""

    padded_vocab_size: int | None = None
    """The model's vocabulary size: the tokenizer's, padded as Megatron-LM pads it
    (:func:`padded_vocab_size`); the embedding has a row for every id below it. None: the
    padded size in Megatron-LM's arguments when a Megatron-LM run builds the dataset, else the
    tokenizer's ``vocab_size``."""

    check_token_ids: bool = True
    """Refuse a sample holding an id at or past the model's vocabulary size (a
    :class:`~megaindex.errors.TokenRangeError`); False reads every id, as megatron-core does."""

    @property
    def vocab_size(self) -> int | None:
        """The tokenizer's vocabulary size, when it states one (token ids are below it)."""
        return tokenizer_vocab_size(self)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokenizer is None:
            raise ConfigError("GPTDatasetConfig needs a tokenizer (for its eod and pad ids)")
        for name in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss"):
            if getattr(self, name) is None:
                raise ConfigError(f"GPTDatasetConfig needs {name} set to True or False")
        _check_padded_vocab_size(self.padded_vocab_size, self.vocab_size)
        if self.stale_cache not in STALE_CACHE_CHOICES:
            raise ConfigError(
                f"stale_cache must be one of {', '.join(STALE_CACHE_CHOICES)}, got "
                f"{self.stale_cache!r}"
            )
        vocab_size = self.vocab_size
        self.token_dtype_code = (
            None
            if vocab_size is None
            else (4 if vocab_size > numpy.iinfo(numpy.uint16).max + 1 else 8)
        )
        if self.sequences_per_dataset is not None and self.token_dtype_code is None:
            raise ConfigError(
                "sequences_per_dataset needs the tokenizer's vocab_size to know the token dtype"
            )


def padded_vocab_size(
    vocab_size: int, make_vocab_size_divisible_by: int = 128, tensor_model_parallel_size: int = 1
) -> int:
    """Megatron-LM's padded vocabulary (``--make-vocab-size-divisible-by``, default 128, times
    ``--tensor-model-parallel-size``): ``vocab_size`` rounded up to a multiple of that product,
    so that every tensor-parallel rank holds as many embedding rows."""
    for name, value in (
        ("vocab_size", vocab_size),
        ("make_vocab_size_divisible_by", make_vocab_size_divisible_by),
        ("tensor_model_parallel_size", tensor_model_parallel_size),
    ):
        if not (isinstance(value, int) and value > 0):
            raise ConfigError(f"{name} must be a positive integer, found {value!r}")
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple


def _check_padded_vocab_size(padded: int | None, vocab_size: int | None) -> None:
    """Refuse a ``padded_vocab_size`` that is not a positive integer, or one below the
    tokenizer's vocabulary (padding only adds rows)."""
    if padded is None:
        return
    if not (isinstance(padded, int) and padded > 0):
        raise ConfigError(f"padded_vocab_size must be a positive integer, found {padded!r}")
    if vocab_size is not None and padded < vocab_size:
        raise ConfigError(
            f"padded_vocab_size {padded} is below the tokenizer's vocab_size {vocab_size}; "
            "padding only adds rows: give the model's vocabulary size, or leave it None"
        )


def parse_and_normalize_split(split: str) -> list[float]:
    """ "99,1,0" -> [0.99, 0.01, 0.0]: up to three non-negative weights, normalised."""
    items = re.findall(r"-?[.0-9]+", split)
    values = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(f"split {split!r}: {item!r} is not a number") from None
        if value < 0:
            raise ConfigError(f"split {split!r}: weights must be >= 0, found {item}")
        values.append(value)
    if len(values) > len(Split):
        raise ConfigError(
            f"split {split!r} has {len(values)} weights; at most {len(Split)} (train, valid, test)"
        )
    values += [0.0] * (len(Split) - len(values))
    if sum(values) <= 0:
        raise ConfigError(f"split {split!r}: at least one weight must be positive")
    return normalize(values)


def convert_split_vector_to_split_matrix(
    vector_a: list[float], vector_b: list[float] | None = None
) -> list[tuple[float, float] | None]:
    """The [begin, end) bookends of each split, e.g. [0.99, 0.01, 0.0] ->
    [(0, 0.99), (0.99, 1.0), None]. With ``vector_b`` each split is the overlap of both."""
    if vector_b is None:
        vector_b = vector_a
    ends_a = list(itertools.accumulate(vector_a, initial=0))
    ends_b = list(itertools.accumulate(vector_b, initial=0))
    matrix: list[tuple[float, float] | None] = []
    for (a_begin, a_end), (b_begin, b_end) in zip(
        itertools.pairwise(ends_a), itertools.pairwise(ends_b), strict=False
    ):
        begin, end = max(a_begin, b_begin), min(a_end, b_end)
        matrix.append(None if end <= begin else (begin, end))
    return matrix
