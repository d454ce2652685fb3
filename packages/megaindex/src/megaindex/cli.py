"""``mega index``: build a GPTDataset index cache offline, inspect a cache, explain a sample.

``mega index build`` takes the arguments a Megatron job gives its dataset (data path, split,
sequence length, seed, sample counts, tokenizer identity) and builds the cache before the job
starts, reporting each phase; the job then finds every table cached.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

import numpy

from megafmt.cli.command import non_negative_int, positive_int
from megafmt.cli.tokenizer_flags import add_tokenizer_arguments, tokenizer_options
from megafmt.redaction import redact
from megafmt.sft import DEFAULT_PROMPT_FORMAT, PROMPT_FORMATS, SFTTokenizer
from megafmt.tokenizers import TokenizerOptions, load_text_tokenizer
from megaindex.blend import default_split, get_blend_and_blend_per_split
from megaindex.blended_dataset import BlendedDataset
from megaindex.budget import StepBatchSizeSchedule, get_train_valid_test_num_samples
from megaindex.builder import BlendedMegatronDatasetBuilder
from megaindex.cache_report import inspect_cache
from megaindex.config import GPTDatasetConfig, SizedVocabulary, padded_vocab_size
from megaindex.fim_cli import add_fim_arguments, fim_fields
from megaindex.fim_dataset import GPTFIMDataset, GPTFIMDatasetConfig
from megaindex.gpt_dataset import GPTDataset
from megaindex.megatron_flags import add_ignored_megatron_flags
from megaindex.mix_resume import MixState
from megaindex.mock import MockGPTDataset
from megaindex.phase_report import describe_phases, phase_reports
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


def _dataset_arguments(parser: argparse.ArgumentParser, layout: bool = True) -> None:
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


class DatasetProvider:
    """megaindex's provider for ``mega load simulate``: the datasets of any
    ``megaindex.datasets`` plugin (``--dataset``), from Megatron-LM's flags."""

    def configure(self, parser: argparse.ArgumentParser) -> None:
        _dataset_arguments(parser, layout=False)

    def build(self, args: argparse.Namespace) -> list[Any]:
        return build_datasets(args)

    def build_resumed(self, args: argparse.Namespace, state: Mapping[str, Any]) -> list[Any]:
        """The datasets, the training blend continuing the corpora of a loader's saved
        ``state`` (megaload's ``MixResumingProvider``)."""
        return build_datasets(args, MixState.from_loader_state(state))

    def build_phases(self, args: argparse.Namespace) -> list[tuple[int, Any]] | None:
        """``(first iteration, training dataset)`` of each phase of ``--phases``, or None
        without it (megaload's ``PhasedProvider``)."""
        return self.build_continuing_phases(args, continue_corpora=False)

    def build_continuing_phases(
        self, args: argparse.Namespace, continue_corpora: bool = True
    ) -> list[tuple[int, Any]] | None:
        """As :meth:`build_phases`, each phase continuing the corpora where the one before
        left them (megaload's ``MixResumingProvider``)."""
        if not args.phases:
            return None
        phases = build_phases(args, continue_corpora)
        return [(first, datasets[Split.train.value]) for first, datasets in phases]


def _report_built(split: Split, dataset: Any, indent: str = "") -> str:
    if isinstance(dataset, list):  # multiple validation sets
        return "\n".join(_report_built(split, d, indent) for d in dataset)
    if not isinstance(dataset, (GPTDataset, BlendedDataset)):  # a third party's class
        return f"{indent}{split.name:<5} {len(dataset):>12,} samples  {type(dataset).__name__}"
    source = dataset.index_source
    key = source.cache_entry.base if source.cache_entry else "(not cached)"
    what = f"blend of {len(dataset.datasets)}  " if isinstance(dataset, BlendedDataset) else ""
    line = f"{indent}{split.name:<5} {len(dataset):>12,} samples  {what}{source.kind:<6}  {key}"
    if source.seconds:
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in source.seconds.items())
        line += f"\n{indent}      {phases}"
    if isinstance(dataset, BlendedDataset):
        parts = [line] + [_report_built(split, d, indent + "    ") for d in dataset.datasets]
        return "\n".join(parts)
    plan = dataset.epoch_plan
    line += (
        f"\n{indent}      {plan.num_epochs} epoch(s) of {plan.tokens_per_epoch:,} tokens, "
        f"separate final epoch: {'yes' if plan.separate_final_epoch else 'no'}"
    )
    return line


def _plot(reports: list, path: str) -> None:
    """Cumulative share of each source over the samples of each blend, if matplotlib exists."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError as error:
        raise ValueError(f"--plot needs matplotlib ({error})") from None
    blends = [r for r in reports if r.sources]
    figure, axes = pyplot.subplots(
        len(blends) or 1, 1, figsize=(8, 3 * max(1, len(blends))), squeeze=False
    )
    for axis, report in zip(axes[:, 0], blends, strict=False):
        index = report.dataset_index()
        seen = numpy.arange(1, len(index) + 1)
        for number, source in enumerate(report.sources):
            axis.plot(
                seen,
                numpy.cumsum(index == number) / seen,
                label=f"{source.dataset_path} (weight {source.weight:.3f})",
            )
            axis.axhline(source.weight, linestyle=":", linewidth=0.8)
        axis.set_title(f"{report.description.get('split')} blend {report.base[:8]}")
        axis.set_xlabel("samples")
        axis.set_ylabel("share so far")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)


class IndexCommand:
    def configure(self, parser: argparse.ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="index_command", metavar="SUBCOMMAND", required=True)
        build = commands.add_parser("build", help="build the index cache before a job starts")
        _dataset_arguments(build)
        add_ignored_megatron_flags(build)  # last: it skips the flags read above
        inspect = commands.add_parser("inspect", help="what a cache directory holds")
        inspect.add_argument("cache_dir", metavar="CACHE_DIR")
        inspect.add_argument(
            "--first",
            type=int,
            default=10000,
            help="blend shares are also shown over the first N samples",
        )
        inspect.add_argument("--plot", metavar="PNG", help="plot blend shares (needs matplotlib)")
        inspect.add_argument("--json", action="store_true", help="print JSON")
        inspect.add_argument(
            "--phases",
            nargs="+",
            metavar="START:DATA_PATH",
            help="show this schedule's phases (as mega index build --phases built them): "
            "per phase its blend, samples, tokens and each corpus's epochs",
        )
        explain = commands.add_parser("explain", help="which documents a sample is cut from")
        _dataset_arguments(explain)
        explain.add_argument("--sample", type=int, required=True, help="sample number")
        explain.add_argument(
            "--split-name",
            choices=[s.name for s in Split],
            default="train",
            help="the split the sample belongs to",
        )
        explain.add_argument("--tokens", action="store_true", help="print the token ids too")

    def run(self, args: argparse.Namespace) -> int:
        return {"build": self._build, "inspect": self._inspect, "explain": self._explain}[
            args.index_command
        ](args)

    def _build(self, args: argparse.Namespace) -> int:
        start = time.perf_counter()
        for flag in ("dataloader_fast_cache_load", "dataloader_defer_npy_index_mmap"):
            if vars(args)[flag]:  # taken, and set aside as prepare_cache.py does
                print(f"> ignoring --{flag.replace('_', '-')} during cache preparation")
        phases = build_phases(args) if args.phases else [(None, build_datasets(args))]
        for first, datasets in phases:
            if first is not None:
                print(f"phase from iteration {first}:")
            for split, dataset in zip(Split, datasets, strict=True):
                if dataset is not None:
                    print(_report_built(split, dataset))
        print(f"done in {time.perf_counter() - start:.2f} s")
        return 0

    def _inspect(self, args: argparse.Namespace) -> int:
        reports = inspect_cache(args.cache_dir, args.first)
        if args.phases:
            phases = phase_reports(PhaseSchedule.parse(args.phases), reports)
            if args.json:
                print(json.dumps([asdict(phase) for phase in phases], indent=2))
            else:
                print("\n".join(describe_phases(phases)))
            return 0
        if args.plot:
            _plot(reports, args.plot)
        if args.json:
            print(
                json.dumps(
                    [asdict(r) | {"bytes_on_disk": r.bytes_on_disk} for r in reports], indent=2
                )
            )
            return 0
        if not reports:
            print(f"{args.cache_dir}: no cached datasets")
        for report in reports:
            print(report.base)
            print(_describe_report(report, args.first))
        return 0

    def _explain(self, args: argparse.Namespace) -> int:
        split = Split[args.split_name]
        dataset = build_datasets(args)[split.value]
        if dataset is None:
            raise ValueError(f"the {split.name} split is empty with --split {args.split}")
        if not 0 <= args.sample < len(dataset):
            raise IndexError(
                f"sample {args.sample} out of range: the {split.name} split has {len(dataset)}"
            )
        sample = args.sample
        if isinstance(dataset, BlendedDataset):
            number = int(dataset.dataset_index[sample])
            sample = int(dataset.dataset_sample_index[sample])
            dataset = dataset.datasets[number]
            print(
                f"{split.name} sample {args.sample} is sample {sample} of dataset {number} "
                f"({redact(dataset.dataset_path)}) of the blend"
            )
        if isinstance(dataset, SFTDataset):
            print(f"{split.name} " + "\n".join(dataset.describe(sample)))
            return 0
        row = int(dataset.shuffle_index[sample])
        (begin, begin_offset), (end, end_offset) = dataset.sample_index[row : row + 2].tolist()
        extra = int(dataset.config.add_extra_token_to_sequence)
        print(
            f"{split.name} sample {sample} is row {row} of the sample index: from "
            f"document_index[{begin}] offset {begin_offset} to document_index[{end}] offset "
            f"{end_offset} (+{extra} extra token)"
        )
        for document, first, count in zip(*dataset.sample_spans(sample), strict=True):
            length = int(dataset.dataset.sequence_lengths[document])
            last = length if count is None else first + count
            print(f"  document {document:>10}  tokens [{first}, {last}) of {length}")
        if args.tokens:
            if isinstance(dataset, GPTFIMDataset):
                print(
                    "rearranged for fill-in-the-middle as a fresh dataset's first read (the FIM "
                    "stream is stateful; --fim-sample-seeded gives each sample its own)"
                )
            text, _ = dataset._query_document_sample_shuffle_indices(sample)
            print(" ".join(map(str, text.tolist())))
            decoder = dataset.config.tokenizer
            if isinstance(decoder, IdentifiedTokenizer) and decoder.text is not None:
                print("decoded (special tokens as written):")
                print(decoder.text.ids_to_text(text, remove_special_tokens=False))
        return 0


def _describe_report(report: Any, first: int) -> str:
    described = report.description
    lines = []
    if described.get("class") == "BlendedDataset":
        lines.append(
            f"  BlendedDataset {described.get('split')}: "
            f"{len(described.get('datasets', []))} datasets, size {described.get('size')}"
        )
    else:
        lines.append(
            f"  {described.get('class')} {described.get('index_split')} of "
            f"{described.get('dataset_path')}: seq {described.get('sequence_length')}, "
            f"seed {described.get('random_seed')}, split {described.get('split')}"
        )
    samples = report.samples
    lines.append(f"  samples: {samples:,}" if samples is not None else "  samples: unknown")
    if report.plan:
        lines.append(
            f"  epochs: {report.plan['num_epochs']}, separate final epoch: "
            f"{'yes' if report.plan['separate_final_epoch'] else 'no'}"
        )
    elif described.get("class") != "BlendedDataset":
        lines.append("  epochs: not recorded (built by megatron-core)")
    for table, info in report.tables.items():
        shape = info.get("shape", info.get("error"))
        lines.append(
            f"  {table:<20} {info.get('dtype', '?'):<7} {shape!s:<16} {info['bytes']:>14,} bytes"
        )
    lines.append(f"  total {report.bytes_on_disk:,} bytes")
    if report.sources:
        lines.append(
            f"  {'source':<40} {'weight':>8} {'first ' + str(first):>12} "
            f"{'all':>8} {'samples':>10} {'epochs':>8}"
        )
        for source in report.sources:
            epochs = "?" if source.epochs is None else f"{source.epochs:.3f}"
            lines.append(
                f"  {str(source.dataset_path)[-40:]:<40} {source.weight:>8.4f} "
                f"{source.share_first:>12.4f} {source.share_all:>8.4f} "
                f"{source.samples_drawn:>10,} {epochs:>8}"
            )
    return "\n".join(lines)
