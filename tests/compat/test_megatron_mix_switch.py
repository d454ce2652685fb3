"""``--resume-with-new-mix`` through a Megatron-LM checkout at the seed commit switched by
tools/megatron_switch.py: resumed from a Megatron-LM checkpoint of one blend under another, the
switched run continues each corpus where the checkpoint's run stopped.

One gloo rank runs the switched checkout's own code (testing/seedref.py): its argument parser
(the flag comes through the switch), ``checkpointing.check_checkpoint_args`` on the saved
arguments of the run before the change (as ``load_checkpoint`` calls it, which then sets
``consumed_train_samples``), training.py's dataset building and data iterators, and
pretrain_gpt's ``get_batch``. What the run before the change consumed is read from Megatron-LM's
own blend of the old arguments (the seed's ``BlendedMegatronDatasetBuilder``, which the switched
checkout still holds); the samples' tokens from the seed's GPTDataset of each corpus. The
cases: a new blend and global batch size; the same blend (Megatron-LM's stream); a phase
transition (``--phase-transition-iterations``, the next phase's launch).

Stubs: those of test_megatron_migration.py (``cuda_stubs``: CUDA placement, the GPU's
architecture, and the stand-in modules pretrain_gpt.py imports for the model).
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy
import pytest
from seedref import enter_seed_environment, source_root

from megadist.spawn import run_distributed

#: slow: each case starts a rank that imports Megatron-LM and builds both sides (30 to 55 s
#: measured); packages/megaindex/tests/test_megatron_mix.py checks the wrappers by default
pytestmark = [pytest.mark.compat, pytest.mark.distributed, pytest.mark.seed, pytest.mark.slow]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
sys.path.insert(0, str(Path(__file__).parent))
from megatron_switch import apply  # noqa: E402
from test_megatron_migration import cuda_stubs  # noqa: E402

CONSUMED = 40  # the checkpoint's consumed_train_samples: 5 iterations of 8
MICRO_BATCHES = 20  # taken after the change: 40 samples


def seed_blend(args: Any, blend: tuple[list[str], list[float]], size: int, cache: str) -> Any:
    """Megatron-LM's own (the seed's) training blend of ``blend`` for ``size`` samples."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    config = GPTDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length, blend=blend, split=args.split,
        path_to_cache=cache, tokenizer=build_tokenizer(args), reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
    )  # fmt: skip
    return BlendedMegatronDatasetBuilder(GPTDataset, [size, 0, 0], lambda: True, config).build()[0]


def resumed_rank(root: str, argv: list[str], old: list[str], cache: str) -> dict[str, Any]:
    """The switched run resumed from a checkpoint whose run had ``--data-path old``: what the
    run before consumed of each corpus, what the resumed run serves, and its batches."""
    import warnings

    warnings.simplefilter("ignore")
    enter_seed_environment(root=Path(root))
    cuda_stubs()
    import torch.distributed as dist

    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    sys.argv = ["pretrain_gpt.py", *argv]
    from megatron.core import parallel_state
    from megatron.training import checkpointing, training
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args()
    parallel_state.initialize_model_parallel()
    # load_checkpoint: the checkpoint's arguments are checked, then its counts taken
    saved = copy.copy(args)
    saved.data_path, saved.consumed_train_samples = old, CONSUMED
    saved.global_batch_size, saved.mix_resumed_from = 8, None  # a Megatron-LM checkpoint
    checkpointing.set_checkpoint_version(3.0)
    checkpointing.check_checkpoint_args(saved)
    args.consumed_train_samples = CONSUMED
    args.iteration, args.consumed_valid_samples = CONSUMED // 8, 0
    training.update_train_iters(args)

    import pretrain_gpt

    provider = pretrain_gpt.train_valid_test_datasets_provider
    provider.is_distributed = True
    train = training.build_train_valid_test_datasets(provider)[0]
    total = args.train_iters * args.global_batch_size
    before = seed_blend(args, ([old[1], old[3]], [float(old[0]), float(old[2])]), 80, cache)
    weights = [float(w) for w in args.data_path[::2]]
    after = seed_blend(args, (args.data_path[1::2], weights), total, cache)
    parts = {d.dataset_path: d for d in [*before.datasets, *after.datasets]}

    def seed_tokens(corpus: str, sample: int) -> numpy.ndarray:
        return numpy.asarray(parts[corpus][sample]["tokens"])

    from megaindex.megatron_mix import phase_starts

    iterator = training.build_train_valid_test_data_iterators(provider)[0]
    first = CONSUMED - max(s for s in phase_starts(args) if s <= CONSUMED)  # the phase's count
    taken = range(first, first + 2 * MICRO_BATCHES)
    served = [(train.sample_origin(i)["corpus"], train.sample_origin(i)["sample"]) for i in taken]
    megatron = [
        (after.datasets[after.dataset_index[i]].dataset_path, int(after.dataset_sample_index[i]))
        for i in taken
    ]
    batches = [pretrain_gpt.get_batch(iterator)[-1].numpy() for _ in range(MICRO_BATCHES)]
    return {
        "rank": dist.get_rank(),
        "resumed_from": args.mix_resumed_from,
        "before": [
            (before.datasets[d].dataset_path, int(s))
            for d, s in zip(
                before.dataset_index[:CONSUMED], before.dataset_sample_index[:CONSUMED], strict=True
            )
        ],
        "served": served,
        "megatron": megatron,
        "tokens": numpy.concatenate(batches),
        "seed_tokens": numpy.stack([seed_tokens(c, s) for c, s in served]),
        "train_class": type(train).__name__,
    }


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checkout") / "megatron-lm"
    shutil.copytree(source_root(), root)
    apply(root)
    return root


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """web, code and math."""
    from megafmt.testing import write_corpus

    folder = tmp_path_factory.mktemp("corpora")
    return [
        write_corpus(str(folder / name), 400, vocab=999, eod=999, seed=number)
        for number, name in enumerate(["web", "code", "math"])
    ]


def resumed(
    switched: Path, folder: Path, new: list[str], old: list[str], *flags: str
) -> dict[str, Any]:
    """The switched run with ``--data-path new`` and ``flags`` (the global batch and the run's
    length; default: 16, 10 iterations), resumed with the flag from a Megatron-LM checkpoint of
    ``--data-path old`` and a global batch of 8."""
    argv = [
        "--micro-batch-size", "2", *(flags or ["--global-batch-size", "16", "--train-iters", "10"]),
        "--seq-length", "16",
        "--max-position-embeddings", "16", "--num-layers", "2", "--hidden-size", "8",
        "--num-attention-heads", "2", "--lr", "1e-4", "--eval-interval", "5",
        "--eval-iters", "1", "--split", "100,0,0",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--num-workers", "0",
        "--data-cache-path", str(folder / "cache"), "--resume-with-new-mix", "--data-path", *new,
    ]  # fmt: skip
    seed_cache = str(folder / "seed-cache")
    (report,) = run_distributed(resumed_rank, 1, str(switched), argv, old, seed_cache)
    assert report["train_class"] == "MixResumedBlend"
    numpy.testing.assert_array_equal(report["tokens"], report["seed_tokens"])
    return report


def test_a_switched_run_resumed_under_a_new_mix_continues_each_corpus(
    switched: Path, corpora: list[str], tmp_path: Path
) -> None:
    """Before: ``0.7 web 0.3 code`` for 40 samples (Megatron-LM's checkpoint). After: ``0.5
    code 0.5 math``, global batch 16 instead of 8: code continues at its next unseen sample,
    math starts at 0, web is left where it stopped; no corpus sample repeats or is skipped, and
    every token is the seed GPTDataset's for that corpus sample."""
    web, code, math = corpora
    report = resumed(switched, tmp_path, ["0.5", code, "0.5", math], ["0.7", web, "0.3", code])
    assert_each_corpus_continues(report, corpora)
    before = [c for c, _ in report["before"]]
    recorded = report["resumed_from"]["corpora"]  # saved into the run's own checkpoints
    assert {name: record["consumed"] for name, record in recorded.items()} == {
        web: before.count(web),
        code: before.count(code),
    }


def assert_each_corpus_continues(report: dict[str, Any], corpora: list[str]) -> None:
    """Over the change from web and code to code and math: each corpus's samples once each,
    in its own order; web left where it stopped, code continued, math from 0."""
    web, code, math = corpora
    by_corpus: dict[str, list[int]] = {}
    for corpus, sample in [*report["before"], *report["served"]]:
        by_corpus.setdefault(corpus, []).append(sample)
    assert set(by_corpus) == {web, code, math}
    for corpus, samples in by_corpus.items():  # each corpus in its own order, once each
        assert samples == list(range(len(samples))), corpus
    before = [c for c, _ in report["before"]]
    assert by_corpus[web] == list(range(before.count(web)))  # left where it stopped
    assert report["served"][:2] == [(code, before.count(code)), (math, 0)]


def test_a_switched_run_resumed_under_the_same_mix_serves_megatron_s_blend(
    switched: Path, corpora: list[str], tmp_path: Path
) -> None:
    """The flag on, the blend unchanged (the global batch changed): the samples are the seed's
    blend's from the checkpoint's count on, as Megatron-LM's resumed run serves them."""
    blend = ["0.6", corpora[0], "0.4", corpora[2]]
    report = resumed(switched, tmp_path, blend, blend)
    assert report["served"] == report["megatron"]


def test_a_phase_transition_continues_each_corpus(
    switched: Path, corpora: list[str], tmp_path: Path
) -> None:
    """``--phase-transition-iterations 5``: the second phase's launch (``0.5 code 0.5 math``)
    resumed with the flag from the checkpoint the first phase's (``0.7 web 0.3 code``) saved
    at the transition continues each corpus; its dataset counts from the phase's sample 0, as
    Megatron-LM's phase launches do."""
    web, code, math = corpora
    flags = ["--global-batch-size", "8", "--train-samples", "80",
             "--phase-transition-iterations", "5"]  # fmt: skip
    report = resumed(switched, tmp_path, ["0.5", code, "0.5", math], ["0.7", web, "0.3", code],
                     *flags)  # fmt: skip
    assert_each_corpus_continues(report, corpora)
    assert report["resumed_from"]["consumed_samples"] == 0  # the new phase's own count
