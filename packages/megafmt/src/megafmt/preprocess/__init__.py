"""``mega preprocess``: tokenize jsonl (or parquet) corpora into Megatron ``.bin``/``.idx`` pairs,
byte-identical to Megatron-LM's tools/preprocess_data.py for the same input and flags."""

from megafmt.preprocess.pipeline import (
    BadInputError,
    PreprocessConfig,
    PreprocessSummary,
    preprocess,
)
from megafmt.preprocess.pool import WorkerDiedError
from megafmt.preprocess.writer import output_prefix_of

__all__ = [
    "BadInputError",
    "PreprocessConfig",
    "PreprocessSummary",
    "WorkerDiedError",
    "output_prefix_of",
    "preprocess",
]
