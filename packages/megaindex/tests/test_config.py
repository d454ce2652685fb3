import dataclasses
import inspect

import pytest

from megaindex import (
    BlendedMegatronDatasetConfig,
    ConfigError,
    GPTDatasetConfig,
    convert_split_vector_to_split_matrix,
    parse_and_normalize_split,
)
from megaindex.tokenizer import IdentifiedTokenizer


@pytest.mark.parametrize(
    "split,expected",
    [
        ("99,1,0", [0.99, 0.01, 0.0]),
        ("969, 30, 1", [0.969, 0.03, 0.001]),
        ("100", [1.0, 0.0, 0.0]),
        ("2,2", [0.5, 0.5, 0.0]),
    ],
)
def test_split_parsing(split, expected):
    assert parse_and_normalize_split(split) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize(
    "split,message",
    [
        ("99,1,0,5", "has 4 weights; at most 3"),
        ("-1,2", "weights must be >= 0, found -1"),
        ("0,0,0", "at least one weight must be positive"),
        ("train", "at least one weight must be positive"),
        ("1.2.3", r"'1.2.3' is not a number"),
    ],
)
def test_bad_splits_name_the_problem(split, message):
    with pytest.raises(ConfigError, match=message):
        parse_and_normalize_split(split)


def test_split_matrix_bookends():
    assert convert_split_vector_to_split_matrix([0.99, 0.01, 0.0]) == [
        (0, 0.99),
        (0.99, 1.0),
        None,
    ]
    assert convert_split_vector_to_split_matrix([0.99, 0.01, 0.0], [0.98, 0.02, 0.0]) == [
        (0, 0.98),
        (0.99, 1.0),
        None,
    ]


def gpt(**overrides):
    fields = dict(
        random_seed=1,
        sequence_length=8,
        tokenizer=IdentifiedTokenizer.null(100),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    fields.update(overrides)
    return GPTDatasetConfig(**fields)


def test_without_a_blend_the_config_is_mock_with_an_even_split():
    config = gpt()
    assert config.mock and config.split == "1,1,1"
    assert config.split_matrix == [(0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1.0)]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(tokenizer=None), "needs a tokenizer"),
        (dict(reset_position_ids=None), "needs reset_position_ids set"),
        (dict(blend=(["a", "b"], [1.0])), "blend has 2 prefixes but 1 weights"),
        (dict(blend=(["a"], None)), "split must be given with blend"),
        (
            dict(blend=(["a"], None), blend_per_split=[(["a"], None), None, None], split="1"),
            "blend and blend_per_split cannot both be given",
        ),
        (dict(blend_per_split=[(["a"], None)]), "must hold 3 blends"),
        (dict(fast_cache_load=True), "fast_cache_load needs path_to_cache"),
        (dict(defer_npy_index_mmap=True), "defer_npy_index_mmap needs path_to_cache"),
        (dict(stale_cache="ignore"), "stale_cache must be one of rebuild, error"),
        (
            dict(sequences_per_dataset={}, tokenizer=IdentifiedTokenizer(1, None, {})),
            "needs the tokenizer's vocab_size",
        ),
    ],
)
def test_invalid_configs_are_errors_not_asserts(overrides, message):
    with pytest.raises(ConfigError, match=message):
        gpt(**overrides)


@pytest.mark.parametrize("vocab,code", [(65536, 8), (65537, 4), (1000, 8)])
def test_token_dtype_code_follows_the_vocabulary(vocab, code):
    tokenizer = IdentifiedTokenizer(0, vocab, {"class": "t"})
    assert gpt(tokenizer=tokenizer).token_dtype_code == code


def test_base_config_needs_no_tokenizer():
    config = BlendedMegatronDatasetConfig(
        random_seed=0, sequence_length=4, blend=(["a"], None), split="1"
    )
    assert config.split_matrix == [(0, 1.0), None, None]


def test_split_equals_the_member_of_the_same_name_of_another_split_enum() -> None:
    import enum

    from megaindex import Split

    class OtherSplit(enum.Enum):  # named differently: not Megatron's
        train, valid, test = 0, 1, 2

    MegatronSplit = enum.Enum("Split", {"train": 0, "valid": 1, "test": 2})
    assert Split.valid == MegatronSplit.valid and MegatronSplit.valid == Split.valid
    assert Split.valid in (MegatronSplit.valid, MegatronSplit.test)
    assert Split.train not in (MegatronSplit.valid, MegatronSplit.test)
    assert {MegatronSplit.test: "test"}[Split.test] == "test"
    assert Split.valid != OtherSplit.valid and Split.valid != 1


@pytest.mark.parametrize("config_class", [BlendedMegatronDatasetConfig, GPTDatasetConfig])
def test_own_fields_are_keyword_only_and_last(config_class):
    fields = [f for f in dataclasses.fields(config_class) if f.init]
    own = [f.name for f in fields if f.kw_only]
    allowed = {"barrier_timeout", "resume_with_new_mix", "stale_cache", "padded_vocab_size"}
    assert set(own) <= allowed | {"check_token_ids"}
    assert "barrier_timeout" in own
    # positional fields first: megatron-core's order is the order of __init__
    names = list(inspect.signature(config_class).parameters)
    assert names[-len(own) :] == own
    assert all(
        inspect.signature(config_class).parameters[n].kind is inspect.Parameter.KEYWORD_ONLY
        for n in own
    )
