"""A run resumed with a new mix (issue 32), over seeded random chains of changes: weights,
corpora added and removed, data-parallel size, global batch size, several restarts; each
segment through the builder and the real loaders of every rank. Megatron (megatron-core 0.16.1)
is the reference for the blending rule and for the stream when nothing changes."""

import itertools
import random
from collections import defaultdict
from fractions import Fraction

import numpy
import pytest
import torch
from megatron.core.datasets import helpers_cpp
from megatron.core.datasets.blended_megatron_dataset_builder import (
    BlendedMegatronDatasetBuilder as MegatronBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDataset as MegatronGPTDataset
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MegatronConfig
from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

import megaindex
from megafmt.testing import VOCAB, write_corpus
from megaindex.mix_resume import MixResumedBlend, MixState
from megaload import DataLoaderConfig, build_pretraining_data_loader

# megatron-core's BlendedDataset asks torch.distributed for the rank unguarded
pytestmark = pytest.mark.usefixtures("single_process_group")

SETTINGS = dict(
    random_seed=1234,
    sequence_length=16,
    split="100,0,0",
    reset_position_ids=False,
    reset_attention_mask=False,
    eod_mask_loss=False,
)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Four corpora of different sizes and document lengths."""
    directory = tmp_path_factory.mktemp("mix")
    return [
        write_corpus(str(directory / f"corpus{n}"), documents, seed=n, longest=longest)
        for n, (documents, longest) in enumerate([(400, 60), (250, 30), (500, 90), (300, 20)])
    ]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def build(cache, prefixes, weights, size, mix=None):
    config = megaindex.GPTDatasetConfig(
        blend=(prefixes, weights),
        tokenizer=NullTokenizer(VOCAB),
        path_to_cache=cache,
        resume_with_new_mix=mix,
        **SETTINGS,
    )
    builder = megaindex.BlendedMegatronDatasetBuilder("gpt", [size, 0, 0], lambda: True, config)
    return builder.build()[0]


def megatron_counts(weights, size):
    """Samples of each corpus in the first ``size`` of Megatron's greedy blend of ``weights``."""
    dataset_index = numpy.zeros(size, dtype=numpy.int16)
    dataset_sample_index = numpy.zeros(size, dtype=numpy.int64)
    normalised = numpy.array(weights, dtype=numpy.float64) / sum(weights)
    helpers_cpp.build_blending_indices(
        dataset_index, dataset_sample_index, normalised, len(weights), size, False
    )
    return numpy.bincount(dataset_index, minlength=len(weights)).tolist()


def blend_key(names, weights):
    """What makes a resume continue the blend's segment: its corpora and normalised weights."""
    return names, [Fraction(w, sum(weights)) for w in weights]


def run_segment(dataset, state, micro, ranks, accumulation, steps):
    """Every rank's loader for ``steps`` global batches of ``accumulation`` micro-batches per
    rank, from ``state`` (None: the start): the samples served (as ``(corpus, its sample)``)
    and the state saved after."""
    global_batch = micro * ranks * accumulation
    served = []
    loaders = []
    for rank in range(ranks):
        config = DataLoaderConfig(
            micro_batch_size=micro,
            global_batch_size=global_batch,
            data_parallel_rank=rank,
            data_parallel_size=ranks,
            num_workers=0,
            pin_memory=False,
            resume_with_new_mix=True,
        )
        loader = build_pretraining_data_loader(dataset, 0, config)
        if state is not None:
            loader.load_state_dict(state)
        start = loader.consumed_samples
        loader.batch_sampler.consumed_samples = start
        indices = list(itertools.islice(iter(loader.batch_sampler), steps * accumulation))
        batches = list(itertools.islice(iter(loader), steps * accumulation))
        for ids, batch in zip(indices, batches, strict=True):
            expected = torch.stack([dataset[i]["tokens"] for i in ids])
            assert torch.equal(batch["tokens"], expected)
            served += [(i, dataset.sample_origin(i)) for i in ids]
        loaders.append(loader)
    states = [loader.state_dict() for loader in loaders]
    assert all(s["mix"] == states[0]["mix"] for s in states)
    served.sort(key=lambda item: item[0])
    return [(o["corpus"], o["sample"]) for _, o in served], states[0]


@pytest.mark.parametrize("seed", range(6))
def test_random_chains_serve_each_corpus_once_in_order_by_the_new_weights(corpora, cache, seed):
    rng = random.Random(seed)
    state, consumed = None, 0
    served = defaultdict(list)
    segment, segment_counts = None, None
    for _restart in range(rng.randint(3, 5)):
        names = rng.sample(corpora, rng.randint(1, 3))
        weights = [rng.randint(1, 6) for _ in names]
        if segment is not None and rng.random() < 0.3:  # a restart that changes only the layout
            names, weights = segment
        micro, ranks, accumulation = rng.choice([1, 2, 3]), rng.choice([1, 2, 4]), rng.randint(1, 2)
        steps = rng.randint(1, 4)
        size = consumed + steps * micro * ranks * accumulation + rng.randint(0, 7)
        mix = None if state is None else MixState.from_loader_state(state)
        dataset = build(cache, names, weights, size, mix)
        stream, state = run_segment(dataset, state, micro, ranks, accumulation, steps)
        consumed += len(stream)
        assert state["consumed_samples"] == consumed
        if blend_key(names, weights) != blend_key(*segment or ([], [])):
            segment_counts = dict.fromkeys(names, 0)
        segment = (names, weights)
        for corpus, sample in stream:
            served[corpus].append(sample)
            segment_counts[corpus] += 1
        # the mix since the blend last changed is Megatron's greedy rule on those samples
        expected = megatron_counts(weights, sum(segment_counts.values()))
        assert [segment_counts[n] for n in names] == expected
        # every corpus served each of its samples once, in its own order, none skipped
        for corpus, samples in served.items():
            assert samples == list(range(len(samples))), corpus
        assert {n: r["consumed"] for n, r in state["mix"]["corpora"].items()} == {
            n: len(s) for n, s in served.items()
        } | {n: 0 for n in names if n not in served}


def test_without_a_change_the_stream_is_megatrons(corpora, cache, tmp_path):
    prefixes, weights, size = corpora[:3], [0.5, 0.2, 0.3], 240
    config = MegatronConfig(
        blend=(prefixes, weights),
        tokenizer=NullTokenizer(VOCAB),
        path_to_cache=str(tmp_path / "megatron"),
        **SETTINGS,
    )
    theirs = MegatronBuilder(MegatronGPTDataset, [size, 0, 0], lambda: True, config).build()[0]
    ours = build(cache, prefixes, weights, size)  # the mode's first segment: Megatron's blend
    for start in (0, 36, 100, 180):  # restarts without a change
        if start:
            ours = build(
                cache,
                prefixes,
                weights,
                size,
                MixState(consumed_samples=start, **ours.mix_state(start)),
            )
            assert isinstance(ours, MixResumedBlend)
        for i in range(start, size):
            origin = ours.sample_origin(i)
            assert prefixes.index(origin["corpus"]) == theirs.dataset_index[i]
            assert origin["sample"] == theirs.dataset_sample_index[i]
        for i in (start, size - 1):
            assert torch.equal(ours[i]["tokens"], theirs[i]["tokens"])
