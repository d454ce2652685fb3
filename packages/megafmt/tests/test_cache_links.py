"""Notes, locks and local copies under the cache folder never follow a symbolic link planted at
their names, and a cache folder that is a link to nothing (or a file) is named with what it is.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import fsspec
import pytest

from megafmt import checked
from megafmt.errors import NotAFolderError
from megafmt.folders import make_folder
from megafmt.remote import cached_index, local_copy_path


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(checked, "_reported_folders", set())
    target = tmp_path / "corpus.idx"
    target.write_bytes(b"x")
    return str(target)


def test_a_link_planted_at_a_lock_name_is_not_followed(corpus, tmp_path, caplog):
    lock_path = checked._lock_path(checked._note_path(corpus, checked.CORPORA))
    os.makedirs(os.path.dirname(lock_path))
    outside = tmp_path / "outside" / "owned"
    outside.parent.mkdir()
    os.symlink(outside, lock_path)
    with caplog.at_level(logging.WARNING, logger="megafmt.checked"), checked.one_checker(corpus):
        pass
    assert not outside.exists()
    assert "symbolic link stands at the lock's name" in caplog.text and lock_path in caplog.text


def test_a_link_planted_at_a_note_name_is_not_read(corpus, tmp_path):
    identity = checked.corpus_identity(corpus, 1)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({"path": os.path.abspath(corpus), "identity": identity}))
    note_path = checked._note_path(corpus, checked.CORPORA)
    os.makedirs(os.path.dirname(note_path))
    os.symlink(forged, note_path)
    assert not checked.was_checked(corpus, identity)
    checked.remember_checked(corpus, identity, identity[2], time.time_ns() + 10**10)
    assert not os.path.islink(note_path) and checked.was_checked(corpus, identity)
    assert json.loads(forged.read_text())["identity"] == identity  # the link's target untouched


def test_a_notes_folder_that_is_a_link_gets_no_notes(corpus, tmp_path, caplog):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    os.symlink(elsewhere, tmp_path / "cache" / checked.CORPORA)
    identity = checked.corpus_identity(corpus, 1)
    with caplog.at_level(logging.WARNING, logger="megafmt.checked"):
        checked.remember_checked(corpus, identity, identity[2], time.time_ns() + 10**10)
        with checked.one_checker(corpus):
            pass
    assert list(elsewhere.iterdir()) == []
    assert caplog.text.count("the notes' folder is a symbolic link") == 1  # reported once


def test_a_dangling_cache_folder_link_is_named_in_the_warning(corpus, tmp_path, caplog):
    os.symlink(tmp_path / "gone", tmp_path / "cache")
    identity = checked.corpus_identity(corpus, 1)
    with caplog.at_level(logging.WARNING, logger="megafmt.checked"):
        checked.remember_checked(corpus, identity, identity[2], time.time_ns() + 10**10)
    assert "a symbolic link to" in caplog.text and "which does not exist" in caplog.text
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize("kind", ["dangling link", "file", "dangling parent"])
def test_make_folder_says_what_is_in_the_way(tmp_path, kind):
    if kind == "file":
        (tmp_path / "cache").write_text("")
        path, blocker = tmp_path / "cache", "found a file"
    else:
        os.symlink(tmp_path / "gone", tmp_path / "cache")
        path = tmp_path / "cache" / ("idx" if kind == "dangling parent" else "")
        blocker = f"a symbolic link to {str(tmp_path / 'gone')!r}, which does not exist"
    with pytest.raises(NotAFolderError) as caught:
        make_folder(str(path), "the cache folder")
    assert blocker in str(caught.value) and "the cache folder must be a folder" in str(caught.value)
    assert str(tmp_path / "cache") in str(caught.value)


def test_the_idx_cache_folder_as_a_dangling_link_is_named(tmp_path):
    with fsspec.open("memory://links-a/c.idx", "wb") as stream:
        stream.write(b"idx bytes")
    os.symlink(tmp_path / "gone", tmp_path / "cache")
    with pytest.raises(NotAFolderError, match="symbolic link to .*which does not exist"):
        cached_index("memory://links-a/c.idx", str(tmp_path / "cache"))


def test_a_link_at_a_local_copys_name_is_replaced_not_followed(tmp_path):
    with fsspec.open("memory://links-b/c.idx", "wb") as stream:
        stream.write(b"idx bytes")
    local = cached_index("memory://links-b/c.idx", str(tmp_path / "cache"))
    decoy = tmp_path / "decoy.idx"
    decoy.write_bytes(b"not the index")  # the same size as the object
    os.remove(local)
    os.symlink(decoy, local)
    assert cached_index("memory://links-b/c.idx", str(tmp_path / "cache")) == local
    assert not os.path.islink(local) and Path(local).read_bytes() == b"idx bytes"
    assert decoy.read_bytes() == b"not the index"


def test_a_re_signed_url_names_the_same_local_copy(tmp_path):
    signed = "https://host/c.idx?X-Amz-Signature=AAA&X-Amz-Credential=KEY"
    resigned = "https://host/c.idx?X-Amz-Signature=BBB&X-Amz-Credential=KEY"
    first = local_copy_path(str(tmp_path), signed)
    assert first == local_copy_path(str(tmp_path), resigned)
    assert first != local_copy_path(str(tmp_path), "https://host/other/c.idx")
    assert "AAA" not in first and "KEY" not in first
