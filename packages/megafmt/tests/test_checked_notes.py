"""The per-machine notes of checked files and the lock beside them: one note per machine in a
shared cache folder, a bounded wait for a lock, and no stray context on errors."""

from __future__ import annotations

import logging
import os
import platform
import threading
import time

import pytest

from megafmt import checked


@pytest.fixture
def notes(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "notes"))
    target = tmp_path / "corpus.idx"
    target.write_bytes(b"x")
    return str(target)


def test_machines_sharing_a_cache_folder_keep_notes_of_their_own(notes, monkeypatch):
    identity = checked.corpus_identity(notes, 1)
    taken = time.time_ns() + 10**10  # as if taken well after the file last changed
    monkeypatch.setattr(checked.platform, "node", lambda: "node-a")
    checked.remember_checked(notes, identity, identity[2], taken)
    assert checked.was_checked(notes, identity)
    monkeypatch.setattr(checked.platform, "node", lambda: "node-b")
    assert not checked.was_checked(notes, identity)  # node-a's note is not node-b's


def test_a_file_changed_within_a_second_of_its_identity_is_not_noted(notes):
    identity = checked.corpus_identity(notes, 1)
    checked.remember_checked(notes, identity, identity[2], identity[2] + 10**8)  # 0.1 s later
    assert not checked.was_checked(notes, identity)


def test_a_lock_held_too_long_is_given_up_with_a_warning(notes, monkeypatch, caplog):
    monkeypatch.setattr(checked, "LOCK_WAIT_SECONDS", 0.3)
    entered = []
    with checked.one_checker(notes):  # a process that never lets go (a dead node's lock)
        waiter = threading.Thread(target=lambda: entered.append(_enter(notes)))
        with caplog.at_level(logging.WARNING, logger="megafmt.checked"):
            waiter.start()
            waiter.join(timeout=10)
    assert entered == [True]
    assert "checking without it" in caplog.text


def _enter(path: str) -> bool:
    with checked.one_checker(path):
        return True


def test_an_error_while_checking_without_a_lock_carries_no_lock_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MEGA_CACHE_DIR", str(blocker / "notes"))  # no folder can be made here
    with pytest.raises(ValueError) as caught, checked.one_checker(str(tmp_path / "c.idx")):
        raise ValueError("the check failed")
    assert caught.value.__context__ is None


def test_the_notes_of_many_files_share_at_most_256_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "notes"))
    taken = time.time_ns() + 10**10
    for number in range(600):
        path = tmp_path / f"c{number}.idx"
        path.write_bytes(b"x")
        identity = checked.corpus_identity(str(path), 1)
        with checked.one_checker(str(path)):
            checked.remember_checked(str(path), identity, identity[2], taken)
        assert checked.was_checked(str(path), identity)
    names = os.listdir(tmp_path / "notes" / checked.CORPORA)
    assert len([name for name in names if name.endswith(".json")]) == 600
    locks = [name for name in names if name.endswith(".lock")]
    assert 200 < len(locks) <= 256  # 600 names of random digests leave few of 256 unused


def test_files_sharing_a_lock_are_checked_in_turns_and_a_waiter_names_the_holder(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "notes"))
    monkeypatch.setattr(checked, "LOCK_MESSAGE_SECONDS", 0.1)
    paths = {}
    for number in range(2000):  # two files whose notes share a lock
        path = str(tmp_path / f"c{number}.idx")
        lock = checked._lock_path(checked._note_path(path, checked.CORPORA))
        if lock in paths:
            first, second = paths[lock], path
            break
        paths[lock] = path
    inside = []
    with (
        caplog.at_level(logging.WARNING, logger="megafmt.checked"),
        checked.one_checker(first),
    ):
        waiter = threading.Thread(target=lambda: inside.append(_enter(second)))
        waiter.start()
        waiter.join(timeout=0.5)
        assert inside == []  # waits for the holder of the shared lock
    waiter.join(timeout=30)
    assert inside == [True]
    holder = f"process {os.getpid()} on {platform.node()} checking {first}"
    assert f"{second}: waiting for {lock}, held by {holder}" in caplog.text


def test_machines_sharing_a_notes_folder_take_locks_of_their_own(notes, monkeypatch):
    note = checked._note_path(notes, checked.CORPORA)
    monkeypatch.setattr(checked.platform, "node", lambda: "node-a")
    lock_a = checked._lock_path(note)
    monkeypatch.setattr(checked.platform, "node", lambda: "node-b")
    assert checked._lock_path(note) != lock_a
    assert os.path.dirname(checked._lock_path(note)) == os.path.dirname(lock_a)


def test_a_long_check_takes_a_lock_of_its_own(notes):
    note = checked._note_path(notes, checked.CORPORA)
    assert checked._lock_path(note, of_its_own=True) == note + ".lock" != checked._lock_path(note)


def test_a_lock_that_cannot_be_opened_or_taken_is_reported_once_per_folder(
    notes, monkeypatch, caplog
):
    monkeypatch.setattr(checked, "_reported_lock_folders", set())
    lock = checked._lock_path(checked._note_path(notes, checked.CORPORA))
    os.makedirs(lock)  # something that cannot be opened as the lock file
    with caplog.at_level(logging.WARNING, logger="megafmt.checked"):
        for _ in range(3):
            with checked.one_checker(notes):
                pass
    assert caplog.text.count("checks run without this machine's locks") == 1
    assert f"{lock}: cannot be opened (Is a directory)" in caplog.text
    os.rmdir(lock)
    caplog.clear()
    monkeypatch.setattr(checked, "_reported_lock_folders", set())

    def refuse(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(checked.fcntl, "flock", refuse)
    with caplog.at_level(logging.WARNING, logger="megafmt.checked"):
        for _ in range(2):
            with checked.one_checker(notes):
                pass
    assert caplog.text.count(f"{lock}: cannot be locked (Function not implemented)") == 1


def test_a_reported_lock_does_not_hide_a_notes_folder_that_is_not_one(
    notes, monkeypatch, caplog, tmp_path
):
    monkeypatch.setattr(checked, "_reported_folders", set())
    monkeypatch.setattr(checked, "_reported_lock_folders", set())
    lock = checked._lock_path(checked._note_path(notes, checked.CORPORA))
    os.makedirs(lock)
    with caplog.at_level(logging.WARNING, logger="megafmt.checked"):
        with checked.one_checker(notes):
            pass
        assert "checks run without this machine's locks" in caplog.text
        folder = os.path.dirname(lock)
        os.rename(folder, str(tmp_path / "elsewhere"))
        os.symlink(str(tmp_path / "elsewhere"), folder)  # the notes' folder became a link
        with checked.one_checker(notes):
            pass
    assert f"{folder}: the notes' folder is a symbolic link" in caplog.text
