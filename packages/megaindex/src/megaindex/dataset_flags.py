"""Megatron-LM's dataset flags (data path, split, sequence length, seed, sample counts, tokenizer
identity, parallel layout) and the datasets they describe, built or loaded from the cache:
what ``mega index`` and megaload's dataset provider (``mega load simulate``) read.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from dataclasses import replace
from typing import Any

from megafmt.cli.command import non_negative_int, positive_int
from megafmt.cli.tokenizer_flags import add_tokenizer_arguments, tokenizer_options
from megafmt.sft import DEFAULT_PROMPT_FORMAT, PROMPT_FORMATS, SFTTokenizer
from megafmt.tokenizers import TokenizerOptions, load_text_tokenizer
from megaindex.blend import default_split, get_blend_and_blend_per_split
from megaindex.budget import StepBatchSizeSchedule, get_train_valid_test_num_samples
from megaindex.builder import BlendedMegatronDatasetBuilder
from megaindex.config import GPTDatasetConfig, SizedVocabulary, padded_vocab_size
from megaindex.fim_cli import add_fim_arguments, fim_fields
from megaindex.fim_dataset import GPTFIMDataset, GPTFIMDatasetConfig
from megaindex.mix_resume import MixState
from megaindex.mock import MockGPTDataset
from megaindex.phases import PhaseSchedule, build_phase_datasets
from megaindex.plugins import DATASETS
from megaindex.sft_dataset import SFTDataset, SFTDatasetConfig
from megaindex.tokenizer import IdentifiedTokenizer
from megaindex.utils import Split


def data_path_arguments(group: Any) -> None:
    """Megatron-LM's data-path flags: a blend, or one per split, inline or from a file."""
    group.add_argument(
        "--data-path",
        nargs="+",
        metavar="ITEM",
        help="a prefix, weight/prefix pairs, or prefixes weighted by their sizes",
    )
    group.add_argument("--data-args-path", help="a file holding the --data-path items")
    for split in ("train", "valid", "test"):
        group.add_argument(
            f"--{split}-data-path", nargs="+", metavar="ITEM", help=f"the {split} split's own blend"
        )
    group.add_argument(
        "--per-split-data-args-path", help='a JSON file {"train": ..., "valid": ..., "test": ...}'
    )


def blends_of(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(blend, blend_per_split)`` of the data-path flags."""
    return get_blend_and_blend_per_split(
        args.data_path,
        args.data_args_path,
        args.train_data_path,
        args.valid_data_path,
        args.test_data_path,
        args.per_split_data_args_path,
    )


#: the parallel layout of a job that gives none: one process
LAYOUT_DEFAULTS = {
    "prepare_cache_world_size": 1,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "sequence_parallel": False,
    "hybrid_context_parallel": False,
}


def _layout_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's parallel-layout flags, for the data-parallel size (prepare_cache.py's)."""
    parallel = parser.add_argument_group(
        "parallel layout (the data-parallel size: --global-batch-size defaults to "
        "--micro-batch-size x data-parallel size)"
    )
    parallel.add_argument("--micro-batch-size", type=positive_int)
    parallel.add_argument(
        "--prepare-cache-world-size",
        type=positive_int,
        help="the world size of the job (default: $WORLD_SIZE, else 1)",
    )
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size"):
        parallel.add_argument(flag, type=positive_int, default=1)
    parallel.add_argument("--sequence-parallel", action="store_true")
    parallel.add_argument("--hybrid-context-parallel", action="store_true")


def dataset_arguments(parser: argparse.ArgumentParser, layout: bool = True) -> None:
    """The dataset flags; ``layout`` adds the parallel-layout ones (``mega load simulate``
    has its own micro batch and data-parallel flags, and leaves them out)."""
    data = parser.add_argument_group("data (Megatron-LM's flags)")
    data.add_argument(
        "--dataset",
        default="gpt",
        metavar="NAME",
        help="the dataset class, a megaindex.datasets plugin: "
        f"{', '.join(DATASETS.available())} (default: gpt)",
    )
    data_path_arguments(data)
    data.add_argument(
        "--split",
        help="train,valid,test weights (default with a data path: "
        "Megatron's legacy 969,30,1, with a warning)",
    )
    data.add_argument(
        "--multiple-validation-sets",
        action="store_true",
        help="keep the validation blend's datasets apart",
    )
    data.add_argument("--mid-level-dataset-surplus", type=float, default=0.005)
    data.add_argument("--num-dataset-builder-threads", type=positive_int, default=1)
    data.add_argument("--seq-length", type=positive_int, required=True, help="tokens per sample")
    data.add_argument(
        "--context-parallel-size", type=positive_int, default=1, help="SFT packs pad for it"
    )
    data.add_argument(
        "--skip-bad-lines", action="store_true", help="SFT: count and skip bad jsonl lines"
    )
    data.add_argument("--seed", type=int, default=1234, help="random seed (Megatron: 1234)")
    data.add_argument(
        "--cache-dir",
        "--data-cache-path",
        dest="cache_dir",
        help="path_to_cache (default: <prefix>/cache/...)",
    )
    data.add_argument(
        "--mock-data", action="store_true", help="synthetic data: the same as --dataset mock"
    )
    data.add_argument(
        "--object-storage-cache-path",
        help="local folder for the .idx files and tables of s3:// and msc:// corpora",
    )
    data.add_argument(
        "--per-dataset-sequences-path",
        help="the JSON of `mega sequences`: sequence and document counts of each corpus",
    )
    data.add_argument(
        "--no-mmap-bin-files",
        dest="mmap_bin_files",
        action="store_false",
        help="read .bin files with positional reads instead of memory maps",
    )
    for flag in ("--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"):
        data.add_argument(flag, action="store_true", help="as in Megatron-LM (not in the key)")
    data.add_argument(
        "--no-create-attention-mask-in-dataloader",
        dest="create_attention_mask_in_dataloader",
        action="store_false",
    )
    data.add_argument("--allow-ambiguous-pad-tokens", action="store_true")
    data.add_argument(
        "--make-vocab-size-divisible-by",
        type=positive_int,
        default=128,
        help="the model pads the tokenizer's vocabulary to a multiple of this x "
        "--tensor-model-parallel-size (Megatron-LM's; default 128): samples may hold any id "
        "below that padded size",
    )
    data.add_argument(
        "--no-check-token-ids",
        dest="check_token_ids",
        action="store_false",
        help="read ids past the model's vocabulary instead of refusing them (TokenRangeError)",
    )
    for flag in ("--dataloader-fast-cache-load", "--dataloader-defer-npy-index-mmap"):
        data.add_argument(
            flag,
            action="store_true",
            help="ignored by `index build`, as by prepare_cache.py: a build writes the cache",
        )
    data.add_argument(
        "--no-extra-token", action="store_true", help="add_extra_token_to_sequence=False"
    )
    data.add_argument(
        "--keep-last-partial-validation",
        action="store_true",
        help="drop_last_partial_validation_sequence=False",
    )

    budget = parser.add_argument_group("sample budget (Megatron-LM's flags, or --samples)")
    budget.add_argument(
        "--samples",
        type=sample_counts,
        metavar="TRAIN[,VALID[,TEST]]",
        help="samples per split; an empty count builds one epoch",
    )
    budget.add_argument("--train-iters", type=non_negative_int)
    budget.add_argument("--train-samples", type=non_negative_int)
    budget.add_argument("--global-batch-size", type=positive_int)
    budget.add_argument("--eval-interval", type=non_negative_int, help="0: with --skip-train")
    budget.add_argument("--eval-iters", type=non_negative_int, default=0)
    budget.add_argument("--eval-global-batch-size", type=positive_int)
    budget.add_argument("--full-validation", action="store_true")
    budget.add_argument("--skip-train", action="store_true", help="evaluation only")
    budget.add_argument("--start-eval-at-iter", type=int, help="no evaluation before it")
    budget.add_argument(
        "--step-batch-size-schedule",
        metavar="SCHEDULE",
        help="'THRESHOLD:BATCH ...', thresholds in tokens (as Megatron-LM reads them)",
    )
    budget.add_argument(
        "--phase-transition-iterations",
        type=positive_int,
        nargs="+",
        metavar="ITER",
        help="build the datasets of the phase --iteration is in",
    )
    budget.add_argument(
        "--phases",
        nargs="+",
        metavar="START:DATA_PATH",
        help="a mid-training schedule, e.g. '0:0.3 web 0.7 code' '4000:code': each phase's "
        "first iteration and blend (build and simulate every phase; inspect shows them)",
    )
    budget.add_argument(
        "--iteration", type=non_negative_int, default=0, help="the iteration resumed at"
    )
    budget.add_argument(
        "--rampup-batch-size",
        type=int,
        nargs=3,
        metavar=("START", "INCREMENT", "SAMPLES"),
        help="deprecated and ignored at the seed commit (use --step-batch-size-schedule)",
    )
    if layout:
        _layout_arguments(parser)
    else:
        parser.set_defaults(**LAYOUT_DEFAULTS)

    tokenizer = add_tokenizer_arguments(
        parser,
        None,
        "the null tokenizer's vocabulary; tiktoken's total size; with "
        "--tokenizer-identifiers the vocabulary size",
    )
    tokenizer.description = (
        "the tokenizer's identity is part of the cache key: give the training job's "
        "--tokenizer-type and flags (Megatron's), or one of the forms below"
    )
    choice = tokenizer.add_mutually_exclusive_group()
    choice.add_argument(
        "--null-tokenizer",
        type=int,
        metavar="VOCAB",
        help="megatron-core 0.16.1's library NullTokenizer(VOCAB) itself: EOD = VOCAB",
    )
    choice.add_argument(
        "--tokenizer-identifiers",
        metavar="JSON",
        help="the unique_identifiers of the job's tokenizer (with --eod and --vocab-size)",
    )
    choice.add_argument(
        "--sft-tokenizer",
        metavar="DIR",
        help="the SFT tokenizer folder (--dataset sft; Megatron's --tokenizer-model)",
    )
    tokenizer.add_argument(
        "--sft-tokenizer-prompt-format",
        default=DEFAULT_PROMPT_FORMAT,
        choices=sorted(PROMPT_FORMATS),
    )
    tokenizer.add_argument("--eod", type=int, help="end-of-document id")
    add_fim_arguments(parser)


def sample_counts(text: str) -> list[int | None]:
    """``--samples TRAIN[,VALID[,TEST]]``: counts >= 0, an empty one None (one epoch)."""
    counts = [non_negative_int(c) if c.strip() else None for c in text.split(",")]
    if len(counts) > len(Split):
        raise argparse.ArgumentTypeError(f"expected at most 3 counts, got {text!r}")
    return counts + [None] * (len(Split) - len(counts))


def _sizes(args: argparse.Namespace) -> list[int | None]:
    if args.samples is not None:
        return args.samples
    if args.rampup_batch_size is not None:
        warnings.warn(
            "--rampup-batch-size is deprecated and ignored (as at the seed commit); use "
            "--step-batch-size-schedule",
            DeprecationWarning,
            stacklevel=2,
        )
    global_batch_size = args.global_batch_size
    if args.micro_batch_size is not None:
        per_step = args.micro_batch_size * data_parallel_size(args)
        if global_batch_size is None:
            global_batch_size = per_step
        elif global_batch_size % per_step:
            raise ValueError(
                f"--global-batch-size {global_batch_size} is not a multiple of "
                f"--micro-batch-size x data-parallel size ({per_step})"
            )
    if global_batch_size is None:
        raise ValueError(
            "give --samples, or --global-batch-size (or --micro-batch-size) with --train-iters "
            "or --train-samples"
        )
    return list(
        get_train_valid_test_num_samples(
            global_batch_size,
            train_iters=args.train_iters,
            train_samples=args.train_samples,
            eval_interval=args.eval_interval,
            eval_iters=args.eval_iters,
            eval_global_batch_size=args.eval_global_batch_size,
            full_validation=args.full_validation,
            skip_train=args.skip_train,
            start_eval_at_iter=args.start_eval_at_iter,
            step_batch_size_schedule=(
                StepBatchSizeSchedule.parse(args.step_batch_size_schedule, args.seq_length)
                if args.step_batch_size_schedule
                else None
            ),
            phase_transition_iterations=args.phase_transition_iterations,
            iteration=args.iteration,
        )
    )


def data_parallel_size(args: argparse.Namespace) -> int:
    """The job's data-parallel size: its world size (``--prepare-cache-world-size``, else
    ``$WORLD_SIZE``, else 1) over tensor x pipeline x context parallel sizes."""
    world = args.prepare_cache_world_size or int(os.environ.get("WORLD_SIZE", "1"))
    model = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    if world % model:
        raise ValueError(
            f"world size {world} is not a multiple of tensor x pipeline x context parallel "
            f"sizes ({model}): give the job's --prepare-cache-world-size (or $WORLD_SIZE)"
        )
    return world // model


def _tokenizer(args: argparse.Namespace) -> IdentifiedTokenizer | SFTTokenizer:
    if args.sft_tokenizer is not None:
        return SFTTokenizer(args.sft_tokenizer, args.sft_tokenizer_prompt_format)
    if args.tokenizer_type == "SFTTokenizer":
        return SFTTokenizer(args.tokenizer_model, args.sft_tokenizer_prompt_format)
    if args.null_tokenizer is not None:
        identity = IdentifiedTokenizer.null(args.null_tokenizer)
    elif args.tokenizer_identifiers is None:
        if args.tokenizer_type is None:
            raise ValueError(
                "give the job's tokenizer: --tokenizer-type and its flags, --null-tokenizer, "
                "--tokenizer-identifiers or --sft-tokenizer"
            )
        return IdentifiedTokenizer.from_flags(args.tokenizer_type, tokenizer_options(args))
    elif args.eod is None:
        raise ValueError("--tokenizer-identifiers needs --eod")
    else:
        identity = IdentifiedTokenizer(
            args.eod, args.vocab_size, json.loads(args.tokenizer_identifiers)
        )
    if args.tokenizer_model:
        identity.text = load_text_tokenizer(
            "huggingface", TokenizerOptions(model=args.tokenizer_model)
        )
    return identity


def build_datasets(args: argparse.Namespace, mix: MixState | None = None) -> list[Any]:
    """The datasets ``args`` describe, built (or loaded from the cache); with ``mix``, the
    training blend continues that state's corpora (``resume_with_new_mix``)."""
    blend, blend_per_split = blends_of(args)
    cls = MockGPTDataset if args.mock_data else DATASETS.get(args.dataset)
    if blend is None and blend_per_split is None and not issubclass(cls, MockGPTDataset):
        raise ValueError(
            "give the data: --data-path, --data-args-path, or per-split paths (or --dataset mock)"
        )
    config = _dataset_config(args, cls, blend, blend_per_split)
    if mix is not None:
        config = replace(config, resume_with_new_mix=mix)
    return BlendedMegatronDatasetBuilder(cls, _sizes(args), lambda: True, config).build()


def build_phases(
    args: argparse.Namespace, continue_corpora: bool = False
) -> list[tuple[int, list[Any]]]:
    """``(first iteration, [train, valid, test])`` of every phase of ``--phases``, built (or
    loaded from the cache) before the run, each sized as its launch sizes it; the last phase
    ends at the run's training samples (``--train-samples``, or ``--train-iters`` batches).
    With ``continue_corpora`` each phase continues the corpora where the one before left
    them (``build_phase_datasets``)."""
    schedule = PhaseSchedule.parse(args.phases)
    if args.mock_data:
        raise ValueError("--phases gives each phase's data: it does not take --mock-data")
    if args.phase_transition_iterations or args.global_batch_size is None:
        raise ValueError(
            "--phases takes the transitions from its items and needs --global-batch-size "
            "(without --phase-transition-iterations)"
        )
    train, *eval_sizes = _sizes(args)
    if train is None:
        raise ValueError("--phases needs the run's training samples: --train-samples or iters")
    cls = DATASETS.get(args.dataset)
    config = _dataset_config(args, cls, schedule.phases[0].blend, None)
    built = build_phase_datasets(
        cls,
        schedule,
        config,
        args.global_batch_size,
        train,
        eval_sizes,
        continue_corpora=continue_corpora,
    )
    return list(zip(schedule.starts, built, strict=True))


def _dataset_config(args: argparse.Namespace, cls: Any, blend: Any, blend_per_split: Any) -> Any:
    """The dataset configuration of ``args`` for ``cls`` over ``blend`` or ``blend_per_split``."""
    sft = issubclass(cls, SFTDataset)
    fim = issubclass(cls, GPTFIMDataset)
    config_class = SFTDatasetConfig if sft else GPTFIMDatasetConfig if fim else GPTDatasetConfig
    tokenizer = _tokenizer(args)
    return config_class(
        **(fim_fields(args) if fim else {}),
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=default_split(args.split, blend),
        multiple_validation_sets=args.multiple_validation_sets or None,
        full_validation=args.full_validation or None,
        num_dataset_builder_threads=args.num_dataset_builder_threads,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
        path_to_cache=args.cache_dir,
        mmap_bin_files=args.mmap_bin_files,
        tokenizer=tokenizer,
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
        allow_ambiguous_pad_tokens=args.allow_ambiguous_pad_tokens,
        object_storage_cache_path=args.object_storage_cache_path,
        sequences_per_dataset=_sequences_per_dataset(args.per_dataset_sequences_path),
        data_parallel_size=data_parallel_size(args),
        sequence_parallel_size=args.tensor_model_parallel_size * args.sequence_parallel,
        hybrid_context_parallel=args.hybrid_context_parallel,
        add_extra_token_to_sequence=not args.no_extra_token,
        drop_last_partial_validation_sequence=not args.keep_last_partial_validation,
        **(_sft_settings(args) if sft else {}),
        padded_vocab_size=_padded_vocab_size(args, tokenizer),
        check_token_ids=args.check_token_ids,
    )


def _padded_vocab_size(args: argparse.Namespace, tokenizer: Any) -> int | None:
    """The model's vocabulary as Megatron-LM pads the tokenizer's (None: it states no size)."""
    if not isinstance(tokenizer, SizedVocabulary) or tokenizer.vocab_size is None:
        return None
    return padded_vocab_size(
        tokenizer.vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size
    )


def _sequences_per_dataset(path: str | None) -> dict[str, Any] | None:
    """The counts in ``--per-dataset-sequences-path``, if given."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)


def _sft_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--dataset sft`` adds to the configuration (the GPT datasets keep theirs as they
    were: these fields are left at their defaults for them)."""
    return {
        "context_parallel_size": args.context_parallel_size,
        "skip_bad_lines": args.skip_bad_lines,
    }
