"""Where a configuration meets the edge of its data: empty splits, ``sequences_per_dataset``,
the token dtype a vocabulary implies, a cache trusted and absent, and the error classes users
catch (each also what megatron-core raises there)."""

import warnings

import numpy
import pytest

import megaindex
from megafmt.testing import write_corpus
from megaindex import (
    BlendedMegatronDatasetBuilder,
    ConfigError,
    EmptySplitError,
    GPTDataset,
    IndexBuildError,
    MegaindexError,
    MissingCacheError,
    MissingSequenceCountError,
    SequenceCountError,
    TokenDtypeError,
)
from megaindex.tokenizer import IdentifiedTokenizer

TABLES = ("document_index", "sample_index", "shuffle_index")


def build(config, sizes):
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


@pytest.fixture
def small(tmp_path):
    """10 documents: a 99,1,0 split leaves the valid split none."""
    return write_corpus(str(tmp_path / "small"), documents=10)


@pytest.mark.parametrize(
    "valid_size,extra", [(None, True), (None, False), (0, False)], ids=["none", "none-", "zero-"]
)
def test_a_split_without_documents_asked_for_nothing_is_an_empty_dataset(
    make_config, small, valid_size, extra
):
    config = make_config(blend=([small], None), split="99,1,0", add_extra_token_to_sequence=extra)
    train, valid, test = build(config, [10, valid_size, None])
    assert test is None and len(train) >= 10
    assert isinstance(valid, GPTDataset) and len(valid) == 0
    assert valid.sample_index.tolist() == [[0, 0]]
    assert len(valid.document_index) == 0 and len(valid.shuffle_index) == 0
    with pytest.raises(IndexError):
        valid[0]
    again = build(config, [10, valid_size, None])[1]  # cached like any other
    assert again.index_source.kind == "cache" and len(again) == 0


def test_a_split_of_empty_documents_asked_for_samples_is_a_clear_error(make_config, tmp_path):
    prefix = megaindex_corpus(tmp_path, [[], [], [], [5, 6, 7]])
    config = make_config(blend=([prefix], None), split="3,1,0")
    train, valid, _ = build(config, [None, 1, None])
    assert len(train) == 0 and len(train.document_index) == 3  # three empty documents
    assert len(valid) >= 1
    with pytest.raises(EmptySplitError, match=r"\(train split\): 2 samples need 65 tokens"):
        build(config, [2, 1, None])


def megaindex_corpus(tmp_path, documents, dtype=numpy.uint16):
    from megafmt import IndexedDatasetBuilder

    prefix = str(tmp_path / f"corpus-{numpy.dtype(dtype).name}")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for tokens in documents:
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(prefix + ".idx")
    return prefix


def test_an_unweighted_blend_with_an_empty_part_fails_as_megatron_cores_assert(
    make_config, small, corpus
):
    # the valid part of `small` is empty: its weight (its length) is 0, which megatron-core's
    # BlendedDataset asserts against
    config = make_config(blend=([small, corpus], None), split="99,1,0")
    with pytest.raises(AssertionError, match="blend weights must be positive"):
        build(config, [None, None, None])


# ---- sequences_per_dataset and the header --------------------------------------------------


def counted(make_config, corpus, counts, **fields):
    per_split = dict(blend=None, split=None, blend_per_split=[([corpus], None), None, None])
    return make_config(sequences_per_dataset={corpus: counts}, **per_split, **fields)


@pytest.mark.parametrize("fast", [False, True], ids=["checked", "fast_cache_load"])
def test_right_counts_build_the_same_datasets(make_config, corpus, fast):
    per_split = dict(blend=None, split=None, blend_per_split=[([corpus], None), None, None])
    expected = build(make_config(**per_split), [50, None, None])[0]
    given = build(counted(make_config, corpus, [300, 301], fast_cache_load=fast), [50, None, None])
    for name in TABLES:
        numpy.testing.assert_array_equal(getattr(given[0], name), getattr(expected, name))


@pytest.mark.parametrize("fast", [False, True], ids=["checked", "fast_cache_load"])
@pytest.mark.parametrize("counts", [[299, 301], [300, 300], [301, 302]])
def test_wrong_counts_are_an_assertion_naming_the_corpus(make_config, corpus, counts, fast):
    if fast:  # the fast path needs a cache: build it first with the right counts
        build(counted(make_config, corpus, [300, 301]), [50, None, None])
    config = counted(make_config, corpus, counts, fast_cache_load=fast)
    with pytest.raises(SequenceCountError) as raised:
        build(config, [50, None, None])
    assert isinstance(raised.value, AssertionError)  # what megatron-core's assert raises
    message = str(raised.value)
    assert repr(corpus) in message
    assert f"gives {counts[0]} sequences and {counts[1]} document indices" in message
    assert "header of" in message and "says 300 and 301" in message


def test_a_corpus_missing_from_the_counts_is_a_key_error(make_config, corpus, small):
    per_split = dict(blend=None, split=None, blend_per_split=[([corpus, small], None), None, None])
    config = make_config(sequences_per_dataset={corpus: [300, 301]}, **per_split)
    with pytest.raises(MissingSequenceCountError, match=f"no entry for {small!r}") as raised:
        build(config, [None, None, None])
    assert isinstance(raised.value, KeyError) and isinstance(raised.value, AssertionError)
    assert not str(raised.value).startswith(("'", '"'))  # the message, not KeyError's repr


@pytest.mark.parametrize("entry", [[300], [300, 301, 0], 300, ["300", "301"]])
def test_an_entry_that_is_not_two_counts_is_named(make_config, corpus, entry):
    with pytest.raises(SequenceCountError, match=r"expected \[sequence count, document count\]"):
        build(counted(make_config, corpus, entry), [20, None, None])


@pytest.mark.parametrize("fast", [False, True], ids=["checked", "fast_cache_load"])
def test_the_header_dtype_wins_over_the_vocabulary_with_a_warning(make_config, tmp_path, fast):
    # Megatron's preprocess writes int32 from 65500 ids up; the dataset config assumes
    # uint16 up to 65536: with 65500 ids the two disagree
    corpus = write_corpus(str(tmp_path / "wide"), dtype=numpy.int32, vocab=65500, eod=65500)
    tokenizer = IdentifiedTokenizer(65500, 65500, {"class": "t"})
    per_split = dict(blend=None, split=None, blend_per_split=[([corpus], None), None, None])
    expected = build(make_config(tokenizer=tokenizer, **per_split), [20, None, None])[0]
    config = make_config(
        tokenizer=tokenizer,
        sequences_per_dataset={corpus: [300, 301]},
        fast_cache_load=fast,
        **per_split,
    )
    assert config.token_dtype_code == 8  # uint16, as megatron-core assumes
    with pytest.warns(UserWarning, match=r"implies uint16 .* says int32 \(code 4\): reading by"):
        given = build(config, [20, None, None])[0]
    assert given.dataset.index.dtype == numpy.int32
    for idx in range(len(expected)):
        assert given[idx]["tokens"].tolist() == expected[idx]["tokens"].tolist()


def test_an_agreeing_dtype_gives_no_warning(make_config, corpus):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(counted(make_config, corpus, [300, 301]), [20, None, None])


def test_a_corpus_of_float_tokens_builds_but_serves_no_samples(make_config, tmp_path):
    corpus = megaindex_corpus(tmp_path, [[1.0, 2.0, 3.0]] * 20, dtype=numpy.float32)
    train = build(make_config(blend=([corpus], None), split="1"), [None, None, None])[0]
    assert len(train) == 1  # 60 tokens: one sample of 32 + 1
    for read in (lambda: train[0], lambda: train.__getitems__([0])):
        with pytest.raises(TokenDtypeError, match="holds float32 tokens") as raised:
            read()
        assert isinstance(raised.value, TypeError)  # megatron-core's cast fails so


# ---- a cache trusted and absent ----------------------------------------------------------------


def test_fast_cache_load_without_a_cache_is_a_missing_cache_error(make_config, corpus):
    per_split = dict(blend=None, split=None, blend_per_split=[([corpus], None), None, None])
    with pytest.raises(MissingCacheError, match="build the cache once without") as raised:
        build(make_config(fast_cache_load=True, **per_split), [20, None, None])
    assert isinstance(raised.value, FileNotFoundError)  # what numpy.load raises there
    assert type(raised.value).__module__ == "megaindex.errors"


def test_deferred_mapping_without_a_cache_fails_on_first_use(make_config):
    train = build(make_config(defer_npy_index_mmap=True), [20, None, None])[0]
    assert len(train) > 20  # counted without the tables
    with pytest.raises(MissingCacheError, match="defer_npy_index_mmap maps the index cache"):
        train[0]


# ---- the error classes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error,bases",
    [
        (ConfigError, (ValueError, AssertionError)),
        (IndexBuildError, (ValueError, AssertionError)),
        (EmptySplitError, (IndexBuildError,)),
        (SequenceCountError, (AssertionError,)),
        (MissingSequenceCountError, (SequenceCountError, KeyError)),
        (MissingCacheError, (megaindex.CacheError, FileNotFoundError)),
        (TokenDtypeError, (TypeError,)),
    ],
)
def test_errors_are_what_megatron_core_raises_there(error, bases):
    assert issubclass(error, MegaindexError)
    for base in bases:
        assert issubclass(error, base)


def test_every_public_error_is_documented_and_exported():
    errors = [
        getattr(megaindex, name)
        for name in megaindex.__all__
        if isinstance(getattr(megaindex, name), type)
        and issubclass(getattr(megaindex, name), Exception)
    ]
    assert len(errors) >= 10
    for error in errors:
        assert issubclass(error, MegaindexError), error
        assert error.__doc__ and len(error.__doc__) > 30, error
    assert megaindex.BackendError in errors and megaindex.BarrierTimeoutError in errors


def test_config_errors_are_assertions_too(make_config):
    # megatron-core asserts `split is not None` here
    with pytest.raises(AssertionError, match="split must be given with blend"):
        make_config(split=None)


def test_a_gpt_dataset_over_mock_configuration_is_a_config_error(make_config):
    config = make_config(blend=None, split=None, blend_per_split=[None, None, None])
    assert config.mock  # no corpus named anywhere: megatron-core's mock data
    with pytest.raises(ConfigError, match="build MockGPTDataset"):
        build(config, [10, None, None])
