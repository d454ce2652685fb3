"""Cache files written atomically by native threads (megaindex.file_writes)."""

import contextlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy
import pytest

from megafmt.fingerprint import corpus_fingerprint, file_identity
from megafmt.testing import write_corpus
from megaindex import _ext, file_writes
from megaindex.file_writes import (
    CorpusFiles,
    FileWrite,
    background_writes,
    held_bytes,
    write_files,
)


class Failed(Exception):
    pass


#: a step's corpus field when it fingerprints none
NONE = (b"", b"", 0, 1, 1, [])


def entry_files(folder, name="entry"):
    """Two tables, a sidecar recording their identities, and a description, as a cache saves."""
    return [
        FileWrite(str(folder / f"{name}-a.npy"), b"table a"),
        FileWrite(str(folder / f"{name}-b.npy"), b"table b" * 100),
        FileWrite(
            str(folder / f"{name}-megaindex.json"),
            b'{"format": 1, "table_files": ',
            (('"a"', 0), ('"b"', 1)),
            "}",
        ),
        FileWrite(str(folder / f"{name}-description.txt"), "{\n    \u00e9\n}".encode()),
    ]


def check_entry(folder, name="entry"):
    sidecar = json.loads((folder / f"{name}-megaindex.json").read_text())
    assert sidecar == {
        "format": 1,
        "table_files": {
            "a": file_identity(str(folder / f"{name}-a.npy")),
            "b": file_identity(str(folder / f"{name}-b.npy")),
        },
    }
    assert (folder / f"{name}-b.npy").read_bytes() == b"table b" * 100
    assert (folder / f"{name}-description.txt").read_text() == "{\n    \u00e9\n}"


def test_outside_a_build_the_files_are_written_at_once(tmp_path):
    done = []
    written = write_files(entry_files(tmp_path), lambda: done.append(1), Failed)
    assert done == [1]
    check_entry(tmp_path)
    identities = written.identities()
    assert identities == [file_identity(f.path) for f in entry_files(tmp_path)]
    assert sorted(os.listdir(tmp_path)) == sorted(
        os.path.basename(f.path) for f in entry_files(tmp_path)
    )  # no temporary file left


def test_the_files_get_the_permissions_the_umask_allows(tmp_path):
    old = os.umask(0o027)
    try:
        write_files([FileWrite(str(tmp_path / "t.npy"), b"x")], lambda: None, Failed)
    finally:
        os.umask(old)
    assert (tmp_path / "t.npy").stat().st_mode & 0o777 == 0o640


def test_a_failure_stops_the_write_and_names_the_file(tmp_path):
    files = entry_files(tmp_path)
    files[1] = FileWrite(str(tmp_path / "missing" / "b.npy"), b"b")
    done = []
    with pytest.raises(Failed) as caught:
        write_files(files, lambda: done.append(1), Failed)
    error = caught.value.args[0]
    assert isinstance(error, FileNotFoundError) and error.filename == files[1].path
    assert done == [1]
    assert os.listdir(tmp_path) == ["entry-a.npy"]  # nothing after the failed file


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path):
    target = tmp_path / "target"
    os.symlink(target, tmp_path / "t.partial")
    identities, error, path, checksums = _ext.write_files(
        [
            (
                os.fsencode(tmp_path / "t.npy"),
                os.fsencode(tmp_path / "t.partial"),
                b"data",
                NONE,
                "",
                [],
                "",
            )
        ]
    )
    assert (identities, error, path, checksums) == ([], 17, os.fsencode(tmp_path / "t.npy"), "")
    assert not target.exists() and not (tmp_path / "t.npy").exists()


def test_an_identity_asked_before_its_file_is_refused(tmp_path):
    with pytest.raises(IndexError, match="the identity of file 1 is asked before it is written"):
        _ext.write_files([(b"/tmp/a", b"/tmp/a.p", b"", NONE, "", [('"x"', 1)], "")])


def test_in_a_build_the_files_are_in_place_when_the_build_ends(tmp_path):
    done = []
    with background_writes():
        for n in range(50):
            write_files(entry_files(tmp_path, f"e{n}"), lambda: done.append(1), Failed)
        assert file_writes.current() is not None
    assert file_writes.current() is None
    assert len(done) == 50
    for n in range(50):
        check_entry(tmp_path, f"e{n}")


def test_the_builders_threads_write_in_its_background(tmp_path):
    with (
        background_writes() as writes,
        ThreadPoolExecutor(2, initializer=file_writes.adopt, initargs=(writes,)) as pool,
    ):
        backgrounds = list(pool.map(lambda _: file_writes.current() is writes, range(4)))
        list(
            pool.map(
                lambda n: write_files(entry_files(tmp_path, f"e{n}"), lambda: None, Failed),
                range(20),
            )
        )
    assert backgrounds == [True] * 4
    for n in range(20):
        check_entry(tmp_path, f"e{n}")


def test_a_failure_in_the_background_is_raised_when_the_build_ends(tmp_path):
    files = entry_files(tmp_path)
    files[2] = FileWrite(str(tmp_path / "missing" / "s.json"), b"{}")
    with pytest.raises(Failed) as caught, background_writes():
        write_files(files, lambda: None, Failed)
        write_files(entry_files(tmp_path, "other"), lambda: None, Failed)
    assert caught.value.args[0].filename == files[2].path
    check_entry(tmp_path, "other")  # the others were written


def test_the_builds_own_error_wins_and_its_writes_still_finish(tmp_path):
    class BuildError(Exception):
        pass

    files = entry_files(tmp_path)
    files[0] = FileWrite(str(tmp_path / "missing" / "a.npy"), b"")
    with pytest.raises(BuildError), background_writes():
        write_files(files, lambda: None, Failed)
        write_files(entry_files(tmp_path, "other"), lambda: None, Failed)
        raise BuildError
    check_entry(tmp_path, "other")


def test_an_interrupted_wait_for_the_writes_still_ends_each_of_them(tmp_path, monkeypatch):
    """Ctrl-C while the build waits for its writes: every write's ``on_done`` still runs (a
    cache's save count would otherwise stay up, and its folder never be cleared again)."""
    identities = file_writes.Written.identities

    def interrupted(self):
        identities(self)
        raise KeyboardInterrupt

    ended = []
    with pytest.raises(KeyboardInterrupt), background_writes():
        for name in ("one", "two", "three"):
            write_files(entry_files(tmp_path, name), lambda n=name: ended.append(n), Failed)
        monkeypatch.setattr(file_writes.Written, "identities", interrupted)
    assert ended == ["one", "two", "three"]


def test_identities_wait_for_a_write_in_the_background(tmp_path):
    with background_writes() as writes:
        written = write_files(entry_files(tmp_path), lambda: None, Failed)
        writes.wait_for(str(tmp_path / "entry-description.txt"))
        assert (tmp_path / "entry-description.txt").exists()
        assert written.identities()[0] == file_identity(str(tmp_path / "entry-a.npy"))


def test_a_write_that_can_go_to_the_background_only_when_asked(tmp_path):
    with background_writes():
        write_files(entry_files(tmp_path), lambda: None, Failed, background=False)
        check_entry(tmp_path)  # written at once: a shared store uploads the files right after


def test_another_thread_outside_the_build_writes_at_once(tmp_path):
    seen = []
    with background_writes():
        thread = threading.Thread(target=lambda: seen.append(file_writes.current()))
        thread.start()
        thread.join()
    assert seen == [None]


def test_a_name_that_is_not_utf8_is_written_as_it_is(tmp_path):
    name = os.fsdecode(b"caf\xe9-a.npy")  # a Latin-1 name, surrogate-escaped
    write_files([FileWrite(str(tmp_path / name), b"x")], lambda: None, Failed)
    assert os.listdir(os.fsencode(tmp_path)) == [b"caf\xe9-a.npy"]


def test_a_child_forked_during_a_build_writes_at_once(tmp_path):
    import multiprocessing

    def child():
        assert file_writes.current() is None  # none of the parent's writer threads are here
        write_files(entry_files(tmp_path, "child"), lambda: None, Failed)
        check_entry(tmp_path, "child")

    with background_writes():
        process = multiprocessing.get_context("fork").Process(target=child)
        process.start()
        process.join(120)
    assert process.exitcode == 0
    check_entry(tmp_path, "child")


def test_a_failed_write_is_raised_with_its_os_error_as_the_cause(tmp_path):
    files = [FileWrite(str(tmp_path / "missing" / "a.npy"), b"")]
    with pytest.raises(Failed) as caught, background_writes():
        write_files(files, lambda: None, Failed)
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_writes_wait_while_too_many_bytes_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(file_writes, "MAX_QUEUED_BYTES", 1000)
    with background_writes():
        for n in range(40):  # 40 x 700 bytes through a queue of 1,000
            write_files(entry_files(tmp_path, f"e{n}"), lambda: None, Failed)
    for n in range(40):
        check_entry(tmp_path, f"e{n}")


# sizes on both sides of where megafmt's sampled blocks start to touch (16 x 4096 + 16 bytes),
# of its header (34 bytes), of BLAKE2b's 128-byte blocks and CRC-32's 8-byte slices
FINGERPRINTED_SIZES = [0, 1, 7, 8, 9, 33, 34, 35, 127, 128, 129, 4096, 65551, 65552, 65553]
FINGERPRINTED_SIZES += [65536 * 2 + 5, 1_000_003]


@pytest.mark.parametrize("background", [False, True])
def test_a_corpus_fingerprinted_by_the_writer_is_megafmts_fingerprint(tmp_path, background):
    """The writer's fingerprint of a corpus (the .idx's CRC-32, the .bin's sampled BLAKE2b-128)
    equals megafmt.fingerprint.corpus_fingerprint, for files of every size regime."""
    rng = numpy.random.default_rng(7)
    sizes = FINGERPRINTED_SIZES + [int(size) for size in rng.integers(0, 400_000, 6)]
    writes = []
    with contextlib.ExitStack() as stack:
        if background:
            stack.enter_context(background_writes())
        for number, size in enumerate(sizes):
            prefix = str(tmp_path / f"c{number}")
            with open(prefix + ".bin", "wb") as stream:
                stream.write(rng.bytes(size))
            with open(prefix + ".idx", "wb") as stream:
                stream.write(rng.bytes(sizes[-1 - number]))
            path = str(tmp_path / f"c{number}.json")
            write = FileWrite(path, b'{"corpus": ', (), "}", CorpusFiles(prefix), "")
            write_files([write], lambda: None, Failed)
            writes.append((prefix, path))
    for prefix, path in writes:
        with open(path) as stream:
            assert json.load(stream) == {"corpus": corpus_fingerprint(prefix)}, prefix


def test_a_corpus_that_cannot_be_read_fails_the_write_naming_its_file(tmp_path):
    prefix = str(tmp_path / "gone")
    with open(prefix + ".idx", "wb") as stream:
        stream.write(b"x")
    files = entry_files(tmp_path)
    files[2] = FileWrite(files[2].path, b"{", (), "}", CorpusFiles(prefix), "")
    with pytest.raises(Failed) as caught:
        write_files(files, lambda: None, Failed)
    assert caught.value.args[0].filename == prefix + ".bin"
    assert isinstance(caught.value.args[0], FileNotFoundError)
    assert not os.path.exists(files[2].path) and not os.path.exists(files[3].path)


def test_a_cache_whose_corpus_cannot_be_read_names_the_corpus_not_the_cache_folder(tmp_path):
    """The sidecar's fingerprint reads the corpus: a corpus gone since its tables were built is
    a CacheError naming its file and what it was read for, not an unwritable cache folder."""
    from megaindex.cache import CacheEntry, IndexCache
    from megaindex.errors import CacheError

    prefix = str(tmp_path / "corpus")
    with open(prefix + ".idx", "wb") as stream:
        stream.write(b"x")
    entry = CacheEntry.for_dataset(str(tmp_path / "cache"), "0" * 32, "GPTDataset", "train", ("a",))
    sidecar = {"corpus": CorpusFiles(prefix), "checksums": {}}
    with pytest.raises(CacheError, match=r"corpus\.bin: cannot be read to fingerprint its corpus"):
        IndexCache(entry, "description").save({"a": numpy.arange(3)}, sidecar)
    assert not os.path.exists(entry.description_path)


def test_a_corpus_unread_for_want_of_descriptors_names_the_limit_not_a_change(
    tmp_path, monkeypatch
):
    """The writer met the open-files limit reading the corpus for the sidecar's fingerprint:
    the error names the limit (with errno), not a corpus that "changed or went away"."""
    import errno

    from megaindex import cache as cache_module
    from megaindex.cache import CacheEntry, IndexCache
    from megaindex.errors import CacheError

    prefix = write_corpus(str(tmp_path / "corpus"), 5)

    def out_of_descriptors(files, on_done, on_error, background=True, tables=None):
        on_done()
        error = OSError(errno.EMFILE, "Too many open files", prefix + ".idx")
        raise on_error(error) from error

    monkeypatch.setattr(cache_module, "write_files", out_of_descriptors)
    entry = CacheEntry.for_dataset(str(tmp_path / "cache"), "0" * 32, "GPTDataset", "train", ("a",))
    sidecar = {"corpus": CorpusFiles(prefix), "checksums": {}}
    with pytest.raises(CacheError) as caught:
        IndexCache(entry, "description").save({"a": numpy.arange(3)}, sidecar)
    message = str(caught.value)
    assert message.startswith(f"{prefix}.idx: cannot be read to fingerprint its corpus")
    assert "the open-files limit was reached" in message and "changed" not in message
    assert caught.value.errno == errno.EMFILE


def test_a_wait_for_the_writer_says_what_it_waits_for(tmp_path, monkeypatch, caplog):
    import logging

    monkeypatch.setattr(file_writes, "WAIT_SLICE_SECONDS", 0.05)
    monkeypatch.setattr(file_writes, "WAIT_MESSAGE_SECONDS", 0.2)
    prefix = str(tmp_path / "corpus")
    os.mkfifo(prefix + ".idx")  # the writer's fingerprint of it waits for a writer of the fifo
    (tmp_path / "corpus.bin").write_bytes(b"")
    files = [FileWrite(str(tmp_path / "sidecar.json"), b"{", corpus=CorpusFiles(prefix), tail="}")]

    def feed() -> None:
        with open(prefix + ".idx", "wb") as stream:
            stream.write(b"not an index")

    with caplog.at_level(logging.WARNING, logger="megaindex.file_writes"):
        with contextlib.suppress(Failed), background_writes():  # the fingerprint may fail
            written = write_files(files, lambda: None, Failed)
            threading.Timer(1.0, feed).start()
            with contextlib.suppress(OSError):
                written.identities()
        assert f"the write of the files ending with {tmp_path / 'sidecar.json'}" in caplog.text
        assert "the file system is slow or does not answer" in caplog.text


def test_held_bytes_are_taken_by_the_write_and_kept_by_a_try_that_found_no_room(
    tmp_path, monkeypatch
):
    """A table's bytes the extension holds go to the writer without a copy: the write that
    queues them takes them; a try that found the queue full leaves them whole for the next."""
    monkeypatch.setattr(file_writes, "MAX_QUEUED_BYTES", 1)
    monkeypatch.setattr(file_writes, "WAIT_SLICE_SECONDS", 0.05)
    corpora = [str(tmp_path / f"corpus{n}") for n in range(file_writes.WRITER_THREADS)]
    for prefix in corpora:  # the writer's fingerprint of each waits for a writer of its fifo
        os.mkfifo(prefix + ".idx")
        with open(prefix + ".bin", "wb"):
            pass
    table = numpy.arange(100_000, dtype=numpy.int32)
    held = held_bytes(b"HEAD", table)
    tries = []
    submit = _ext.FileWriterPool.submit

    def counted(pool, steps, seconds):
        if any(step[2] is held for step in steps):
            tries.append(seconds)
        return submit(pool, steps, seconds)

    monkeypatch.setattr(_ext.FileWriterPool, "submit", counted)

    def feed() -> None:
        for prefix in corpora:
            with open(prefix + ".idx", "wb") as stream:
                stream.write(b"not an index")

    feeder = threading.Timer(0.5, feed)
    with contextlib.suppress(Failed), background_writes():  # the fingerprints may fail
        for n, prefix in enumerate(corpora):  # each writer thread waits on a fifo
            corpus = CorpusFiles(prefix)
            sidecar = FileWrite(str(tmp_path / f"{n}.json"), b"{", corpus=corpus, tail="}")
            write_files([sidecar], lambda: None, Failed)
        write_files([FileWrite(str(tmp_path / "queued"), b"x")], lambda: None, Failed)
        feeder.start()
        write_files([FileWrite(str(tmp_path / "t.npy"), held)], lambda: None, Failed)
    feeder.join(30)
    assert len(tries) >= 2  # the table's write found no room, then room
    assert (tmp_path / "t.npy").read_bytes() == b"HEAD" + table.tobytes()
    assert bytes(held) == b""  # taken, not copied


def test_held_bytes_written_twice_are_refused_not_written_empty(tmp_path):
    held = held_bytes(b"HEAD", numpy.arange(10, dtype=numpy.int32))
    write_files([FileWrite(str(tmp_path / "a.npy"), held)], lambda: None, Failed)
    again = str(tmp_path / "b.npy")
    with pytest.raises(ValueError, match="b.npy: these FileBytes were taken by an earlier write"):
        write_files([FileWrite(again, held)], lambda: None, Failed)
    assert not os.path.exists(again)
    assert (tmp_path / "a.npy").read_bytes() == b"HEAD" + numpy.arange(10, dtype="<i4").tobytes()


@pytest.mark.parametrize("dtype", ["<i4", ">i8", "<M8[s]", "S3", "|u1"])
@pytest.mark.parametrize("shape", [(0,), (7,), (3, 2), ()])
def test_held_bytes_are_the_head_then_the_array_in_its_order(dtype, shape):
    array = numpy.arange(int(numpy.prod(shape))).astype(dtype).reshape(shape)
    assert bytes(held_bytes(b"head", array)) == b"head" + array.tobytes()
