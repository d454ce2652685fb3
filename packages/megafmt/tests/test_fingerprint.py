import os
import struct

import pytest

from megafmt import get_bin_path, get_idx_path
from megafmt.fingerprint import corpus_fingerprint, fingerprint_changes


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
    assert [line.split(":")[0] for line in changes] == ["bin_bytes", "bin_hash", "idx_crc32"]


def test_a_change_deep_inside_the_index_is_noticed(make_corpus):
    prefix = make_corpus([[[i]] for i in range(20000)])
    before = corpus_fingerprint(prefix)
    size = os.path.getsize(get_idx_path(prefix))
    with open(get_idx_path(prefix), "r+b") as stream:  # every byte of the index counts
        stream.seek(size - 8)
        stream.write(struct.pack("<q", 19999))
    after = corpus_fingerprint(prefix)
    assert fingerprint_changes(before, after) == [
        f"idx_crc32: {before['idx_crc32']!r} -> {after['idx_crc32']!r}"
    ]


def test_corpus_stat_changes_when_a_file_is_rewritten(make_corpus):
    from megafmt.fingerprint import corpus_stat

    prefix = make_corpus([[[1, 2]]])
    before = corpus_stat(prefix)
    assert before["idx"][0] == os.path.getsize(get_idx_path(prefix))
    assert before == corpus_stat(prefix)
    make_corpus([[[1, 2]]])  # the same bytes, written anew
    after = corpus_stat(prefix)
    assert after["bin"][0] == before["bin"][0] and after != before


def test_an_idx_written_in_place_keeps_its_size_and_inode_and_changes_its_modified_time(
    make_corpus,
):
    from megafmt.fingerprint import corpus_stat, idx_modified_ns, sizes_and_inodes

    prefix = make_corpus([[[1, 2]]])
    idx = get_idx_path(prefix)
    before = corpus_stat(prefix)
    assert idx_modified_ns(before) == os.stat(idx).st_mtime_ns
    with open(idx, "r+b") as stream:  # the same bytes, in place
        data = stream.read()
        stream.seek(0)
        stream.write(data)
    status = os.stat(idx)
    os.utime(idx, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))  # a coarse clock's tick
    after = corpus_stat(prefix)
    assert sizes_and_inodes(after) == sizes_and_inodes(before)
    assert idx_modified_ns(after) == os.stat(idx).st_mtime_ns > idx_modified_ns(before)


def test_two_lengths_changed_with_the_same_sizes_are_noticed(make_corpus):
    """Sampled blocks miss a change between them; the whole index is checksummed."""
    prefix = make_corpus([[[i % 7] * (1 + i % 3)] for i in range(200_000)])
    before = corpus_fingerprint(prefix)
    with open(get_idx_path(prefix), "r+b") as stream:  # lengths 1 and 2 of sequences 100000-1
        stream.seek(34 + 4 * 99_999)
        stream.write(struct.pack("<ii", 2, 1))
    changes = fingerprint_changes(before, corpus_fingerprint(prefix))
    assert [line.split(":")[0] for line in changes] == ["idx_crc32"]


def test_file_checksum_is_the_crc32_of_the_whole_file(tmp_path):
    import zlib

    from megafmt.fingerprint import READ_BYTES, file_checksum

    path = tmp_path / "f"
    data = os.urandom(READ_BYTES + 12345)
    path.write_bytes(data)
    assert file_checksum(str(path), "file") == (len(data), f"{zlib.crc32(data):08x}")


@pytest.mark.parametrize("size", [0, 1, 8, 4095, 4096, 4097, 65535, 65551, 65552, 65553, 300001])
def test_the_sampled_hash_of_a_token_file_is_the_one_caches_recorded(tmp_path, size):
    # recorded in the sidecars of caches built before: a file of any size hashes as it did,
    # the header, one block every size/16 bytes (at least a block apart), and the last block
    import hashlib

    from megafmt.fingerprint import BLOCK_BYTES, SAMPLED_BLOCKS, file_version
    from megafmt.format import HEADER_SIZE

    data = os.urandom(size)
    path = tmp_path / "c.bin"
    path.write_bytes(data)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(data[:HEADER_SIZE])
    step = max(size // SAMPLED_BLOCKS, BLOCK_BYTES)
    for offset in range(0, size, step):
        digest.update(data[offset : offset + BLOCK_BYTES])
    digest.update(data[max(size - BLOCK_BYTES, 0) :][:BLOCK_BYTES])
    assert file_version(str(path), "token file") == (size, digest.hexdigest())


def counted_checksums(monkeypatch) -> list:
    """A fresh memory of fingerprints, and the list of the whole-file checksums taken."""
    from megafmt import fingerprint

    monkeypatch.setattr(fingerprint, "_fingerprints", {})
    reads = []
    real = fingerprint.file_checksum
    monkeypatch.setattr(
        fingerprint, "file_checksum", lambda *args: reads.append(args) or real(*args)
    )
    return reads


def test_a_settled_corpus_is_fingerprinted_once_until_it_changes(make_corpus, monkeypatch):
    from megafmt import fingerprint

    monkeypatch.setattr(fingerprint, "SETTLED_SECONDS", 0.0)
    reads = counted_checksums(monkeypatch)
    prefix = make_corpus([[[i, i + 1]] for i in range(100)])
    first = corpus_fingerprint(prefix)
    assert corpus_fingerprint(prefix) == first and len(reads) == 1
    with open(get_idx_path(prefix), "r+b") as stream:  # rewritten in place: a new change time
        stream.seek(40)
        stream.write(b"\x07")
    changed = corpus_fingerprint(prefix)
    assert len(reads) == 2 and changed["idx_crc32"] != first["idx_crc32"]


def test_a_corpus_changed_in_the_last_second_is_fingerprinted_again(make_corpus, monkeypatch):
    reads = counted_checksums(monkeypatch)
    prefix = make_corpus([[[i, i + 1]] for i in range(100)])
    corpus_fingerprint(prefix)
    corpus_fingerprint(prefix)
    assert len(reads) == 2
