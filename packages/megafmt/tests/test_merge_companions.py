"""``mega merge --force`` over an existing corpus: the old corpus's manifest and ``.lossmask``
go with it, so neither is ever read as the new corpus's."""

import os

from megafmt.manifest import legacy_manifest_path, manifest_path
from megafmt.merging import merge
from megafmt.sft.tokenized import get_loss_mask_path


def test_a_forced_merge_removes_the_old_corpus_s_manifest_and_loss_mask(make_corpus):
    first = make_corpus([[[1, 2, 3]]], name="first")
    output = make_corpus([[[4, 5]], [[6]]], name="out")
    companions = [manifest_path(output), legacy_manifest_path(output), get_loss_mask_path(output)]
    for path in companions:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as stream:
            stream.write(b"of the old corpus")
    merge(output, [first], overwrite=True)
    assert [path for path in companions if os.path.exists(path)] == []
    # a merge into a new output leaves other corpora's companions alone
    other = make_corpus([[[7]]], name="other")
    with open(get_loss_mask_path(other), "wb") as stream:
        stream.write(b"\x01")
    merge(output + "_2", [first, other])
    assert os.path.exists(get_loss_mask_path(other))
