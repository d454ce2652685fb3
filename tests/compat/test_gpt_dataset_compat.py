"""megaindex's GPTDataset against megatron-core's: the same tables, the same samples, and one
index cache that both load."""

import itertools
import os
import sys
import types

import numpy
import pytest
import torch
from megatron.core.datasets import gpt_dataset as megatron_gpt_dataset
from megatron.core.datasets import helpers as megatron_helpers
from megatron.core.datasets.blended_megatron_dataset_builder import (
    BlendedMegatronDatasetBuilder as MegatronBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDataset as MegatronGPTDataset
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MegatronConfig
from megatron.core.datasets.gpt_dataset import MockGPTDataset as MegatronMockGPTDataset
from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
from torch.utils.data import default_collate

import megaindex
from megafmt.testing import VOCAB, write_corpus
from megaindex import gpt_index
from megaindex.tokenizer import IdentifiedTokenizer

TABLES = ("document_index", "sample_index", "shuffle_index")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """300 documents of 0 to 59 tokens and EOD (so some hold EOD alone)."""
    return write_corpus(str(tmp_path_factory.mktemp("gpt") / "corpus"), shortest=0)


def build_both(corpus, directory, sizes, tokenizer=None, own=None, **fields):
    """megatron-core's datasets and ours for the same fields; ``own`` holds fields only our
    config has."""
    tokenizer = tokenizer or NullTokenizer(VOCAB)
    common = dict(
        random_seed=1234,
        sequence_length=32,
        blend=([corpus], None),
        split="90,8,2",
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    common.update(fields)
    theirs = MegatronBuilder(
        MegatronGPTDataset,
        sizes,
        lambda: True,
        MegatronConfig(path_to_cache=os.path.join(directory, "megatron"), **common),
    ).build()
    ours = megaindex.BlendedMegatronDatasetBuilder(
        megaindex.GPTDataset,
        sizes,
        lambda: True,
        megaindex.GPTDatasetConfig(
            path_to_cache=os.path.join(directory, "ours"), **common, **(own or {})
        ),
    ).build()
    return theirs, ours


def assert_same_tables(theirs, ours):
    assert theirs.unique_description == ours.unique_description
    assert theirs.unique_description_hash == ours.unique_description_hash
    for name in TABLES:
        reference, mine = getattr(theirs, name), getattr(ours, name)
        assert mine.dtype == reference.dtype, name
        numpy.testing.assert_array_equal(mine, reference, err_msg=name)
    assert len(ours) == len(theirs)


def assert_same_samples(theirs, ours, indices):
    """Sample by sample, and as one batch: ours assembled by ``__getitems__`` against torch's
    default collation of megatron-core's samples."""
    expected = []
    for idx in indices:
        reference, mine = theirs[idx], ours[idx]
        assert list(mine) == list(reference)
        for key, value in reference.items():
            assert mine[key].dtype == value.dtype, key
            assert mine[key].shape == value.shape, key
            assert torch.equal(mine[key], value), (idx, key)
        # megatron-core hands out its cached tensors: keep a copy of this sample's values
        expected.append({key: value.clone() for key, value in reference.items()})
    batch = ours.__getitems__(indices).collated
    for key, value in default_collate(expected).items():
        assert batch[key].dtype == value.dtype, key
        assert torch.equal(batch[key], value), key


CONFIGS = [
    pytest.param([1000, 50, 10], {}, id="epochs-many-separate-valid"),
    pytest.param([100, 5, 1], {}, id="one-epoch"),
    pytest.param([None, None, None], {}, id="no-sizes"),
    pytest.param([3000, 300, 30], {"random_seed": 7, "sequence_length": 17}, id="seed-seq"),
    pytest.param([1000, 50, 10], {"add_extra_token_to_sequence": False}, id="no-extra-token"),
    pytest.param(
        [1000, 57, 10], {"drop_last_partial_validation_sequence": False}, id="keep-partial-valid"
    ),
    pytest.param([800, 20, 3], {"split": "98,2,0"}, id="empty-test-split"),
]


@pytest.mark.parametrize("sizes,fields", CONFIGS)
def test_tables_and_samples_equal(corpus, tmp_path, sizes, fields):
    theirs, ours = build_both(corpus, str(tmp_path), sizes, **fields)
    for reference, mine in zip(theirs, ours, strict=True):
        if reference is None:
            assert mine is None
            continue
        assert_same_tables(reference, mine)
        n = len(reference)
        # a padding sample (None), and indices that count from the end as numpy's do
        indices = [*range(min(n, 40)), *range(max(n - 5, 40), n), None, -1, -n]
        assert_same_samples(reference, mine, indices)


def test_configs_cover_both_final_epoch_treatments(corpus, tmp_path):
    _, ours = build_both(corpus, str(tmp_path), [1000, 50, 10])
    flags = {d.epoch_plan.separate_final_epoch for d in ours}
    assert flags == {True, False}


FLAGS = list(itertools.product([False, True], repeat=4))


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join("1" if x else "0" for x in f))
def test_samples_equal_under_every_flag(corpus, tmp_path, flags):
    reset_positions, reset_mask, eod_loss, create_mask = flags
    theirs, ours = build_both(
        corpus,
        str(tmp_path),
        [200, 20, 5],
        reset_position_ids=reset_positions,
        reset_attention_mask=reset_mask,
        eod_mask_loss=eod_loss,
        create_attention_mask=create_mask,
        drop_last_partial_validation_sequence=False,
    )
    assert_same_samples(theirs[0], ours[0], [*range(25), None])
    valid_last = len(theirs[1]) - 1
    order = numpy.asarray(theirs[1].shuffle_index)
    padded = int(numpy.flatnonzero(order == valid_last)[0])  # the partial sample is padded
    assert_same_samples(theirs[1], ours[1], [0, padded])


class NoPadTokenizer(NullTokenizer):
    """A tokenizer without a pad token: its ``pad`` is None (as a HuggingFace tokenizer's is)."""

    @property
    def pad(self):
        return None


def padded_valid_sample(datasets):
    """The position of the valid split's partial (padded) last sample in its served order."""
    order = numpy.asarray(datasets[1].shuffle_index)
    return int(numpy.flatnonzero(order == len(datasets[1]) - 1)[0])


def test_samples_equal_with_a_tokenizer_without_pad(corpus, tmp_path):
    """megatron-core (the seed's GPTDataset, the same file) keeps a pad of None and masks
    nothing: our samples equal its own wherever it makes them."""
    fields = dict(drop_last_partial_validation_sequence=False)
    theirs, ours = build_both(corpus, str(tmp_path), [200, 20, 5], NoPadTokenizer(VOCAB), **fields)
    padded = padded_valid_sample(theirs)
    assert_same_samples(theirs[0], ours[0], [*range(25), None])
    unpadded = [idx for idx in range(len(theirs[1])) if idx != padded]
    assert_same_samples(theirs[1], ours[1], [*unpadded, None])


@pytest.mark.parametrize("extra", [True, False], ids=["padded-window", "no-extra-token"])
def test_a_tokenizer_without_pad_pads_where_megatron_raises(corpus, tmp_path, extra):
    """Where megatron-core raises a TypeError (it would pad a window, or set the last label,
    with None), ours pads with -1 as megatron-core does for a tokenizer that has no ``pad``."""
    fields = dict(drop_last_partial_validation_sequence=False, add_extra_token_to_sequence=extra)
    no_pad, ours = build_both(
        corpus, str(tmp_path / "none"), [200, 20, 5], NoPadTokenizer(VOCAB), **fields
    )
    padded = padded_valid_sample(no_pad)
    with pytest.raises(TypeError):
        no_pad[1][padded]
    assert ours[1]._pad_token_id == -1
    without_attribute, _ = build_both(corpus, str(tmp_path / "absent"), [200, 20, 5], **fields)
    assert_same_samples(without_attribute[1], ours[1], [0, padded])


@pytest.fixture(scope="module")
def padded_corpus(tmp_path_factory):
    """Ids 0 to 1023, EOD 1000: past NullTokenizer(1000)'s 1001 ids, within its vocabulary
    padded as Megatron-LM pads it by default (1024 rows)."""
    return write_corpus(str(tmp_path_factory.mktemp("padded") / "corpus"), vocab=1024, eod=1000)


@pytest.mark.parametrize(
    "vocab,divisor,tensor_parallel", [(1000, 128, 1), (50000, 128, 8), (7, 3, 5)]
)
def test_padded_vocabulary_is_the_seed_commit_s(seed, vocab, divisor, tensor_parallel):
    """Our padding formula, and what a GPTDataset reads of a Megatron-LM run's arguments, are
    the padded size the seed's build_tokenizer sets."""
    theirs = seed.call("seed_vocab:padded_vocabulary", vocab, divisor, tensor_parallel)
    assert theirs["megaindex_reads"] == theirs["padded_vocab_size"]
    mine = megaindex.config.padded_vocab_size(theirs["vocab_size"], divisor, tensor_parallel)
    assert mine == theirs["padded_vocab_size"]


@pytest.mark.parametrize(
    "own",
    [{"padded_vocab_size": 1024}, {"check_token_ids": False}, {"megatron_args": 1024}],
    ids=["padded-vocab-size", "check-off", "megatron-args"],
)
def test_ids_in_the_padded_vocabulary_are_read_as_megatron_reads_them(
    padded_corpus, tmp_path, monkeypatch, own
):
    """megatron-core reads every id (the seed trains on those of a padded vocabulary): ours
    does where the padded size is given, read from Megatron-LM's arguments, or the check off."""
    if "megatron_args" in own:  # a Megatron-LM run: its build_tokenizer set padded_vocab_size
        global_vars = types.ModuleType("megatron.training.global_vars")
        args = types.SimpleNamespace(padded_vocab_size=own.pop("megatron_args"))
        global_vars.get_args = lambda: args
        monkeypatch.setitem(sys.modules, global_vars.__name__, global_vars)
    theirs, ours = build_both(padded_corpus, str(tmp_path), [200, 20, 5], own=own)
    assert max(int(theirs[0][idx]["tokens"].max()) for idx in range(25)) > VOCAB
    assert_same_samples(theirs[0], ours[0], list(range(25)))


def test_ids_past_the_vocabulary_are_refused_naming_the_switches(padded_corpus, tmp_path):
    """Without a padded size (or past it) the check stays on, and its error says how to give
    the padded size or turn it off."""
    for own in ({}, {"padded_vocab_size": 1008}):
        _, ours = build_both(padded_corpus, str(tmp_path / str(len(own))), [200, 20, 5], own=own)
        with pytest.raises(megaindex.TokenRangeError) as refused:
            [ours[0][idx] for idx in range(25)]
        assert "padded_vocab_size" in str(refused.value)
        assert "check_token_ids=False" in str(refused.value)


def file_states(directory):
    return {
        name: (
            os.stat(os.path.join(directory, name)).st_ino,
            os.stat(os.path.join(directory, name)).st_mtime_ns,
        )
        for name in sorted(os.listdir(directory))
    }


def shared_cache_fields(corpus, cache):
    return dict(
        random_seed=1234,
        sequence_length=32,
        blend=([corpus], None),
        split="90,8,2",
        tokenizer=NullTokenizer(VOCAB),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=cache,
    )


def test_megatron_loads_our_cache_without_rewriting_it(corpus, tmp_path):
    cache = str(tmp_path / "shared")
    common = shared_cache_fields(corpus, cache)
    ours = megaindex.BlendedMegatronDatasetBuilder(
        megaindex.GPTDataset, [1000, 50, 10], lambda: True, megaindex.GPTDatasetConfig(**common)
    ).build()
    before = file_states(cache)
    theirs = MegatronBuilder(
        MegatronGPTDataset, [1000, 50, 10], lambda: True, MegatronConfig(**common)
    ).build()
    assert file_states(cache) == before
    for reference, mine in zip(theirs, ours, strict=True):
        assert isinstance(reference.sample_index, numpy.memmap)  # loaded, not rebuilt
        assert_same_tables(reference, mine)


def test_we_load_megatrons_cache_without_rebuilding(corpus, tmp_path):
    cache = str(tmp_path / "shared")
    common = shared_cache_fields(corpus, cache)
    theirs = MegatronBuilder(
        MegatronGPTDataset, [1000, 50, 10], lambda: True, MegatronConfig(**common)
    ).build()
    before = file_states(cache)
    ours = megaindex.BlendedMegatronDatasetBuilder(
        megaindex.GPTDataset, [1000, 50, 10], lambda: True, megaindex.GPTDatasetConfig(**common)
    ).build()
    assert file_states(cache) == before
    for reference, mine in zip(theirs, ours, strict=True):
        assert mine.index_source.kind == "cache"
        assert_same_tables(reference, mine)


def test_cli_null_tokenizer_has_megatrons_identity():
    assert (
        IdentifiedTokenizer.null(VOCAB).unique_identifiers
        == NullTokenizer(VOCAB).unique_identifiers
    )
    assert IdentifiedTokenizer.null(VOCAB).eod == NullTokenizer(VOCAB).eod
    assert IdentifiedTokenizer.null(VOCAB).vocab_size == NullTokenizer(VOCAB).vocab_size


def test_mock_dataset_equal(tmp_path):
    common = dict(
        random_seed=5,
        sequence_length=128,
        tokenizer=NullTokenizer(VOCAB),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    theirs = MegatronBuilder(
        MegatronMockGPTDataset, [300, 30, 30], lambda: True, MegatronConfig(**common)
    ).build()
    ours = megaindex.BlendedMegatronDatasetBuilder(
        megaindex.MockGPTDataset, [300, 30, 30], lambda: True, megaindex.GPTDatasetConfig(**common)
    ).build()
    for reference, mine in zip(theirs, ours, strict=True):
        assert_same_tables(reference, mine)
        assert_same_samples(reference, mine, [0, 1, 2, len(reference) - 1, None])


@pytest.mark.parametrize("seed", range(25))
def test_builders_equal_on_random_inputs(seed):
    rng = numpy.random.default_rng(seed)
    documents, epochs = int(rng.integers(1, 300)), int(rng.integers(1, 4))
    sizes = rng.integers(1, 80, documents).astype(numpy.int32)
    stream = numpy.tile(numpy.arange(documents, dtype=numpy.int32), epochs)
    rng.shuffle(stream)
    tokens, length = int(sizes.sum()), int(rng.integers(1, 64))
    for drop_last, extra in itertools.product([True, False], [True, False]):
        if epochs * tokens - extra < 1:
            continue
        reference = megatron_helpers.build_sample_idx(
            sizes, stream, length, epochs, tokens, drop_last, extra
        )
        mine = megaindex.build_sample_idx(sizes, stream, length, epochs, tokens, drop_last, extra)
        assert mine.dtype == reference.dtype
        numpy.testing.assert_array_equal(mine, reference)
        # the int64 kernel too (megatron-core picks it only past 2**31 documents)
        reference64 = megatron_helpers.build_sample_idx_int64(
            sizes, stream, length, epochs, tokens, drop_last, int(extra)
        )
        count = reference64.shape[0] - 1
        from megaindex.backends import implementation

        mine64 = implementation().build_sample_index_int64(sizes, stream, length, count, int(extra))
        assert mine64.dtype == numpy.int64
        numpy.testing.assert_array_equal(mine64, reference64)

    datasets = int(rng.integers(1, 8))
    weights = rng.random(datasets) + 0.05
    weights = (weights / weights.sum()).tolist()
    size = int(rng.integers(1, 5000))
    outputs = []
    for fill in (megatron_helpers.build_blending_indices, megaindex.build_blending_indices):
        index, sample = numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64)
        fill(index, sample, weights, datasets, size, False)
        outputs.append((index, sample))
    numpy.testing.assert_array_equal(outputs[0][0], outputs[1][0])
    numpy.testing.assert_array_equal(outputs[0][1], outputs[1][1])

    counts = rng.integers(1, 400, datasets).astype(numpy.int64)
    outputs = []
    for fill in (
        megatron_helpers.build_exhaustive_blending_indices,
        megaindex.build_exhaustive_blending_indices,
    ):
        index = numpy.zeros(counts.sum(), numpy.int16)
        sample = numpy.zeros(counts.sum(), numpy.int64)
        fill(index, sample, counts, datasets)
        outputs.append((index, sample))
    numpy.testing.assert_array_equal(outputs[0][0], outputs[1][0])
    numpy.testing.assert_array_equal(outputs[0][1], outputs[1][1])


@pytest.mark.parametrize("sizes,fields", [CONFIGS[0], CONFIGS[3]])
def test_tables_equal_with_the_document_index_spilled(corpus, tmp_path, monkeypatch, sizes, fields):
    """Every split's document index written to a file and walked through its mapping."""
    monkeypatch.setattr(gpt_index, "SPILL_MIN_BYTES", 0)
    monkeypatch.setattr(gpt_index, "ONE_CALL_BELOW", 0)  # built step by step, as large ones
    spilled = []
    spill = gpt_index.spill
    monkeypatch.setattr(gpt_index, "spill", lambda *args: spilled.append(1) or spill(*args))
    theirs, ours = build_both(corpus, str(tmp_path), sizes, **fields)
    assert len(spilled) == 3  # one per split
    for reference, mine in zip(theirs, ours, strict=True):
        assert_same_tables(reference, mine)
    # the same files as megatron-core's and our sidecars: no spilled file is left behind
    ours_only = set(os.listdir(tmp_path / "ours")) - set(os.listdir(tmp_path / "megatron"))
    assert all(name.endswith("-megaindex.json") for name in ours_only), ours_only


def megatron_core_tables(lengths, documents, plan, sequence_length, seed, drop_last, extra):
    """megatron-core's three tables from its own builders, in GPTDataset's order."""
    random_state = numpy.random.RandomState(seed)
    document_index = megatron_gpt_dataset._build_document_index(
        documents, plan.num_epochs, random_state, plan.separate_final_epoch
    )
    sample_index = megatron_helpers.build_sample_idx(
        lengths,
        document_index,
        sequence_length,
        plan.num_epochs,
        plan.tokens_per_epoch,
        drop_last,
        extra,
    )
    total = sample_index.shape[0] - 1
    first = plan.samples_before_final_epoch if plan.separate_final_epoch else total
    shuffle_index = megatron_gpt_dataset._build_shuffle_index(first, total, random_state)
    return document_index, sample_index, shuffle_index


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("one_call", [True, False], ids=["one-call", "step-by-step"])
def test_gpt_tables_equal_megatron_cores_on_random_inputs(tmp_path, monkeypatch, seed, one_call):
    """Our tables against megatron-core's builders: one and many epochs, separate final epochs,
    random seeds over RandomState's range. Built in one call of the backend (a small split's
    build), or step by step as a large split's (forced): the shuffle index on a second thread
    on odd seeds, the document index spilled on even ones."""
    if not one_call:
        monkeypatch.setattr(gpt_index, "ONE_CALL_BELOW", 0)
        monkeypatch.setattr(gpt_index, "THREADED_SHUFFLE_MIN_SAMPLES", (seed + 1) % 2 * 10**9)
    rng = numpy.random.default_rng(1000 + seed)
    documents = int(rng.integers(1, 5000))
    lengths = rng.integers(1, 300, documents + 3).astype(numpy.int32)
    indices = numpy.arange(3, 3 + documents, dtype=numpy.int32)
    sequence_length = int(rng.integers(1, 500))
    epochs = int(rng.integers(1, 5))
    tokens = int(lengths[3:].sum())
    num_samples = int(rng.integers(1, epochs * tokens // sequence_length + 2))
    drop_last, extra = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
    random_seed = int(rng.integers(0, 2**32))
    spill = str(tmp_path) if seed % 2 == 0 and not one_call else None
    ours = gpt_index.build_gpt_index_tables(
        lengths, indices, num_samples, sequence_length, random_seed, drop_last, extra, spill, 0
    )
    assert ("tables" in ours.seconds) is one_call
    expected = megatron_core_tables(
        lengths, indices, ours.plan, sequence_length, random_seed, drop_last, extra
    )
    for name, reference in zip(TABLES, expected, strict=True):
        mine = getattr(ours, name)
        assert mine.dtype == reference.dtype, name
        numpy.testing.assert_array_equal(mine, reference, err_msg=name)
