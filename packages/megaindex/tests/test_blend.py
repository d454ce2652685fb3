import json
import os

import pytest

from megaindex import (
    BlendedMegatronDatasetBuilder,
    ConfigError,
    GPTDataset,
    get_blend_and_blend_per_split,
    get_blend_from_list,
)
from megaindex.blend import (
    LEGACY_DEFAULT_SPLIT,
    check_prefixes_exist,
    check_tokenizers_agree,
    default_split,
)


@pytest.mark.parametrize(
    "items,expected",
    [
        (["data"], (["data"], None)),
        (["30", "web", "70", "code"], (["web", "code"], [30.0, 70.0])),
        (["web", "code", "math"], (["web", "code", "math"], None)),
        (["web", "code"], (["web", "code"], None)),
        (["0.5", " web ", "0", "code"], (["web", "code"], [0.5, 0.0])),
    ],
)
def test_blend_forms(items, expected):
    assert get_blend_from_list(items) == expected
    assert get_blend_from_list(None) is None


@pytest.mark.parametrize(
    "items,message",
    [
        (
            ["0.5", "web", "code", "math"],
            r"item 3 \('code'\) should be the weight of 'math': "
            r"item 1 \('0.5'\) is a weight",
        ),
        (
            ["-1", "web", "2", "code"],
            "--data-path: the weight of 'web' is -1; weights must be finite numbers >= 0",
        ),
        (["0", "web", "0", "code"], "are all zero"),
        (["1", "web", "code"], "odd number of items .* '1' looks like a weight"),
        ([], "--data-path is empty"),
    ],
)
def test_blend_mistakes_name_the_item(items, message):
    with pytest.raises(ConfigError, match=message):
        get_blend_from_list(items)


def test_data_args_path_holds_the_same_words(tmp_path):
    path = tmp_path / "blend.txt"
    path.write_text("0.3 web\n0.7 code\n")
    assert get_blend_and_blend_per_split(data_args_path=str(path)) == (
        (["web", "code"], [0.3, 0.7]),
        None,
    )
    with pytest.raises(ConfigError, match="cannot read the data arguments file"):
        get_blend_and_blend_per_split(data_args_path=str(tmp_path / "missing.txt"))


def test_per_split_json(tmp_path):
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({"train": "0.5 a 0.5 b", "valid": ["c"], "test": ["d", "e"]}))
    blend, per_split = get_blend_and_blend_per_split(per_split_data_args_path=str(path))
    assert blend is None
    assert per_split == [(["a", "b"], [0.5, 0.5]), (["c"], None), (["d", "e"], None)]
    path.write_text(json.dumps({"train": ["a"]}))
    with pytest.raises(ConfigError, match="has no valid, test entry"):
        get_blend_and_blend_per_split(per_split_data_args_path=str(path))


@pytest.mark.parametrize(
    "content, message",
    [
        (
            "train valid test",
            "expected a JSON object with the keys train, valid and test, found str",
        ),
        ({"train": 5, "valid": None, "test": None}, "the train entry is int 5; expected a string"),
        ({"train": ["a"], "valid": ["b", {"c": 1}], "test": None}, r"valid\[1\] is dict"),
        ({"train": ["a"], "valid": None, "test": [True, "d"]}, r"test\[0\] is bool True"),
    ],
)
def test_a_per_split_json_of_other_shapes_is_refused_naming_the_entry(tmp_path, content, message):
    path = tmp_path / "splits.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=message) as raised:
        get_blend_and_blend_per_split(per_split_data_args_path=str(path))
    assert str(path) in str(raised.value)


def test_a_per_split_json_may_give_weights_as_numbers(tmp_path):
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({"train": [0.3, "a", 0.7, "b"], "valid": None, "test": ["c"]}))
    _, per_split = get_blend_and_blend_per_split(per_split_data_args_path=str(path))
    assert per_split == [(["a", "b"], [0.3, 0.7]), None, (["c"], None)]
    path.write_text(json.dumps({"train": ["a", 5], "valid": None, "test": "a 5"}))
    _, per_split = get_blend_and_blend_per_split(per_split_data_args_path=str(path))
    assert per_split[0] == per_split[2] == (["a", "5"], None)  # as the words: prefixes a and 5


def test_per_split_paths_and_exclusivity():
    assert get_blend_and_blend_per_split(train_data_path=["a"], test_data_path=["b"]) == (
        None,
        [(["a"], None), None, (["b"], None)],
    )
    with pytest.raises(ConfigError, match="not both"):
        get_blend_and_blend_per_split(data_path=["a"], train_data_path=["b"])
    assert get_blend_and_blend_per_split() == (None, None)


def test_legacy_default_split_warns():
    with pytest.warns(UserWarning, match="legacy default '969, 30, 1'.*3% validation"):
        assert default_split(None, (["a"], None)) == LEGACY_DEFAULT_SPLIT
    assert default_split("99,1,0", (["a"], None)) == "99,1,0"


def test_missing_prefixes_are_all_named(corpus, tmp_path):
    check_prefixes_exist([([corpus], None)])
    with pytest.raises(ConfigError, match=r"no .bin/.idx corpus at: .*/gone \(neither .idx nor "
                       r".bin found\), .*/lost \(neither"):  # fmt: skip
        check_prefixes_exist(
            [([corpus, str(tmp_path / "lost")], None), None, ([str(tmp_path / "gone")], None)]
        )


def test_missing_prefixes_name_the_first_few_what_each_lacks_and_the_folders_gone(tmp_path):
    """A mistyped root of thousands named them all (165 KB); a prefix given with .bin, or a
    folder where a file belongs, said only "no .bin/.idx corpus"."""
    (tmp_path / "a.idx").touch()  # its .bin missing
    for suffix in (".idx", ".bin"):
        (tmp_path / f"c{suffix}").touch()  # passed as c.bin
    (tmp_path / "e.idx").touch()
    (tmp_path / "e.bin").mkdir()
    slips = [str(tmp_path / name) for name in ("a", "c.bin", "e")]
    mistyped = [f"/mistyped/root/c{n:05d}" for n in range(3000)]
    with pytest.raises(ConfigError) as raised:
        check_prefixes_exist([([*mistyped, *slips], None)])
    message = str(raised.value)
    assert message.startswith(
        f"no .bin/.idx corpus at: {tmp_path}/a (token file not found), {tmp_path}/c.bin "
        "(neither .idx nor .bin found; a corpus is named by its prefix without .bin: did you "
        f"mean '{tmp_path}/c'?), {tmp_path}/e (found a directory where the token file belongs), "
        "/mistyped/root/c00000 (neither .idx nor .bin found), /mistyped/root/c00001 (neither"
    )
    assert (
        ", and 2,998 more (3,003 of the blend's 3,003); no such folder: /mistyped/root" in message
    )
    assert len(message) < 1000


def test_blends_of_differently_tokenized_corpora_are_warned_about(tmp_path):
    from megafmt import write_manifest

    def tokenized(name, fingerprint, eod):
        write_manifest(
            str(tmp_path / name), {"tokenizer": {"fingerprint": fingerprint, "eod": eod}}
        )
        return str(tmp_path / name)

    web, code = tokenized("web", "sha256:aa", 0), tokenized("code", "sha256:aa", 0)
    untracked = str(tmp_path / "megatron_made")  # no manifest: not judged
    assert check_tokenizers_agree([([web, code, untracked], None), None]) == []
    other_eod = tokenized("math", "sha256:aa", 2)
    with pytest.warns(UserWarning, match=r"tokenized differently .*eod 2: .*math"):
        check_tokenizers_agree([([web, code], [1.0, 1.0]), ([other_eod], None)])
    other_tokenizer = tokenized("books", "sha256:bb", 0)
    with pytest.warns(UserWarning, match=r"fingerprint sha256:bb eod 0: .*books"):
        check_tokenizers_agree([([web, other_tokenizer], None)])


@pytest.mark.parametrize("warned", [True, False])
@pytest.mark.parametrize(
    ("form", "needed"),
    [
        # 3 corpora opened (2 mappings each), 3 datasets over them (3), 1 blend (2)
        ("one split", 1_017),
        ("three splits, two asked for no samples", 1_017),
        ("one split, and a blend per split of none", 1_017),
        # each split opens its corpora: 9 opened, 9 datasets, 3 blends
        ("a blend per split", 1_051),
    ],
)
def test_a_blend_that_would_pass_the_mapping_limit_is_warned_of_at_build(
    make_config, tmp_path, monkeypatch, form, needed, warned
):
    """The mappings a build needs once read, beside the 1,000 held: counted for the corpora it
    opens and the datasets and blends it reads, not for splits without data (a blend of every
    split counted for all three would need 1,051)."""
    import warnings

    from megafmt.testing import write_corpus
    from megaindex import blend as blend_module

    prefixes = [write_corpus(str(tmp_path / f"c{i}"), seed=i) for i in range(3)]
    monkeypatch.setattr(blend_module, "mappings_in_use", lambda: 1_000)
    monkeypatch.setattr(blend_module, "mapping_limit", lambda: needed - 1 if warned else needed)
    if form == "one split":
        config, sizes = make_config(blend=(prefixes, None), split="100,0,0"), [None] * 3
    elif form == "one split, and a blend per split of none":  # the blend builds, as Megatron's
        config = make_config(blend=(prefixes, None), blend_per_split=[None] * 3, split="100,0,0")
        sizes = [None] * 3
    elif form == "a blend per split":
        per_split = [(prefixes, None)] * 3
        config, sizes = make_config(blend=None, blend_per_split=per_split, split=None), [None] * 3
    else:
        config, sizes = make_config(blend=(prefixes, None), split="90,8,2"), [None, 0, 0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    said = [str(w.message) for w in caught if "vm.max_map_count" in str(w.message)]
    assert bool(said) == warned
    if warned:
        corpora = 9 if form == "a blend per split" else 3
        assert said[0].startswith(f"the datasets of {corpora} corpora may need {needed:,} ")
        suggested = {1_017: 2048, 1_051: 4096}[needed]  # the power of two from twice it up
        assert said[0].endswith(f"sysctl -w vm.max_map_count={suggested}")


@pytest.mark.parametrize("weight", ["1", None, True, float("nan")])
@pytest.mark.parametrize("other", [1.0, 0.0, -1.0])
def test_a_blend_weight_that_is_not_a_number_is_refused_naming_it(weight, other):
    from megaindex.builder import check_blend_weights

    with pytest.raises(ConfigError, match=r"blend: the weight of 'web' is .*; weights must be"):
        check_blend_weights("blend", ["web", "code"], [weight, other])


def test_a_blend_weight_of_zero_is_refused_before_any_corpus_is_opened(make_config, corpus):
    """megatron-core refuses it in BlendedDataset, once every corpus was built (all 2,500
    cache files of a probe's blend written first, then an 11 KB list of weights naming none)."""
    config = make_config(blend=([corpus, corpus], [1.0, 0.0]), split="100,0,0")
    with pytest.raises(ConfigError, match=rf"blend: the weight of '{corpus}' is 0; a blend draws"):
        BlendedMegatronDatasetBuilder(GPTDataset, [20, 0, 0], lambda: True, config).build()
    assert not os.path.exists(config.path_to_cache)  # nothing built
