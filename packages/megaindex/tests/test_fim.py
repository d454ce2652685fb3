"""GPTFIMDataset: rearrangement worked by hand, the FIM and SPM rates observed over many
samples against the configured ones, the C++ and numpy layouts agreeing, the stateful stream
(and the per-sample one), the batch path, and configuration errors. Sample-by-sample equality
with the seed commit's dataset is tests/compat/test_fim_compat.py."""

from __future__ import annotations

import copy
import math
import os
from collections import OrderedDict

import numpy
import pytest
import torch
from torch.utils.data import default_collate

import megaindex
from megafmt.builder import IndexedDatasetBuilder
from megafmt.format import get_bin_path, get_idx_path
from megafmt.tokenizers import TextTokenizer
from megaindex import helpers
from megaindex.errors import ConfigError
from megaindex.fim import FIMRates, FIMRearranger, FIMTokens
from megaindex.plugins import DATASETS
from megaindex.tokenizer import IdentifiedTokenizer

SPECIALS = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<sep>"]
EOD, PREFIX, MIDDLE, SUFFIX, PAD, SEP = range(len(SPECIALS))
ALPHABET = "abcdefghijklmnopqrstuvwxyz \n"
FIRST = len(SPECIALS)
VOCAB_SIZE = FIRST + len(ALPHABET)
TOKENS = dict(prefix="<fim_prefix>", middle="<fim_middle>", suffix="<fim_suffix>", pad="<fim_pad>")
EXTRA_TOKENS = {**TOKENS, "eod": "<|endoftext|>"}


class CharTokenizer:
    """One id per character after the special tokens, so text positions are token positions."""

    def tokens_to_ids(self, tokens):
        known = {token: i for i, token in enumerate([*SPECIALS, *ALPHABET])}
        return [known.get(token) for token in tokens]

    def text_to_ids(self, text):
        return [FIRST + ALPHABET.index(c) for c in text]

    def ids_to_text(self, ids, remove_special_tokens=True):
        return "".join(
            ALPHABET[i - FIRST] if i >= FIRST else ("" if remove_special_tokens else SPECIALS[i])
            for i in map(int, ids)
        )


def char_tokenizer() -> IdentifiedTokenizer:
    return IdentifiedTokenizer(
        EOD, VOCAB_SIZE, {"class": "test.CharTokenizer"}, text=CharTokenizer()
    )


def write_documents(prefix: str, documents: list[list[int]]) -> str:
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=numpy.uint16)
    for tokens in documents:
        builder.add_document(numpy.array(tokens, dtype=numpy.uint16), [len(tokens)])
    builder.finalize(get_idx_path(prefix))
    return prefix


def random_documents(seed: int, count: int, longest: int, eod: bool = True, sep: float = 0.0):
    """Documents of random characters (a split token now and then), each ending in EOD."""
    rng = numpy.random.default_rng(seed)
    documents = []
    for _ in range(count):
        tokens = rng.integers(FIRST, VOCAB_SIZE, int(rng.integers(0, longest))).tolist()
        tokens = [SEP if rng.random() < sep else t for t in tokens]
        documents.append([*tokens, EOD] if eod else tokens)
    return documents


@pytest.fixture
def fim_corpus(tmp_path) -> str:
    return write_documents(str(tmp_path / "fim"), random_documents(0, 300, 50, sep=0.05))


@pytest.fixture
def fim_config(make_config):
    """``fim_config(prefix, cache, **overrides)``: a GPTFIMDatasetConfig over the corpus at
    ``prefix`` with the character tokenizer, every rate 0.5, split at ``<sep>``."""

    def make(prefix: str, cache: str, **overrides) -> megaindex.GPTFIMDatasetConfig:
        fields = dict(
            blend=([prefix], None),
            split="100,0,0",
            tokenizer=char_tokenizer(),
            path_to_cache=cache,
            fim_rate=0.5,
            fim_spm_rate=0.5,
            fim_extra_tokens=EXTRA_TOKENS,
            fim_split_sample="<sep>",
            fim_fragment_rate=0.5,
        )
        return make_config(megaindex.GPTFIMDatasetConfig, **{**fields, **overrides})

    return make


def build(config, sizes=(500, 0, 0), cls=None):
    return megaindex.BlendedMegatronDatasetBuilder(
        cls or megaindex.GPTFIMDataset, list(sizes), lambda: True, config
    ).build()


def test_the_plugin_is_registered():
    assert DATASETS.get("fim") is megaindex.GPTFIMDataset
    assert isinstance(CharTokenizer(), TextTokenizer)


def test_one_piece_by_hand():
    """No EOD, no split token: the draws are binomial(rate), randint(0, len + 1, 2), then
    binomial(spm_rate); PSM and SPM laid out as the FIM paper's variants, cut to length."""
    text = "abcdefghij"
    sample = numpy.array(CharTokenizer().text_to_ids(text), dtype=numpy.int64)
    tokens = FIMTokens(PREFIX, MIDDLE, SUFFIX, PAD, EOD)
    for seed in range(30):
        for spm in (0.0, 1.0):
            rearranger = FIMRearranger(CharTokenizer(), tokens, FIMRates(1.0, spm))
            got = rearranger.rearrange(numpy.random.RandomState(seed), sample)
            draws = numpy.random.RandomState(seed)
            assert draws.binomial(1, 1.0) == 1
            first, second = sorted(draws.randint(0, len(text) + 1, size=2).tolist())
            pre, mid, suf = (
                CharTokenizer().text_to_ids(part)
                for part in (text[:first], text[first:second], text[second:])
            )
            if spm:
                expected = [PREFIX, SUFFIX, *suf, MIDDLE, *pre, *mid]
            else:
                expected = [PREFIX, *pre, SUFFIX, *suf, MIDDLE, *mid]
            assert got.tolist() == expected[: len(text)]


def test_segments_and_fragments_by_hand():
    """EODs cut segments and split tokens cut fragments; an empty segment or fragment is
    dropped with the token after it, and the FIM pad fills up; the part after the last EOD is
    rearranged even when empty (three sentinels)."""
    a, b, c = (FIRST + i for i in range(3))
    sample = numpy.array([EOD, b, SEP, c, SEP, SEP, a, EOD, EOD], dtype=numpy.int64)
    tokens = FIMTokens(PREFIX, MIDDLE, SUFFIX, PAD, EOD, split=SEP)
    # the segment holds the split token: one draw at fim_rate (0) leaves it whole
    rearranger = FIMRearranger(CharTokenizer(), tokens, FIMRates(0.0, 0.0, 0.0))
    got = rearranger.rearrange(numpy.random.RandomState(0), sample)
    assert got.tolist() == [b, SEP, c, SEP, SEP, a, EOD, PAD, PAD]
    # rate 1, fragment rate 0: fragments kept, the empty one dropped with its split token; the
    # empty tail rearranged in PSM form
    rearranger = FIMRearranger(CharTokenizer(), tokens, FIMRates(1.0, 0.0, 0.0))
    got = rearranger.rearrange(numpy.random.RandomState(0), sample)
    assert got.tolist() == [b, SEP, c, SEP, a, EOD, PREFIX, SUFFIX, MIDDLE]


def test_observed_rates_match_the_configured_ones(fim_config, tmp_path):
    """Samples of one piece each (no EOD, no split token in the data): a rearranged sample
    starts with the prefix sentinel (share: fim_rate); SPM puts the suffix sentinel right
    after it, as PSM does when the prefix is empty (probability q = 1 - (L / (L + 1))^2 for a
    text of L characters), so the expected share is spm + (1 - spm) q."""
    corpus = write_documents(str(tmp_path / "long"), random_documents(1, 20, 4000, eod=False))
    rate, spm, samples = 0.3, 0.7, 4000
    config = fim_config(
        corpus, str(tmp_path / "cache"), fim_rate=rate, fim_spm_rate=spm, fim_split_sample=None
    )
    dataset = build(config, (samples, 0, 0))[0]
    texts = [dataset[i]["tokens"].numpy() for i in range(samples)]
    rearranged = [t for t in texts if t[0] == PREFIX]
    sigma = math.sqrt(rate * (1 - rate) / samples)
    assert abs(len(rearranged) / samples - rate) < 4 * sigma
    length = config.sequence_length + 1
    q = 1 - (length / (length + 1)) ** 2
    expected = spm + (1 - spm) * q
    observed = sum(t[1] == SUFFIX for t in rearranged) / len(rearranged)
    assert abs(observed - expected) < 4 * math.sqrt(expected * (1 - expected) / len(rearranged))
    print(
        f"fim rate {len(rearranged) / samples:.4f} (configured {rate}), SPM-looking share "
        f"{observed:.4f} (expected {expected:.4f} for spm_rate {spm})"
    )


def test_fim_rate_zero_gives_gptdatasets_samples_and_its_own_cache(
    fim_config, fim_corpus, tmp_path
):
    """Same tables; samples are GPTDataset's but for the EODs that end an empty segment (a
    window's first token, the second of two), dropped and made up for by FIM pads."""
    config = fim_config(fim_corpus, str(tmp_path / "cache"), fim_rate=0.0)
    fim = build(config)[0]
    plain = build(config, cls=megaindex.GPTDataset)[0]
    for name in ("document_index", "sample_index", "shuffle_index"):
        numpy.testing.assert_array_equal(getattr(fim, name), getattr(plain, name))
    collapsed = 0
    for idx in range(200):
        reference = plain[idx]
        text = [*reference["tokens"].tolist(), int(reference["labels"][-1])]
        kept = [t for i, t in enumerate(text) if t != EOD or (i > 0 and text[i - 1] != EOD)]
        collapsed += len(kept) < len(text)
        expected = kept + [PAD] * (len(text) - len(kept))
        sample = fim[idx]
        assert sample["tokens"].tolist() == expected[:-1], idx
        assert sample["labels"].tolist() == expected[1:], idx
    assert collapsed  # the corpus has such windows
    names = os.listdir(tmp_path / "cache")
    tables = {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"}
    for cls, dataset in (("GPTFIMDataset", fim), ("GPTDataset", plain)):
        base = f"{dataset.unique_description_hash}-{cls}-train-"
        assert {base + table for table in tables} <= set(names)
    assert fim.unique_description_hash != plain.unique_description_hash


@pytest.mark.parametrize("split_sample", [None, "<sep>"])
def test_cpp_and_numpy_layouts_give_the_same_samples(
    fim_config, fim_corpus, tmp_path, use_backend, split_sample
):
    rows = []
    for backend in ("cpp", "numpy"):
        use_backend(backend)
        assert megaindex.backend() == backend
        config = fim_config(
            fim_corpus, str(tmp_path / backend), fim_rate=0.8, fim_split_sample=split_sample
        )
        dataset = build(config)[0]
        rows.append(numpy.stack([dataset[i]["tokens"].numpy() for i in range(300)]))
    numpy.testing.assert_array_equal(rows[0], rows[1])
    assert (rows[0] == PREFIX).any()


@pytest.mark.parametrize("seed", range(5))
def test_fim_assemble_agrees_on_both_backends(seed, use_backend):
    rng = numpy.random.default_rng(seed)
    sample = rng.integers(0, 100, 40).astype(numpy.int64)
    inserted = rng.integers(100, 200, 30).astype(numpy.int64)
    runs = []
    for _ in range(int(rng.integers(0, 8))):
        source = int(rng.integers(0, 2))
        size = len(sample) if source == 0 else len(inserted)
        start = int(rng.integers(0, size + 1))
        runs.append([source, start, int(rng.integers(start, size + 1))])
    runs = numpy.array(runs, dtype=numpy.int64).reshape(-1, 3)
    width = int(rng.integers(1, 80))
    outcomes = []
    for backend in ("cpp", "numpy"):
        use_backend(backend)
        out = numpy.zeros(width, dtype=numpy.int64)
        total = helpers.fim_assemble(sample, inserted, runs, out, -5)
        outcomes.append((total, out.tolist()))
    assert outcomes[0] == outcomes[1]
    laid_out = [*(([sample, inserted][s][a:b]).tolist() for s, a, b in runs.tolist())]
    flat = [token for run in laid_out for token in run]
    assert outcomes[0][0] == len(flat)
    assert outcomes[0][1] == (flat + [-5] * width)[:width]


@pytest.mark.parametrize("run", [[2, 0, 1], [0, 3, 2], [1, 0, 9], [0, -1, 1]])
def test_bad_runs_are_the_same_index_error_on_both_backends(run, use_backend):
    messages = []
    for backend in ("cpp", "numpy"):
        use_backend(backend)
        out = numpy.full(4, 7, dtype=numpy.int64)
        with pytest.raises(IndexError) as raised:
            helpers.fim_assemble(
                numpy.arange(5, dtype=numpy.int64),
                numpy.arange(3, dtype=numpy.int64),
                numpy.array([[0, 0, 1], run], dtype=numpy.int64),
                out,
                0,
            )
        assert out.tolist() == [7] * 4  # untouched
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"run 1 = ({run[0]}, {run[1]}, {run[2]})")


def test_fim_assemble_arguments_are_refused_naming_them():
    sample = numpy.arange(5, dtype=numpy.int64)
    runs = numpy.array([[0, 0, 5]], dtype=numpy.int64)
    with pytest.raises(TypeError, match="sample must be int64, got int32"):
        helpers.fim_assemble(
            sample.astype(numpy.int32), sample, runs, numpy.empty(5, numpy.int64), 0
        )
    with pytest.raises(ValueError, match=r"runs must have shape \(any, 3\)"):
        helpers.fim_assemble(sample, sample, runs[:, :2].copy(), numpy.empty(5, numpy.int64), 0)
    with pytest.raises(ValueError, match="out must not overlap sample"):
        helpers.fim_assemble(sample, sample[:0].copy(), runs, sample, 0)


def test_the_stream_is_stateful_as_megatron_lms(fim_config, fim_corpus, tmp_path):
    """One RandomState per dataset object: a sample depends on what was read before it; the
    same reads from a fresh (or copied) dataset give the same samples."""
    config = fim_config(fim_corpus, str(tmp_path / "cache"), fim_rate=1.0, fim_split_sample=None)
    order = [5, 3, 7, 5]
    first = build(config)[0]
    copied = copy.deepcopy(first)  # what a DataLoader worker gets: the stream at its start
    reads = [first[i]["tokens"] for i in order]
    again = [copied[i]["tokens"] for i in order]
    assert all(torch.equal(x, y) for x, y in zip(reads, again, strict=True))
    assert not torch.equal(reads[0], reads[3])  # sample 5, read twice, drew twice
    reversed_reads = {i: build(config)[0][i]["tokens"] for i in reversed(order[:3])}
    assert any(not torch.equal(reversed_reads[i], reads[n]) for n, i in enumerate(order[:3]))


def test_sample_seeded_stream_does_not_depend_on_the_order(fim_config, fim_corpus, tmp_path):
    config = fim_config(fim_corpus, str(tmp_path / "cache"), fim_rate=1.0, fim_sample_seeded=True)
    forward = build(config)[0]
    backward = build(config)[0]
    ahead = [forward[i]["tokens"] for i in range(20)]
    behind = [backward[i]["tokens"] for i in reversed(range(20))][::-1]
    assert all(torch.equal(x, y) for x, y in zip(ahead, behind, strict=True))
    assert torch.equal(forward[4]["tokens"], ahead[4])  # and again: the same sample


def test_a_batch_equals_its_samples_read_in_order(fim_config, fim_corpus, tmp_path):
    """__getitems__ (the loader's fast path) shapes each row in order, padding included."""
    config = fim_config(fim_corpus, str(tmp_path / "cache"), fim_rate=0.9)
    indices = [4, 1, None, 4, -2, 30]
    batch = build(config)[0].__getitems__(indices).collated
    single = build(config)[0]
    expected = default_collate([single[i] for i in indices])
    for key, value in expected.items():
        assert torch.equal(batch[key], value), key


def test_a_kept_last_partial_sample_is_padded_after_its_rearranged_tokens(fim_config, tmp_path):
    corpus = write_documents(str(tmp_path / "c"), random_documents(2, 40, 30))
    config = fim_config(
        corpus,
        str(tmp_path / "cache"),
        split="50,50,0",
        fim_rate=1.0,
        drop_last_partial_validation_sequence=False,
    )
    valid = build(config, (None, None, None))[1]
    # the partial sample is the last of the sample index, wherever the shuffle put it
    last = int(numpy.flatnonzero(valid.shuffle_index == len(valid) - 1)[0])
    length = valid._sample_length(last)
    assert length < config.sequence_length + 1
    sample = valid[last]
    assert sample["tokens"].shape == (config.sequence_length,)
    assert sample["loss_mask"][length - 1 :].sum() == 0  # labels past the sample are padding
    assert (sample["labels"][length - 1 :] == 0).all()


class MegatronStyleTokenizer:
    """A Megatron tokenizer: the library tokenizer in ``_tokenizer``, as the seed reads it."""

    def __init__(self) -> None:
        self._tokenizer = CharTokenizer()
        self.eod = EOD
        self.vocab_size = VOCAB_SIZE
        self.unique_identifiers = OrderedDict({"class": "test.Megatron"})


def test_a_megatron_tokenizer_is_used_through_its_library(fim_config, fim_corpus, tmp_path):
    config = fim_config(fim_corpus, str(tmp_path / "m"), tokenizer=MegatronStyleTokenizer())
    ours = fim_config(fim_corpus, str(tmp_path / "o"))
    for idx in range(20):
        assert torch.equal(build(config)[0][idx]["tokens"], build(ours)[0][idx]["tokens"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"fim_rate": None}, r"fim_rate must be a probability in \[0, 1\], got None"),
        ({"fim_spm_rate": 1.5}, r"fim_spm_rate must be a probability in \[0, 1\], got 1.5"),
        ({"fim_fragment_rate": -0.1}, r"fim_fragment_rate must be a probability .* got -0.1"),
        ({"fim_extra_tokens": None}, "pad and eod to token strings; prefix, middle, suffix"),
        ({"fim_extra_tokens": {**EXTRA_TOKENS, "pad": 4}}, "pad missing or not a string"),
    ],
)
def test_bad_configurations_are_refused(fim_config, fim_corpus, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        fim_config(fim_corpus, str(tmp_path), **overrides)


def test_tokens_not_in_the_vocabulary_are_refused(fim_config, fim_corpus, tmp_path):
    config = fim_config(fim_corpus, str(tmp_path), fim_extra_tokens={**EXTRA_TOKENS, "middle": "?"})
    with pytest.raises(ConfigError, match="the FIM middle token '\\?' is not one token"):
        build(config)
    config = fim_config(fim_corpus, str(tmp_path), tokenizer=IdentifiedTokenizer.null(10))
    with pytest.raises(ConfigError, match="needs a tokenizer with tokens_to_ids"):
        build(config)


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "file-reader"])
def test_a_blend_of_fim_corpora_batches_as_its_samples_one_by_one(fim_config, tmp_path, mapped):
    """Each part shapes its own rows (GPT's blend reading, part by part) at any batch size
    (samples seeded by index: the seed's one stream of draws depends on the reading order)."""
    prefixes = [
        write_documents(str(tmp_path / f"fim{n}"), random_documents(n, 200, 50, sep=0.05))
        for n in (1, 2)
    ]
    config = fim_config(
        prefixes[0],
        str(tmp_path / "cache"),
        blend=(prefixes, [0.6, 0.4]),
        mmap_bin_files=mapped,
        fim_sample_seeded=True,
    )
    blend = build(config, sizes=(60, 0, 0))[0]
    assert isinstance(blend, megaindex.BlendedDataset) and blend.blend_gatherer().native() is None
    indices = [0, 5, None, 17, 33, 59, 2]
    batch = blend.__getitems__(indices).collated
    expected = default_collate([blend[idx] for idx in indices])
    assert list(batch) == list(expected)
    for key, value in expected.items():
        assert torch.equal(batch[key], value), key
