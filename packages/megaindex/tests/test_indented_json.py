"""``indented_json`` against ``json.dumps(indent=4)``: the text of every value, or the error."""

import enum
import json
import math
from collections import OrderedDict

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaindex.indented_json import DEEPEST, indented_json
from megaindex.megatron_dataset import describe


class Described:
    """An object the encoder hands to ``default`` (as a dataset's tokenizer or a sub-dataset)."""

    def __init__(self, identifiers):
        self.unique_identifiers = identifiers


class Level(enum.IntEnum):
    LOW = 1


class Name(str):
    pass


def by_identifiers(obj):
    return obj.unique_identifiers


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(allow_nan=True, allow_infinity=True).map(numpy.float64)
    | st.text()
    | st.just(Level.LOW)
    | st.text().map(Name)
)
other_keys = st.integers() | st.floats(allow_nan=False) | st.booleans() | st.none()
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=6), inner, max_size=4)
        | st.dictionaries(st.text(max_size=6), inner, max_size=4).map(OrderedDict)
        | st.dictionaries(other_keys, inner, max_size=3)
        | inner.map(Described)
    ),
    max_leaves=24,
)


def outcome(encode, value):
    try:
        return "text", encode(value)
    except Exception as error:  # the same kind of error, with the same words, is the same
        return type(error), str(error)


@settings(max_examples=1500, deadline=None)
@given(values)
@pytest.mark.filterwarnings("error")  # json warns of nothing (NaN - NaN would, in numpy)
def test_the_text_is_json_s_for_every_value(value):
    expected = outcome(lambda v: json.dumps(v, indent=4, default=by_identifiers), value)
    assert outcome(lambda v: indented_json(v, by_identifiers), value) == expected


def test_a_dataset_s_description_is_json_s():
    tokenizer = Described(OrderedDict([("class", "NullTokenizer")]))
    identifiers = OrderedDict(
        [
            ("class", "GPTDataset"),
            ("dataset_path", "/data/c\u00e9/x"),
            ("num_samples", 31),
            ("index_split", "train"),
            ("random_seed", 1234),
            ("split_matrix", [(0, 1.0), None, None]),
            ("tokenizer", tokenizer),
            ("ratio", 1e-7),
            ("nothing", {}),
            ("none", []),
        ]
    )
    blend = OrderedDict([("class", "BlendedDataset"), ("datasets", [identifiers] * 3)])
    for value in (identifiers, blend):
        text = json.dumps(value, indent=4, default=by_identifiers)
        assert describe(value)[0] == text == indented_json(value, by_identifiers)


@pytest.mark.parametrize(
    "value",
    [math.nan, -math.inf, [math.inf], {"a": math.nan}, {1: [2]}, {True: None, "x": 1.5}],
)
def test_values_left_to_the_json_module_come_back_indented(value):
    assert indented_json([value], by_identifiers) == json.dumps(
        [value], indent=4, default=by_identifiers
    )


def test_a_circular_value_is_json_s_error():
    loop = []
    loop.append(loop)
    selfish = Described(None)
    selfish.unique_identifiers = selfish
    for value in (loop, {"a": loop}, selfish):
        with pytest.raises(ValueError, match="Circular reference detected"):
            json.dumps(value, indent=4, default=by_identifiers)
        with pytest.raises(ValueError, match="Circular reference detected"):
            indented_json(value, by_identifiers)


def test_values_deeper_than_the_walk_are_json_s():
    deep = 0
    for _ in range(DEEPEST + 5):
        deep = {"k": [deep, 1.5]}
    assert indented_json(deep, by_identifiers) == json.dumps(deep, indent=4)


def test_a_dict_json_encodes_itself_has_its_values_handed_to_default_once():
    # a dict with a key json turns into text is json's to encode: nothing of it is encoded
    # (nor handed to ``default``) here first
    calls = []

    def counting(obj):
        calls.append(obj)
        return len(calls)

    value = {"a": Described(None), "b": [Described(None)], 1: "x"}
    expected = json.dumps(value, indent=4, default=counting)
    calls.clear()
    assert indented_json(value, counting) == expected
    assert len(calls) == 2


class Odd(float):
    """A float that says it differs from everything, itself included (json calls it NaN)."""

    def __ne__(self, other):
        return True


def test_a_float_is_told_apart_from_nan_and_infinity_as_json_tells_it():
    for value in ([Odd(1.0)], {"x": Odd(2.5)}):
        assert indented_json(value, by_identifiers) == json.dumps(
            value, indent=4, default=by_identifiers
        )
