"""megaindex's GPTFIMDataset against the seed commit's (Megatron-LM e03878b5f, run by
testing/seedref.py): for the same corpus, seed, tokenizer and FIM options, the same samples in
the same order of reads, and the same cache identity. The tokenizer is a byte-level BPE trained
here (no download), read by megafmt on our side and by the seed commit's HuggingFaceTokenizer
(over transformers) on its side."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy
import pytest
import torch
from fimtesting import (
    EOD,
    FILE_SEP,
    FIM_EXTRA_TOKENS,
    SENTINELS,
    code_text,
    write_code_corpus,
    write_tokenizer,
)

import megaindex
from megafmt.tokenizers import TokenizerOptions, load_tokenizer
from megaindex.tokenizer import IdentifiedTokenizer
from megaload import DataLoaderConfig, build_pretraining_data_loader

pytestmark = pytest.mark.compat

NO_PREFIXES = ["def", "x", " ", "#", "import"]
IDENTIFIERS = {"class": "test.fim.ByteLevelBPE", "vocab": 400}


def document_text(rng: random.Random) -> str:
    """A document: files joined by the split token, now and then an EOD or a sentinel inside."""
    files = [code_text(rng, rng.randint(0, 40)) for _ in range(rng.randint(1, 3))]
    text = FILE_SEP.join(files)
    if rng.random() < 0.1:
        text += rng.choice([EOD, EOD + EOD, *SENTINELS]) + code_text(rng, rng.randint(0, 40))
    return text


@pytest.fixture(scope="module")
def seed(shared_seed):
    """The session's seed worker (not one of this module's own, ~20 s to start): every call
    builds its datasets afresh, into a cache folder of its own, and leaves nothing behind."""
    return shared_seed


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    rng = random.Random(5)
    texts = [code_text(rng, rng.randint(0, 40)) for _ in range(2000)]
    return write_tokenizer(tmp_path_factory.mktemp("fim-tokenizer"), IDENTIFIERS["vocab"], texts)


@pytest.fixture(scope="module")
def ours_tokenizer(tokenizer_dir):
    text = load_tokenizer("huggingface", TokenizerOptions(model=tokenizer_dir))
    return IdentifiedTokenizer(text.eod, text.vocab_size, IDENTIFIERS, text=text)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, ours_tokenizer):
    """400 documents of code-like text, each ending in EOD; some empty, some with EODs,
    sentinels or split tokens inside."""
    prefix = str(tmp_path_factory.mktemp("fim-corpus") / "code")
    rng = random.Random(11)
    texts = ["" if rng.random() < 0.05 else document_text(rng) for _ in range(400)]
    write_code_corpus(prefix, ours_tokenizer.text, texts)
    return prefix


def random_case(rng: random.Random) -> tuple[list[int], dict]:
    """Sample counts and GPTFIMDatasetConfig fields: every FIM option, drawn."""
    split_sample = rng.choice([None, FILE_SEP])
    fields = {
        "random_seed": rng.randrange(10_000),
        "sequence_length": rng.choice([8, 16, 31, 64, 128, 256]),
        "split": rng.choice(["100,0,0", "90,8,2"]),
        "fim_rate": rng.choice([0.0, 0.1, 0.5, 0.9, 1.0, rng.random()]),
        "fim_spm_rate": rng.choice([0.0, 0.5, 1.0, rng.random()]),
        "fim_extra_tokens": FIM_EXTRA_TOKENS,
        "fim_split_sample": split_sample,
        # None is Megatron-LM's default: accepted until a fragment needs it (then both fail)
        "fim_fragment_rate": rng.choice([None, 0.0, 0.5, 1.0, rng.random()]),
        "fim_no_prefix": rng.choice([None, None, *NO_PREFIXES]),
    }
    return [rng.choice([200, 1000]), 40, 10], fields


def random_reads(rng: random.Random, lengths: list[int]) -> list[tuple[int, int | None]]:
    """Reads across the splits in a random order: repeats, padding (None), negative indices."""
    splits = [split for split, n in enumerate(lengths) if n]
    reads = []
    for _ in range(60):
        split = rng.choice(splits)
        n = lengths[split]
        idx = rng.choice([rng.randrange(n), rng.randrange(n), None, -1 - rng.randrange(n)])
        reads.append((split, idx))
    return reads


def seed_fim_samples(
    seed, corpus, tokenizer_dir, ours_tokenizer, sizes, fields, cache, reads, *classes
) -> dict:
    """The seed commit's FIM datasets over ``corpus`` (``fields`` with their cache at
    ``cache``), read at ``reads``; ``classes``: the builder and dataset to take from megaindex
    instead (seedside/seed_fim.py)."""
    tokenizer = (tokenizer_dir, ours_tokenizer.eod, IDENTIFIERS)
    return seed.call(
        "seed_fim:fim_samples",
        corpus,
        tokenizer,
        sizes,
        {**fields, "path_to_cache": cache},
        reads,
        *classes,
    )


def build_ours(corpus, tokenizer, sizes, fields, cache):
    config = megaindex.GPTFIMDatasetConfig(
        blend=([corpus], None),
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=cache,
        **fields,
    )
    return megaindex.BlendedMegatronDatasetBuilder(
        megaindex.GPTFIMDataset, sizes, lambda: True, config
    ).build()


def assert_same(reference: dict, sample: dict, where: str) -> None:
    assert list(sample) == list(reference), where
    for key, value in reference.items():
        mine = sample[key]
        assert isinstance(mine, torch.Tensor), (where, key)
        assert mine.numpy().dtype == value.dtype, (where, key)
        numpy.testing.assert_array_equal(mine.numpy(), value, err_msg=f"{where} {key}")


CASES = 40


@pytest.mark.parametrize("case", range(CASES))
def test_samples_equal_the_seed_commits(
    seed, corpus, tokenizer_dir, ours_tokenizer, tmp_path, case
):
    rng = random.Random(case)
    sizes, fields = random_case(rng)
    ours = build_ours(corpus, ours_tokenizer, sizes, fields, str(tmp_path / "ours"))
    reads = random_reads(rng, [0 if d is None else len(d) for d in ours])
    theirs = seed_fim_samples(
        seed, corpus, tokenizer_dir, ours_tokenizer, sizes, fields, str(tmp_path / "seed"), reads
    )
    for split, dataset in enumerate(ours):
        if dataset is None:
            assert theirs["descriptions"][split] is None
            continue
        assert dataset.unique_description == theirs["descriptions"][split]
        assert dataset.unique_description_hash == theirs["hashes"][split]
    # half the cases read one by one (__getitem__), half as batches (__getitems__)
    batched = case % 2 == 1
    failed = theirs["failed"]
    if failed is not None:  # only an unset fragment rate may fail, and then ours fails there
        assert fields["fim_fragment_rate"] is None and fields["fim_split_sample"], failed
        assert failed[1] == "TypeError", failed  # numpy's, drawing at probability None
    for start in range(0, len(reads), 7):
        samples = read_chunk(ours, reads[start : start + 7], start, batched, failed)
        for offset, sample in enumerate(samples):
            where = f"case {case} read {start + offset} {reads[start + offset]} {fields}"
            assert_same(theirs["samples"][start + offset], sample, where)
        if failed is not None and failed[0] < start + 7:
            break
    if fields["fim_rate"] >= 0.5 and failed is None:  # the case did rearrange samples
        prefix = ours_tokenizer.text.tokens_to_ids(["<fim_prefix>"])[0]
        assert any((s["tokens"] == prefix).any() for s in theirs["samples"])


def read_chunk(ours, chunk, start, batched, failed) -> list[dict]:
    """Our samples for the reads ``chunk`` (read number ``start`` on): as one batch when
    ``batched`` and they share a split, else one by one. Where the seed failed (read number
    ``failed[0]``), ours must fail too, naming the unset fragment rate: the samples before it
    (one by one), or none (a batch)."""
    fails_at = None if failed is None else failed[0] - start
    unset_rate = pytest.raises(megaindex.ConfigError, match="fim_fragment_rate is None")
    if batched and len({split for split, _ in chunk}) == 1:
        if fails_at is not None and fails_at < len(chunk):
            with unset_rate:
                ours[chunk[0][0]].__getitems__([idx for _, idx in chunk])
            return []
        batch = ours[chunk[0][0]].__getitems__([idx for _, idx in chunk])
        return [dict(zip(batch.collated, row, strict=True)) for row in _rows(batch)]
    samples = []
    for offset, (split, idx) in enumerate(chunk):
        if offset == fails_at:
            with unset_rate:
                ours[split][idx]
            break
        samples.append(ours[split][idx])
    return samples


def _rows(batch) -> list[list[torch.Tensor]]:
    """The samples of a collated batch, one list of tensors per row."""
    columns = list(batch.collated.values())
    return [[column[row] for column in columns] for row in range(len(columns[0]))]


@pytest.mark.parametrize("fim_rate", [0.0, 1.0])
def test_an_unset_fragment_rate_is_accepted_as_the_seed_accepts_it(
    seed, corpus, tokenizer_dir, ours_tokenizer, tmp_path, fim_rate
):
    """fim_fragment_rate None with fim_split_sample set (--fim-fragment-rate's default): the
    seed builds the dataset and serves samples until one draws a segment holding the split token
    for rearranging, where it fails; ours serves the same samples and fails at the same read,
    naming the field. At fim_rate 0 nothing is drawn for rearranging: every sample is served."""
    _, fields = random_case(random.Random(5))
    fields.update(
        fim_rate=fim_rate, fim_split_sample=FILE_SEP, fim_fragment_rate=None, split="100,0,0"
    )
    sizes = [200, 0, 0]
    ours = build_ours(corpus, ours_tokenizer, sizes, fields, str(tmp_path / "ours"))
    reads = [(0, idx) for idx in range(60)]
    theirs = seed_fim_samples(
        seed, corpus, tokenizer_dir, ours_tokenizer, sizes, fields, str(tmp_path / "seed"), reads
    )
    failed = theirs["failed"]
    assert (failed is None) == (fim_rate == 0.0), failed
    samples = read_chunk(ours, reads, 0, False, failed)
    assert len(samples) == len(theirs["samples"]) == (60 if failed is None else failed[0])
    for number, (reference, sample) in enumerate(zip(theirs["samples"], samples, strict=True)):
        assert_same(reference, sample, f"read {number}")


@pytest.mark.parametrize(
    ("builder", "cls"), [("megaindex", "seed"), ("megaindex", "megaindex"), ("seed", "megaindex")]
)
def test_megatron_lm_s_own_fim_config_builds_with_our_builder_and_dataset(
    seed, corpus, tokenizer_dir, ours_tokenizer, tmp_path, builder, cls
):
    """A partly switched ``pretrain_gpt.py --fim-data``: Megatron-LM's own GPTFIMDatasetConfig
    (none of megaindex's fields) given to megaindex's builder with Megatron-LM's GPTFIMDataset
    or ours, or to the seed's builder with ours: the seed's samples and cache identity."""
    sizes, fields = random_case(random.Random(8))
    fields.update(fim_rate=0.8, fim_split_sample=FILE_SEP, fim_fragment_rate=0.5)
    reads = [(0, idx) for idx in [*range(30), None, -1, -7, 3]]
    theirs = seed_fim_samples(
        seed, corpus, tokenizer_dir, ours_tokenizer, sizes, fields, str(tmp_path / "seed"), reads
    )
    mixed = seed_fim_samples(
        seed,
        corpus,
        tokenizer_dir,
        ours_tokenizer,
        sizes,
        fields,
        str(tmp_path / "mixed"),
        reads,
        builder,
        cls,
    )
    assert mixed["failed"] is None and theirs["failed"] is None
    assert mixed["descriptions"] == theirs["descriptions"] and mixed["hashes"] == theirs["hashes"]
    assert len(mixed["samples"]) == len(theirs["samples"]) == len(reads)
    for number, (reference, sample) in enumerate(
        zip(theirs["samples"], mixed["samples"], strict=True)
    ):
        assert list(sample) == list(reference), number
        for key, value in reference.items():
            numpy.testing.assert_array_equal(sample[key], value, err_msg=f"read {number} {key}")


def test_the_seed_and_ours_share_the_cache(seed, corpus, tokenizer_dir, ours_tokenizer, tmp_path):
    """The seed commit loads the tables we built (same names beside the corpus: nothing new is
    written), and the description names the class GPTFIMDataset."""
    sizes, fields = random_case(random.Random(99))
    cache = str(tmp_path / "shared")
    ours = build_ours(corpus, ours_tokenizer, sizes, fields, cache)
    assert json.loads(ours[0].unique_description)["class"] == "GPTFIMDataset"
    written = sorted(p.name for p in Path(cache).iterdir())
    assert all("-GPTFIMDataset-" in name for name in written)
    seed_fim_samples(seed, corpus, tokenizer_dir, ours_tokenizer, sizes, fields, cache, [])
    assert sorted(p.name for p in Path(cache).iterdir()) == written


def test_tokenizer_round_trip_equals_the_seed_library(seed, tokenizer_dir, ours_tokenizer):
    """megafmt's huggingface tokenizer decodes, encodes and looks up tokens as the seed
    commit's HuggingFaceTokenizer does over transformers (special tokens removed as declared)."""
    rng = random.Random(3)
    vocab = ours_tokenizer.vocab_size
    id_lists = [[rng.randrange(vocab + 3) for _ in range(rng.randint(0, 30))] for _ in range(200)]
    texts = [document_text(rng) for _ in range(100)]
    theirs = seed.call("seed_fim:library_round_trip", tokenizer_dir, id_lists, texts)
    text = ours_tokenizer.text
    assert [text.ids_to_text(ids, remove_special_tokens=True) for ids in id_lists] == theirs[
        "decoded"
    ]
    assert [text.text_to_ids(t) for t in texts] == theirs["encoded"]
    assert text.tokens_to_ids(["<fim_prefix>", EOD, "not-a-token"]) == theirs["tokens"]


def test_without_the_extra_token_the_seed_reads_one_token_more(
    seed, corpus, tokenizer_dir, ours_tokenizer, tmp_path
):
    """A reference quirk, not reproduced: the seed commit's FIM dataset always reads a window
    of sequence_length + 1 tokens, so with add_extra_token_to_sequence=False its samples hold
    one token more than the sequence length. Ours hold sequence_length tokens, as GPTDataset's
    do; without rearrangement (fim_rate 0) they are the seed commit's first tokens."""
    _, fields = random_case(random.Random(7))
    fields.update(add_extra_token_to_sequence=False, fim_rate=0.0, sequence_length=16)
    ours = build_ours(corpus, ours_tokenizer, [200, 40, 10], fields, str(tmp_path / "ours"))
    reads = [(0, idx) for idx in range(20)]
    theirs = seed_fim_samples(
        seed,
        corpus,
        tokenizer_dir,
        ours_tokenizer,
        [200, 40, 10],
        fields,
        str(tmp_path / "seed"),
        reads,
    )
    for (_, idx), reference in zip(reads, theirs["samples"], strict=True):
        assert reference["tokens"].shape == (17,)
        mine = ours[0][idx]["tokens"]
        assert mine.shape == (16,)
        numpy.testing.assert_array_equal(mine.numpy(), reference["tokens"][:16])


@pytest.mark.parametrize("workers", [0, 2])
def test_megaloads_batches_equal_megatron_lms_loader(
    seed, corpus, tokenizer_dir, ours_tokenizer, tmp_path, workers
):
    """megaload's loader (batches assembled by __getitems__) against Megatron-LM's loader over
    the seed commit's FIM dataset: with workers each holds its own copy of the stream, started
    at the seed, on both sides, so the batches agree batch for batch."""
    sizes, fields = random_case(random.Random(21))
    fields.update(fim_rate=0.7, sequence_length=32)
    sizes = [160, 0, 0]
    fields["split"] = "100,0,0"
    ours = build_ours(corpus, ours_tokenizer, sizes, fields, str(tmp_path / "ours"))[0]
    theirs = seed.call(
        "seed_fim:loader_batches",
        corpus,
        (tokenizer_dir, ours_tokenizer.eod, IDENTIFIERS),
        sizes,
        {**fields, "path_to_cache": str(tmp_path / "seed")},
        4,
        workers,
    )
    config = DataLoaderConfig(micro_batch_size=4, num_workers=workers)
    mine = list(build_pretraining_data_loader(ours, 0, config))
    assert len(mine) == len(theirs) > 0
    for number, (reference, batch) in enumerate(zip(theirs, mine, strict=True)):
        assert_same(reference, batch, f"batch {number}")


class MegatronCoreTokenizer:
    """A Megatron tokenizer as a job hands it over: megatron-core 0.16.1's HuggingFaceTokenizer
    library in ``_tokenizer`` (what GPTFIMDataset uses), with the eod and identity."""

    def __init__(self, directory: str, eod: int) -> None:
        from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import (
            HuggingFaceTokenizer,
        )

        self._tokenizer = HuggingFaceTokenizer(directory, include_special_tokens=False)
        self.eod = eod
        self.vocab_size = self._tokenizer.vocab_size
        self.unique_identifiers = dict(IDENTIFIERS)


@pytest.mark.parametrize("case", [3])
def test_a_megatron_tokenizer_gives_the_seed_commits_samples(
    seed, corpus, tokenizer_dir, ours_tokenizer, tmp_path, case
):
    """Drop-in: given a Megatron tokenizer object (not megafmt's), the same samples."""
    rng = random.Random(case)
    sizes, fields = random_case(rng)
    megatron_tokenizer = MegatronCoreTokenizer(tokenizer_dir, ours_tokenizer.eod)
    ours = build_ours(corpus, megatron_tokenizer, sizes, fields, str(tmp_path / "ours"))
    reads = random_reads(rng, [0 if d is None else len(d) for d in ours])
    theirs = seed_fim_samples(
        seed, corpus, tokenizer_dir, ours_tokenizer, sizes, fields, str(tmp_path / "seed"), reads
    )
    for number, (split, idx) in enumerate(reads):
        assert_same(theirs["samples"][number], ours[split][idx], f"read {number} {fields}")
