import os
import struct

from megafmt import get_bin_path, get_idx_path
from megafmt.shared import corpus_fingerprint, fingerprint_changes


def test_same_files_same_fingerprint(make_corpus, tmp_path):
    documents = [[[i, i + 1]] for i in range(5000)]
    first = make_corpus(documents, name="a")
    second = make_corpus(documents, name="b")
    assert corpus_fingerprint(first) == corpus_fingerprint(second)
    assert corpus_fingerprint(first)["idx_bytes"] == os.path.getsize(get_idx_path(first))
    assert corpus_fingerprint(first)["bin_bytes"] == os.path.getsize(get_bin_path(first))


def test_retokenizing_into_the_same_prefix_changes_it(make_corpus):
    prefix = make_corpus([[[i, i + 1]] for i in range(5000)])
    before = corpus_fingerprint(prefix)
    make_corpus([[[i, i + 2]] for i in range(5000)])  # same lengths, other tokens
    assert [
        line.split(":")[0] for line in fingerprint_changes(before, corpus_fingerprint(prefix))
    ] == ["bin_hash"]
    make_corpus([[[i, i + 1, 7]] for i in range(5000)])  # longer sequences: same index size
    changes = fingerprint_changes(before, corpus_fingerprint(prefix))
    assert [line.split(":")[0] for line in changes] == ["bin_bytes", "bin_hash", "idx_hash"]


def test_a_change_deep_inside_the_index_is_noticed(make_corpus):
    prefix = make_corpus([[[i]] for i in range(20000)])
    before = corpus_fingerprint(prefix)
    size = os.path.getsize(get_idx_path(prefix))
    with open(get_idx_path(prefix), "r+b") as stream:  # the last block is always sampled
        stream.seek(size - 8)
        stream.write(struct.pack("<q", 19999))
    after = corpus_fingerprint(prefix)
    assert fingerprint_changes(before, after) == [
        f"idx_hash: {before['idx_hash']!r} -> {after['idx_hash']!r}"
    ]


def test_corpus_stat_changes_when_a_file_is_rewritten(make_corpus):
    from megafmt.shared import corpus_stat

    prefix = make_corpus([[[1, 2]]])
    before = corpus_stat(prefix)
    assert before["idx"][0] == os.path.getsize(get_idx_path(prefix))
    assert before == corpus_stat(prefix)
    make_corpus([[[1, 2]]])  # the same bytes, written anew
    after = corpus_stat(prefix)
    assert after["bin"][0] == before["bin"][0] and after != before
