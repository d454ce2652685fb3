"""The table cache shared through a store (megaindex.shared_cache), on fsspec's memory store:
one build, a download per node, description checks, dead builds redone once, messages."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
import uuid

import fsspec
import numpy
import pytest

from megafmt.errors import NotAFolderError
from megafmt.testing import write_corpus
from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, distributed, shared_cache
from megaindex.cache import CacheEntry, UnusableCopyError
from megaindex.errors import CacheError
from megaindex.shared_cache import (
    SharedCacheConfig,
    SharedCacheError,
    SharedTableCache,
    cache_location,
    requests_sent,
)

TABLES = ("document_index", "sample_index", "shuffle_index")


@pytest.fixture
def store() -> str:
    """A fresh folder of fsspec's in-memory store."""
    url = f"memory://shared-{uuid.uuid4().hex}/cache"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def build_on_node(make_config, store: str, node: str) -> list[GPTDataset]:
    config = make_config(path_to_cache=store, object_storage_cache_path=node)
    return BlendedMegatronDatasetBuilder(GPTDataset, [100, 10, 5], lambda: True, config).build()


def test_cache_location_keeps_local_paths_and_mirrors_urls(tmp_path):
    assert cache_location("/data/cache", None) == ("/data/cache", None)
    assert cache_location(None, "/x") == (None, None)
    local, remote = cache_location("s3://bucket/run/cache", str(tmp_path))
    assert remote == "s3://bucket/run/cache"
    assert local == os.path.join(tmp_path, "tables", "s3", "bucket", "run", "cache")


def test_one_node_builds_and_uploads_another_downloads_the_same_tables(
    make_config, store, tmp_path
):
    first = build_on_node(make_config, store, str(tmp_path / "node0"))
    assert [d.index_source.kind for d in first] == ["built"] * 3
    names = fsspec.filesystem("memory").ls(store, detail=False)
    assert sum(name.endswith("-description.txt") for name in names) == 3
    assert not [name for name in names if "-lease-" in name]  # removed once committed
    before = dict(requests_sent)
    second = build_on_node(make_config, store, str(tmp_path / "node1"))
    assert [d.index_source.kind for d in second] == ["cache"] * 3
    sent = {kind: requests_sent[kind] - before.get(kind, 0) for kind in requests_sent}
    assert sent.get("create", 0) == 0 and sent.get("put", 0) == 0  # nothing built or uploaded
    for built, downloaded in zip(first, second, strict=True):
        for table in TABLES:
            numpy.testing.assert_array_equal(built.tables[table], downloaded.tables[table])
    # a third process on node 1 maps the node's copy and sends nothing
    before = dict(requests_sent)
    third = build_on_node(make_config, store, str(tmp_path / "node1"))
    assert [d.index_source.kind for d in third] == ["cache"] * 3
    assert dict(requests_sent) == before


def sent_since(before: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in requests_sent.items() if n > before.get(k, 0)}


def test_a_fresh_process_lists_the_store_once_and_gets_each_table_once(
    make_config, store, tmp_path, monkeypatch
):
    build_on_node(make_config, store, str(tmp_path / "node0"))
    monkeypatch.setattr(shared_cache, "_listings", {})  # a process that has not listed it yet
    before = dict(requests_sent)
    second = build_on_node(make_config, store, str(tmp_path / "node1"))
    assert [d.index_source.kind for d in second] == ["cache"] * 3
    # 3 datasets: their 3 tables and sidecar each; the listed descriptions are not fetched
    assert sent_since(before) == {"list": 1, "get": 3 * (len(TABLES) + 1)}


@pytest.mark.parametrize("listed", [False, True], ids=["fetched", "listed"])
def test_a_store_holding_another_description_under_the_name_is_refused(
    make_config, store, tmp_path, monkeypatch, listed
):
    build_on_node(make_config, store, str(tmp_path / "node0"))
    fs = fsspec.filesystem("memory")
    description = next(n for n in fs.ls(store, detail=False) if n.endswith("description.txt"))
    fs.pipe_file(description, b'{"other": "tables"}')
    # a fresh process lists the store (the listed size is another description's), or one
    # listed it before anything was committed (the description is fetched)
    monkeypatch.setattr(shared_cache, "_listings", {} if listed else {store: {}})
    with pytest.raises(SharedCacheError, match="description does not match"):
        build_on_node(make_config, store, str(tmp_path / "node1"))


def test_a_download_shorter_than_the_listed_object_is_refused(
    make_config, store, tmp_path, monkeypatch
):
    build_on_node(make_config, store, str(tmp_path / "node0"))
    fs = fsspec.filesystem("memory")
    listing = {n.rsplit("/", 1)[1]: fs.size(n) for n in fs.ls(store, detail=False)}
    table = next(name for name in listing if name.endswith("-shuffle_index.npy"))
    listing[table] += 8  # as if the transfer had been cut 8 bytes short
    monkeypatch.setattr(shared_cache, "_listings", {store: listing})
    with pytest.raises(SharedCacheError, match=f"{table}: downloaded .* bytes to .*listed"):
        build_on_node(make_config, store, str(tmp_path / "node1"))
    assert not list((tmp_path / "node1").rglob("*.partial"))  # no half-downloaded file left
    base = table.removesuffix("-shuffle_index.npy")
    # none of that entry's files but the node's lock
    assert [p.name for p in (tmp_path / "node1").rglob(f"{base}-*")] == [f"{base}-node.lock"]


@pytest.mark.parametrize("stale", ["mid-upload", "no sizes"])
def test_sizes_of_a_listing_taken_before_the_commit_or_not_given_are_not_held_against_it(
    make_config, store, tmp_path, monkeypatch, stale
):
    """A listing taken while a build uploaded (its tables partly there, its descriptions not
    yet), or from a file system that lists no sizes: the downloads are not refused for it."""
    build_on_node(make_config, store, str(tmp_path / "node0"))
    fs = fsspec.filesystem("memory")
    listing = {n.rsplit("/", 1)[1]: fs.size(n) for n in fs.ls(store, detail=False)}
    if stale == "mid-upload":
        listing = {name: size // 2 for name, size in listing.items()
                   if not name.endswith("description.txt")}  # fmt: skip
    else:
        listing = dict.fromkeys(listing)
    monkeypatch.setattr(shared_cache, "_listings", {store: listing})
    second = build_on_node(make_config, store, str(tmp_path / "node1"))
    assert [d.index_source.kind for d in second] == ["cache"] * 3


def entry_in(folder) -> CacheEntry:
    return CacheEntry(str(folder), "0123-Tables-train", ("a",))


def saver(entry: CacheEntry, calls: list[str]):
    """A load_or_build that saves one table and its description (as a build would)."""

    def load_or_build() -> str:
        if entry.complete():
            return "loaded"
        calls.append("built")
        os.makedirs(entry.directory, exist_ok=True)
        numpy.save(entry.table_path("a"), numpy.arange(5))
        with open(entry.description_path, "w") as stream:
            stream.write("described")
        return "built"

    return load_or_build


def lease_of(store: str, generation: int) -> str:
    return f"{store}/0123-Tables-train-lease-{generation}.json"


def wait_for_lease(store: str, generation: int) -> None:
    """Until the builder's lease is in the store, at most 2 s."""
    for _ in range(200):
        if fsspec.filesystem("memory").exists(lease_of(store, generation)):
            return
        threading.Event().wait(0.01)


def dead_lease(store: str, generation: int) -> None:
    holder = {"holder": "node7 pid 42", "beat": 3, "time": 0}
    fsspec.filesystem("memory").pipe_file(lease_of(store, generation), json.dumps(holder).encode())


def failed_lease(store: str, generation: int) -> None:
    lease = {"holder": "node7 pid 42", "beat": -1, "time": 0, "failed": "ValueError: damaged"}
    fsspec.filesystem("memory").pipe_file(lease_of(store, generation), json.dumps(lease).encode())


def test_a_build_that_died_is_redone_once_by_the_next_process(store, tmp_path, caplog):
    dead_lease(store, 1)  # a build started and stopped sending heartbeats
    entry, calls = entry_in(tmp_path / "node1"), []
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=0.3, poll_seconds=0.05))
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        assert cache.obtain(entry, "described", saver(entry, calls), may_build=True) == "built"
    assert calls == ["built"]
    assert "stopped sending heartbeats for 0.3 s; building again" in caplog.text
    fs = fsspec.filesystem("memory")
    assert not fs.exists(lease_of(store, 1)) and not fs.exists(lease_of(store, 2))
    assert fs.cat_file(f"{store}/0123-Tables-train-description.txt") == b"described"


@pytest.mark.parametrize(
    ("last_lease", "ended"),
    [
        (dead_lease, "node7 pid 42 (heartbeat 3) stopped sending heartbeats for 0.2 s)"),
        (failed_lease, "node7 pid 42 failed: ValueError: damaged)"),  # at once, quoted
    ],
    ids=["dead", "failed"],
)
def test_builds_that_keep_dying_end_in_an_error_naming_the_store(
    store, tmp_path, last_lease, ended
):
    dead_lease(store, 1)
    last_lease(store, 2)
    entry = entry_in(tmp_path / "node1")
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=0.2, poll_seconds=0.05))
    with pytest.raises(SharedCacheError) as raised:
        cache.obtain(entry, "described", saver(entry, []), may_build=True)
    message = str(raised.value)
    assert "2 builds of these tables started and none finished" in message
    assert f"(the last by {ended}" in message and store in message


def test_a_waiting_process_says_what_it_waits_for_and_gets_the_upload(store, tmp_path, caplog):
    config = SharedCacheConfig(
        store, lease_seconds=5, heartbeat_seconds=0.05, poll_seconds=0.05, message_seconds=0.1
    )
    builder_entry, waiter_entry = entry_in(tmp_path / "node0"), entry_in(tmp_path / "node1")
    release, built = threading.Event(), []

    def slow_build() -> str:
        release.wait(5)
        return saver(builder_entry, built)()

    thread = threading.Thread(
        target=SharedTableCache(config).obtain,
        args=(builder_entry, "described", slow_build, True),
    )
    thread.start()
    wait_for_lease(store, 1)
    waiter_built: list[str] = []
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        threading.Timer(0.5, release.set).start()
        got = SharedTableCache(config).obtain(
            waiter_entry, "described", saver(waiter_entry, waiter_built), may_build=True
        )
    thread.join(5)
    assert built == ["built"] and waiter_built == [] and got == "loaded"  # downloaded
    assert f"waiting for {store}/0123-Tables-train-description.txt: lease 1 held by" in (
        caplog.text
    )


def test_a_process_that_may_not_build_leaves_the_error_to_the_loader(store, tmp_path):
    entry = entry_in(tmp_path / "node1")

    def refuse() -> str:
        raise RuntimeError("no complete index cache")

    cache = SharedTableCache(SharedCacheConfig(store))
    with pytest.raises(RuntimeError, match="no complete index cache"):
        cache.obtain(entry, "described", refuse, may_build=False)
    assert not fsspec.filesystem("memory").exists(lease_of(store, 1))


def test_a_process_that_may_not_build_fails_naming_a_dead_lease_nobody_claims(store, tmp_path):
    dead_lease(store, 1)  # a failed job's, left behind; no process that may build comes
    entry, calls = entry_in(tmp_path / "node1"), []
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=0.2, poll_seconds=0.05))
    raised: list[Exception] = []

    def obtain() -> None:
        try:
            cache.obtain(entry, "described", saver(entry, calls), may_build=False)
        except Exception as error:
            raised.append(error)

    waiter = threading.Thread(target=obtain, daemon=True)  # a wait without end stays behind
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), "the process waits on a dead lease without end"
    assert len(raised) == 1 and isinstance(raised[0], SharedCacheError)
    message = str(raised[0])
    assert lease_of(store, 1) in message and "node7 pid 42 (heartbeat 3)" in message
    assert "no process that builds shared files (global rank 0) claimed lease 2" in message
    assert calls == []


@pytest.mark.parametrize(
    ("left_lease", "lease_seconds"),
    [(dead_lease, 1.0), (failed_lease, 5.0)],
    ids=["dead", "failed"],
)
def test_a_process_that_may_not_build_gets_the_tables_of_the_next_lease(
    store, tmp_path, left_lease, lease_seconds
):
    # a failed lease may be another job's: this one's builder claims the next at once, while
    # the waiter gives it a lease time
    left_lease(store, 1)
    config = SharedCacheConfig(
        store, lease_seconds=lease_seconds, poll_seconds=0.05, heartbeat_seconds=0.05
    )
    builder_entry, waiter_entry = entry_in(tmp_path / "node0"), entry_in(tmp_path / "node1")
    waiter_built: list[str] = []
    got: list[str] = []
    waiter = threading.Thread(
        target=lambda: got.append(
            SharedTableCache(config).obtain(
                waiter_entry, "described", saver(waiter_entry, waiter_built), False
            )
        )
    )
    waiter.start()
    built: list[str] = []
    assert (
        SharedTableCache(config).obtain(
            builder_entry, "described", saver(builder_entry, built), True
        )
        == "built"
    )
    waiter.join(10)
    assert built == ["built"] and waiter_built == [] and got == ["loaded"]


def test_the_lease_length_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("MEGAINDEX_SHARED_CACHE_LEASE_SECONDS", "7.5")
    assert SharedCacheConfig.from_environment("s3://b/c").lease_seconds == 7.5


@pytest.mark.parametrize("text", ["soon", "0", "-5", "inf", "nan"])
def test_a_lease_length_from_the_environment_that_is_no_finite_time_is_named(monkeypatch, text):
    monkeypatch.setenv("MEGAINDEX_SHARED_CACHE_LEASE_SECONDS", text)
    with pytest.raises(
        CacheError,
        match=f"MEGAINDEX_SHARED_CACHE_LEASE_SECONDS='{text}': expected a finite number",
    ):
        SharedCacheConfig.from_environment("s3://b/c")


def test_a_heartbeat_no_shorter_than_the_lease_is_refused():
    with pytest.raises(CacheError, match="heartbeat_seconds must be above 0 and below"):
        SharedCacheConfig("s3://b/c", lease_seconds=10, heartbeat_seconds=10)


def test_a_local_copy_the_store_lacks_is_uploaded_by_a_process_that_may_build(store, tmp_path):
    # a run that built here was killed before its upload ended: the node keeps a complete copy,
    # the store a dead lease
    entry, calls = entry_in(tmp_path / "node0"), []
    saver(entry, calls)()
    dead_lease(store, 1)
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=0.3, poll_seconds=0.05))
    assert cache.obtain(entry, "described", saver(entry, calls), may_build=True) == "loaded"
    assert calls == ["built"]  # the first run's build only
    fs = fsspec.filesystem("memory")
    assert fs.cat_file(f"{store}/0123-Tables-train-description.txt") == b"described"
    assert not fs.exists(lease_of(store, 1))
    # another node then gets them; a process that may not build uploads nothing
    other = entry_in(tmp_path / "node1")
    assert cache.obtain(other, "described", saver(other, calls), may_build=False) == "loaded"
    assert calls == ["built"]
    # a process that may not build maps a complete copy as it is, whatever the store holds
    fs.rm(f"{store}/0123-Tables-train-description.txt")
    before = dict(requests_sent)
    assert cache.obtain(other, "described", saver(other, calls), may_build=False) == "loaded"
    assert sent_since(before) == {}


def test_a_description_cut_short_in_the_store_is_uploaded_again_by_the_builder(
    store, tmp_path, monkeypatch
):
    # a run killed while it wrote the description in place: a start of it is in the store
    entry, calls = entry_in(tmp_path / "node0"), []
    saver(entry, calls)()
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{store}/0123-Tables-train-description.txt", b"descr")
    dead_lease(store, 1)
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=0.3, poll_seconds=0.05))
    assert cache.obtain(entry, "described", saver(entry, calls), may_build=True) == "loaded"
    assert fs.cat_file(f"{store}/0123-Tables-train-description.txt") == b"described"
    monkeypatch.setattr(shared_cache, "_listings", {})  # another node's process
    other = entry_in(tmp_path / "node1")
    assert cache.obtain(other, "described", saver(other, calls), may_build=False) == "loaded"
    assert calls == ["built"]  # the first run's build only


def test_a_store_that_cannot_be_asked_leaves_the_builder_s_complete_copy_to_serve(
    store, tmp_path, monkeypatch, caplog
):
    entry = entry_in(tmp_path / "node0")
    saver(entry, [])()
    cache = SharedTableCache(SharedCacheConfig(store))

    def down(*args):
        raise ConnectionError("the endpoint does not answer")

    monkeypatch.setattr(cache.store, "listing", down)
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        assert cache.obtain(entry, "described", saver(entry, []), may_build=True) == "loaded"
    assert "the endpoint does not answer); this node's copy is used as it is" in caplog.text


def test_a_description_being_written_is_waited_for_not_refused(store, tmp_path):
    # a file system whose put writes in place: the description's first bytes are there first
    entry = entry_in(tmp_path / "node1")
    fs = fsspec.filesystem("memory")
    numpy.save(str(tmp_path / "a.npy"), numpy.arange(5))
    fs.put_file(str(tmp_path / "a.npy"), f"{store}/0123-Tables-train-a.npy")
    fs.pipe_file(f"{store}/0123-Tables-train-description.txt", b"descr")
    wait = SharedTableCache(SharedCacheConfig(store, lease_seconds=5, poll_seconds=0.05))
    dead_lease(store, 1)  # the uploader's lease, while it writes
    got: list[str] = []
    waiter = threading.Thread(
        target=lambda: got.append(wait.obtain(entry, "described", saver(entry, []), False))
    )
    waiter.start()
    threading.Event().wait(0.3)
    assert waiter.is_alive() and got == []  # still waiting, not refused
    fs.pipe_file(f"{store}/0123-Tables-train-description.txt", b"described")
    fs.rm(lease_of(store, 1))
    waiter.join(10)
    assert got == ["loaded"]


def test_the_store_s_credentials_stay_out_of_the_log(tmp_path, caplog):
    store = f"memory://AKIAEXAMPLE:SuperSecret@creds-{uuid.uuid4().hex}/cache"
    entry = entry_in(tmp_path / "node0")
    with caplog.at_level(logging.INFO, logger="megaindex.shared_cache"):
        SharedTableCache(SharedCacheConfig(store)).obtain(
            entry, "described", saver(entry, []), True
        )
    assert "uploaded the 0123-Tables-train tables" in caplog.text
    assert "SuperSecret" not in caplog.text and "AKIAEXAMPLE" not in caplog.text


def test_a_heartbeat_that_fails_with_any_error_does_not_stop_the_next(
    store, tmp_path, monkeypatch, caplog
):
    cache = SharedTableCache(
        SharedCacheConfig(store, lease_seconds=0.4, heartbeat_seconds=0.05, poll_seconds=0.05)
    )
    writes = []
    write = cache.store.write

    def flaky(name: str, data: bytes) -> None:
        writes.append(name)
        if len(writes) == 1:
            raise RuntimeError("a client error s3fs passed through")
        write(name, data)

    monkeypatch.setattr(cache.store, "write", flaky)
    entry = entry_in(tmp_path / "node0")
    build = saver(entry, [])

    def slow_build() -> str:
        threading.Event().wait(0.4)
        return build()

    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        assert cache.obtain(entry, "described", slow_build, may_build=True) == "built"
    assert len(writes) >= 2  # beats went on after the failed one
    assert "heartbeat 1 not written (a client error s3fs passed through)" in caplog.text


def test_a_lease_the_store_will_not_remove_after_the_commit_leaves_the_build_done(
    store, tmp_path, monkeypatch, caplog
):
    cache = SharedTableCache(SharedCacheConfig(store))

    def refuse(name: str) -> None:
        raise PermissionError("DELETE denied")

    monkeypatch.setattr(cache.store, "remove", refuse)
    entry = entry_in(tmp_path / "node0")
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        assert cache.obtain(entry, "described", saver(entry, []), may_build=True) == "built"
    assert "the lease of a finished build not removed (DELETE denied)" in caplog.text


def test_a_node_lock_the_file_system_cannot_take_is_named(store, tmp_path, monkeypatch):
    def no_locks(stream, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(shared_cache.fcntl, "flock", no_locks)
    entry = entry_in(tmp_path / "node0")
    with pytest.raises(SharedCacheError, match="node.lock: the node's lock .* on a local disk"):
        SharedTableCache(SharedCacheConfig(store)).obtain(entry, "d", saver(entry, []), True)


def test_a_file_in_the_way_of_the_local_copy_is_named(store, tmp_path):
    (tmp_path / "node1").write_text("not a folder")
    cache = SharedTableCache(SharedCacheConfig(store))
    with pytest.raises(NotAFolderError, match="the local copy of the shared index cache must be"):
        cache.obtain(entry_in(tmp_path / "node1"), "described", lambda: None, may_build=True)


def test_a_lease_in_a_local_folder_is_created_by_one_process_only(tmp_path):
    folder = tmp_path / "store"
    folder.mkdir()
    store = shared_cache._Store(f"file://{folder}", 10.0)
    assert store.create("t-lease-1.json", b"first")
    assert not store.create("t-lease-1.json", b"second")
    assert (folder / "t-lease-1.json").read_bytes() == b"first"
    os.symlink(tmp_path / "elsewhere", folder / "t-lease-2.json")  # never written through
    assert not store.create("t-lease-2.json", b"x")
    assert not (tmp_path / "elsewhere").exists()


def test_a_conditional_put_refused_with_an_io_error_lost_the_race_or_is_named(store, monkeypatch):
    shared = shared_cache._Store(store, 10.0)

    def conflict(path, data, mode="overwrite"):
        raise OSError(5, "An error occurred (ConditionalRequestConflict)")

    memory = fsspec.filesystem("memory")
    memory.pipe_file(f"{store}/t-lease-1.json", b"{}")
    memory.pipe_file(f"{store}/t-lease-3.json", b"mine")
    monkeypatch.setattr(shared_cache, "CONFLICT_SECONDS", 0.3)
    monkeypatch.setattr(shared.fs, "pipe_file", conflict)
    assert not shared.create("t-lease-1.json", b"mine")  # another process's lease is there
    assert shared.create("t-lease-3.json", b"mine")  # this one's put landed, its reply was lost
    with pytest.raises(SharedCacheError) as raised:
        shared.create("t-lease-2.json", b"mine")
    assert f"{store}/t-lease-2.json: the lease could not be created" in str(raised.value)
    assert "ConditionalRequestConflict" in str(raised.value)


def test_a_local_lease_whose_write_fails_is_removed_and_named(tmp_path, monkeypatch):
    folder = tmp_path / "store"
    folder.mkdir()
    store = shared_cache._Store(f"file://{folder}", 10.0)

    def full(descriptor, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shared_cache.os, "write", full)
    with pytest.raises(SharedCacheError, match="t-lease-1.json: the lease could not be created or"):
        store.create("t-lease-1.json", b"lease")
    monkeypatch.undo()
    assert not (folder / "t-lease-1.json").exists()  # not taken for another process's


def test_a_failed_build_fails_the_processes_waiting_for_it_with_its_error(store, tmp_path):
    config = SharedCacheConfig(store, lease_seconds=2, heartbeat_seconds=0.05, poll_seconds=0.05)
    builder_entry, waiter_entry = entry_in(tmp_path / "node0"), entry_in(tmp_path / "node1")
    release = threading.Event()
    outcomes: dict[str, Exception] = {}

    def failing_build() -> str:
        release.wait(10)
        raise ValueError("corpus c7 is damaged")

    def run(name: str, entry: CacheEntry, load_or_build, may_build: bool) -> None:
        try:
            SharedTableCache(config).obtain(entry, "described", load_or_build, may_build)
        except Exception as error:
            outcomes[name] = error

    builder = threading.Thread(target=run, args=("builder", builder_entry, failing_build, True))
    builder.start()
    fs = fsspec.filesystem("memory")
    wait_for_lease(store, 1)
    waiter = threading.Thread(
        target=run, args=("waiter", waiter_entry, saver(waiter_entry, []), False), daemon=True
    )
    waiter.start()
    release.set()
    builder.join(20)
    waiter.join(20)
    assert not waiter.is_alive(), "the waiter did not learn of the failed build"
    assert isinstance(outcomes["builder"], ValueError)
    message = str(outcomes["waiter"])
    assert isinstance(outcomes["waiter"], SharedCacheError)
    assert lease_of(store, 1) in message and "failed: ValueError: corpus c7 is damaged" in message
    assert "claimed lease 2 within 2 s" in message
    assert json.loads(fs.cat_file(lease_of(store, 1)))["failed"] == (
        "ValueError: corpus c7 is damaged"
    )


def test_a_process_that_may_build_claims_the_lease_of_a_failed_build_at_once(
    store, tmp_path, caplog
):
    failed_lease(store, 1)
    entry, calls = entry_in(tmp_path / "node1"), []
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=30, poll_seconds=0.05))
    got: list[str] = []
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        claimer = threading.Thread(
            target=lambda: got.append(cache.obtain(entry, "described", saver(entry, calls), True)),
            daemon=True,
        )
        claimer.start()
        claimer.join(20)  # a dead lease would be watched for 30 s first
    assert got == ["built"] and calls == ["built"]
    assert "the build under lease 1 failed: ValueError: damaged; building again" in caplog.text


def test_a_failed_builds_lease_masks_credentials_in_its_error(store, tmp_path):
    entry = entry_in(tmp_path / "node0")
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=5, poll_seconds=0.05))

    def failing_build() -> str:
        raise OSError("cannot read s3://AKIDEXAMPLE:s3cr3tkey@bucket/corpus.idx")

    with pytest.raises(OSError):
        cache.obtain(entry, "described", failing_build, may_build=True)
    failed = json.loads(fsspec.filesystem("memory").cat_file(lease_of(store, 1)))["failed"]
    assert failed.startswith("OSError: cannot read s3://") and "s3cr3tkey" not in failed


def failing(error: BaseException):
    def load_or_build() -> str:
        raise error

    return load_or_build


def test_an_interrupted_build_leaves_its_lease_to_die(store, tmp_path):
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=30, poll_seconds=0.05))
    with pytest.raises(KeyboardInterrupt):
        cache.obtain(entry_in(tmp_path), "described", failing(KeyboardInterrupt()), True)
    lease = json.loads(fsspec.filesystem("memory").cat_file(lease_of(store, 1)))
    assert "failed" not in lease and lease["beat"] == 0


def test_a_failure_the_store_refuses_to_record_leaves_the_builds_error(
    store, tmp_path, monkeypatch, caplog
):
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=30, poll_seconds=0.05))

    def refuse(name, data):
        raise RuntimeError("the store is gone")

    monkeypatch.setattr(cache.store, "write", refuse)
    with (
        caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"),
        pytest.raises(ValueError, match="damaged corpus"),
    ):
        cache.obtain(entry_in(tmp_path), "described", failing(ValueError("damaged corpus")), True)
    assert "the build's failure not recorded (the store is gone)" in caplog.text


def test_a_long_failure_is_recorded_cut_to_its_limit(store, tmp_path):
    cache = SharedTableCache(SharedCacheConfig(store, lease_seconds=30, poll_seconds=0.05))
    with pytest.raises(ValueError):
        cache.obtain(entry_in(tmp_path), "described", failing(ValueError("x" * 5000)), True)
    failed = json.loads(fsspec.filesystem("memory").cat_file(lease_of(store, 1)))["failed"]
    assert len(failed) == shared_cache.FAILURE_CHARACTERS and failed.endswith("x...")
    assert failed.startswith("ValueError: xxx")


def test_deferred_tables_on_another_node_are_downloaded_when_first_read(
    make_config, store, tmp_path
):
    built = build_on_node(make_config, store, str(tmp_path / "node0"))
    config = make_config(
        path_to_cache=store,
        object_storage_cache_path=str(tmp_path / "node1"),
        defer_npy_index_mmap=True,
    )
    before = dict(requests_sent)
    deferred = BlendedMegatronDatasetBuilder(GPTDataset, [100, 10, 5], lambda: True, config).build()
    assert sent_since(before) == {}  # nothing fetched before a sample is read
    assert [d.index_source.kind for d in deferred] == ["deferred"] * 3
    for table in TABLES:
        numpy.testing.assert_array_equal(deferred[0].tables[table], built[0].tables[table])
    assert sent_since(before).get("create", 0) == 0  # downloaded, never claimed


def test_a_process_its_node_s_copy_serves_never_makes_the_store_s_file_system(
    store, tmp_path, monkeypatch
):
    # the store's client (s3fs and botocore for S3) is imported only by a process that asks it
    builder = entry_in(tmp_path / "node0")
    SharedTableCache(SharedCacheConfig(store)).obtain(builder, "d", saver(builder, []), True)
    entry = entry_in(tmp_path / "node1")
    SharedTableCache(SharedCacheConfig(store)).obtain(entry, "described", saver(entry, []), False)

    def no_client(url: str) -> None:
        raise AssertionError(f"the store's file system was made for {url}")

    monkeypatch.setattr(shared_cache.fsspec.core, "url_to_fs", no_client)
    cache = SharedTableCache(SharedCacheConfig(store))
    assert cache.obtain(entry, "described", saver(entry, []), may_build=False) == "loaded"


def test_a_damaged_copy_on_a_node_that_does_not_build_is_fetched_again(store, tmp_path, caplog):
    builder = entry_in(tmp_path / "node0")
    SharedTableCache(SharedCacheConfig(store)).obtain(builder, "d", saver(builder, []), True)
    entry, loads = entry_in(tmp_path / "node1"), []
    cache = SharedTableCache(SharedCacheConfig(store))
    assert cache.obtain(entry, "described", saver(entry, []), may_build=False) == "loaded"
    with open(entry.table_path("a"), "r+b") as stream:  # a disk error: a table cut short
        stream.truncate(10)

    def checked() -> str:
        loads.append(1)
        if os.path.getsize(entry.table_path("a")) == 10:
            raise UnusableCopyError(f"rank 3: {entry.table_path('a')}: unreadable .npy header")
        return "loaded"

    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        assert cache.obtain(entry, "described", checked, may_build=False) == "loaded"
    assert loads == [1, 1]  # the damaged copy, then the one fetched again
    assert "unreadable .npy header; fetching the tables again from memory://" in caplog.text
    numpy.testing.assert_array_equal(numpy.load(entry.table_path("a")), numpy.arange(5))


def test_a_corpus_re_tokenized_in_place_gets_its_rebuilt_tables_to_every_node(
    make_config, corpus, store, tmp_path, monkeypatch, caplog
):
    node0, node1 = str(tmp_path / "node0"), str(tmp_path / "node1")
    build_on_node(make_config, store, node0)
    with monkeypatch.context() as rank_3:
        rank_3.setattr(distributed, "builds_shared_files", lambda: False)
        assert [d.index_source.kind for d in build_on_node(make_config, store, node1)] == [
            "cache"
        ] * 3
    write_corpus(corpus, 250, seed=7)  # the same path, other documents
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        rebuilt = build_on_node(make_config, store, node0)  # rank 0, first after the barrier
    assert [d.index_source.kind for d in rebuilt] == ["built"] * 3
    assert caplog.text.count("older than the one rebuilt here; replacing it") == 3
    assert not [n for n in fsspec.filesystem("memory").ls(store, detail=False) if "-lease-" in n]
    with monkeypatch.context() as rank_3:  # its node's copy is stale: fetched again
        rank_3.setattr(distributed, "builds_shared_files", lambda: False)
        other = build_on_node(make_config, store, node1)
    assert [d.index_source.kind for d in other] == ["cache"] * 3
    for mine, theirs in zip(rebuilt, other, strict=True):
        for table in TABLES:
            numpy.testing.assert_array_equal(mine.tables[table], theirs.tables[table])
    assert len(other[0]) != 0 and other[0][0]["tokens"].tolist() == rebuilt[0][0]["tokens"].tolist()


@pytest.mark.parametrize("lease", [failed_lease, dead_lease], ids=["failed", "dead"])
def test_the_node_s_next_processes_fail_at_once_with_the_error_of_the_first_that_gave_up(
    store, tmp_path, monkeypatch, lease
):
    lease(store, 1)  # and no process that builds shared files claims lease 2
    first_config = SharedCacheConfig(store, lease_seconds=0.2, poll_seconds=0.02)
    entry = entry_in(tmp_path / "node1")
    with pytest.raises(SharedCacheError, match="lease-1.json") as first:
        SharedTableCache(first_config).obtain(entry, "described", saver(entry, []), False)
    # the node's other ranks, one after another behind its lock (a lease time long enough that
    # the note is fresh whatever the machine's load)
    config = SharedCacheConfig(store, lease_seconds=600, poll_seconds=0.02)
    pauses: list[float] = []
    monkeypatch.setattr(shared_cache.time, "sleep", pauses.append)
    for _ in range(3):
        with pytest.raises(SharedCacheError) as then:
            SharedTableCache(config).obtain(entry, "described", saver(entry, []), False)
        assert str(then.value) == f"{first.value} (as another process of this node found)"
    assert pauses == []  # none of them waited
    monkeypatch.undo()
    note = entry.path("node-verdict.json")
    with open(note) as stream:
        old = {**json.load(stream), "time": 0}  # another job's, long ago: not taken
    with open(note, "w") as stream:
        json.dump(old, stream)
    with pytest.raises(SharedCacheError, match="lease-1.json") as again:
        SharedTableCache(first_config).obtain(entry, "described", saver(entry, []), False)
    assert "as another process of this node found" not in str(again.value)
    fs = fsspec.filesystem("memory")  # the lease changed since: the next process watches it
    changed = {**json.loads(fs.cat_file(lease_of(store, 1))), "holder": "node8 pid 43"}
    fs.pipe_file(lease_of(store, 1), json.dumps(changed).encode())
    with pytest.raises(SharedCacheError, match="lease-1.json") as again:
        SharedTableCache(first_config).obtain(entry, "described", saver(entry, []), False)
    assert "as another process of this node found" not in str(again.value)


def is_rebuilt(result: str) -> bool:
    return result == "rebuilt"


def rebuilt_saver(entry: CacheEntry):
    """A load_or_build that finds the node's copy stale and rebuilds it (a new description
    file), as rank 0 does for a corpus re-tokenized in place."""

    def load_or_build() -> str:
        os.remove(entry.description_path)
        with open(entry.description_path, "w") as stream:
            stream.write("described")
        return "rebuilt"

    return load_or_build


def test_a_rebuilt_copy_does_not_replace_the_store_s_while_a_lease_is_there(
    store, tmp_path, caplog
):
    entry = entry_in(tmp_path / "node0")
    cache = SharedTableCache(SharedCacheConfig(store))
    cache.obtain(entry, "described", saver(entry, []), True)
    dead_lease(store, 1)  # another job's build, or a failed job's lease
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        assert cache.obtain(entry, "described", rebuilt_saver(entry), True, is_rebuilt) == "rebuilt"
    assert "lease-1.json exists: another build holds these tables" in caplog.text
    fs = fsspec.filesystem("memory")
    assert json.loads(fs.cat_file(lease_of(store, 1)))["holder"] == "node7 pid 42"  # its own
    assert fs.exists(f"{store}/0123-Tables-train-description.txt")  # not removed


def test_a_store_that_refuses_to_remove_the_old_copy_keeps_no_lease(
    store, tmp_path, monkeypatch, caplog
):
    entry = entry_in(tmp_path / "node0")
    cache = SharedTableCache(SharedCacheConfig(store))
    cache.obtain(entry, "described", saver(entry, []), True)
    remove = shared_cache._Store.remove

    def refusing(self, name):
        if name.endswith("-description.txt"):
            raise PermissionError(f"{name}: access denied")
        remove(self, name)

    monkeypatch.setattr(shared_cache._Store, "remove", refusing)
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        assert cache.obtain(entry, "described", rebuilt_saver(entry), True, is_rebuilt) == "rebuilt"
    assert "did not replace the store's older copy (0123-Tables-train-description.txt" in (
        caplog.text
    )
    assert not fsspec.filesystem("memory").exists(lease_of(store, 1))


def test_a_stalled_download_is_told_while_it_lasts_and_its_failure_names_the_object(
    store, tmp_path, monkeypatch, caplog
):
    config = SharedCacheConfig(store, poll_seconds=0.05, message_seconds=0.2)
    SharedTableCache(config).obtain(
        entry_in(tmp_path / "node0"), "described", saver(entry_in(tmp_path / "node0"), []), True
    )

    def stalls(self, name, local):
        time.sleep(1.0)  # the endpoint goes quiet; fsspec's timeout is worded as nothing
        try:
            raise ConnectionError(f"Read timeout on endpoint URL {name}")
        except ConnectionError as cause:
            raise TimeoutError() from cause

    monkeypatch.setattr(shared_cache._Store, "download", stalls)
    entry = entry_in(tmp_path / "node1")
    with (
        caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"),
        pytest.raises(SharedCacheError) as raised,
    ):
        SharedTableCache(config).obtain(entry, "described", saver(entry, []), may_build=False)
    assert f"still downloading {store}/0123-Tables-train-" in caplog.text
    message = str(raised.value)
    assert message.startswith(f"{store}/0123-Tables-train-") and " failed after 1 s: " in message
    assert "TimeoutError; from ConnectionError: Read timeout on endpoint URL" in message


@pytest.mark.parametrize("damage", ["deleted", "cut short"])
def test_rank_0_uploads_again_what_the_store_lost_of_its_tables(
    make_config, store, tmp_path, caplog, monkeypatch, damage
):
    node = str(tmp_path / "node0")
    first = build_on_node(make_config, store, node)
    fs = fsspec.filesystem("memory")
    (table,) = [n for n in fs.ls(store, detail=False) if n.endswith("-train-sample_index.npy")]
    size = fs.size(table)
    if damage == "deleted":
        fs.rm(table)
    else:
        fs.pipe_file(table, fs.cat_file(table)[: size // 2])
    monkeypatch.setattr(shared_cache, "_listings", {})  # rank 0 started again: it lists afresh
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        again = build_on_node(make_config, store, node)  # its node's copy complete
    assert "the store holds these tables' description but" in caplog.text
    assert fs.size(table) == size  # whole again
    fresh = build_on_node(make_config, store, str(tmp_path / "node1"))  # another node fetches it
    for built, fetched in zip(first, fresh, strict=True):
        numpy.testing.assert_array_equal(built.sample_index, fetched.sample_index)
    assert [d.index_source.kind for d in again] == ["cache"] * 3  # uploaded, not rebuilt


def test_a_node_that_may_not_build_names_the_objects_the_store_lost(store, tmp_path):
    built = entry_in(tmp_path / "node0")
    SharedTableCache(SharedCacheConfig(store)).obtain(built, "described", saver(built, []), True)
    fsspec.filesystem("memory").rm(f"{store}/0123-Tables-train-a.npy")
    entry = entry_in(tmp_path / "node1")
    with pytest.raises(SharedCacheError, match=r"holds these tables' description but not "
                       r"0123-Tables-train-a.npy: its copy is damaged"):  # fmt: skip
        SharedTableCache(SharedCacheConfig(store)).obtain(
            entry, "described", saver(entry, []), may_build=False
        )


def test_a_store_that_cannot_be_reached_is_an_error_naming_it_and_the_request(
    store, tmp_path, monkeypatch, caplog
):
    """A client's own error (botocore's EndpointConnectionError for an endpoint that does not
    answer is no OSError) names the store and the request; a node's complete copy still
    serves, with a warning."""
    SharedTableCache(SharedCacheConfig(store)).obtain(
        entry_in(tmp_path / "node0"), "described", saver(entry_in(tmp_path / "node0"), []), True
    )
    monkeypatch.setattr(shared_cache, "_listings", {})  # another process: it lists afresh
    cache = SharedTableCache(SharedCacheConfig(store))

    def unreachable(*args, **kwargs):
        raise RuntimeError('Could not connect to the endpoint URL: "http://127.0.0.1:9/"')

    for method in ("ls", "cat_file", "exists", "get_file", "pipe_file", "put_file"):
        monkeypatch.setattr(cache.store.fs, method, unreachable)
    fresh = entry_in(tmp_path / "node1")
    with pytest.raises(SharedCacheError) as raised:
        cache.obtain(fresh, "described", saver(fresh, []), may_build=False)
    assert str(raised.value).startswith(f"{store}: the store could not be asked (list): ")
    assert "RuntimeError: Could not connect to the endpoint URL" in str(raised.value)
    assert not fresh.complete()
    node0 = entry_in(tmp_path / "node0")
    with caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"):
        assert cache.obtain(node0, "described", saver(node0, []), may_build=True) == "loaded"
    assert "this node's copy is used as it is" in caplog.text


def test_a_request_the_store_does_not_answer_is_told_while_it_waits(
    store, tmp_path, monkeypatch, caplog
):
    """An endpoint that takes connections and never answers held a listing silently for the
    client's read timeouts (7 minutes of botocore's retries): every request is told every
    message_seconds, naming the store and the request."""
    cache = SharedTableCache(SharedCacheConfig(store, message_seconds=0.2))

    def unanswered(*args, **kwargs):
        time.sleep(1.2)
        raise TimeoutError("Read timeout on endpoint URL")

    monkeypatch.setattr(shared_cache, "_listings", {})
    monkeypatch.setattr(cache.store.fs, "ls", unanswered)
    entry = entry_in(tmp_path / "node1")
    with (
        caplog.at_level(logging.WARNING, logger="megaindex.shared_cache"),
        pytest.raises(SharedCacheError, match="could not be asked \\(list\\): TimeoutError"),
    ):
        cache.obtain(entry, "described", saver(entry, []), may_build=False)
    assert f"still waiting for {store} to answer a list request, for " in caplog.text


def test_a_builder_that_claims_a_lease_just_released_fetches_what_was_committed(
    store, tmp_path, monkeypatch, caplog
):
    """Two builders (two jobs on one store): B looks for the entry before A commits it, A
    commits and removes its lease, B claims the lease A removed. B fetches A's tables instead
    of building them a second time (it built them: 1 to 3 of 201 entries in a probe)."""
    node0 = entry_in(tmp_path / "node0")
    SharedTableCache(SharedCacheConfig(store)).obtain(node0, "described", saver(node0, []), True)
    monkeypatch.setattr(shared_cache, "_listings", {store: {}})  # B listed before A committed
    builder = SharedTableCache(SharedCacheConfig(store))
    download, looks = builder._download, []

    def looked_before_the_commit(entry, description):
        looks.append(entry.base)
        return False if len(looks) == 1 else download(entry, description)

    monkeypatch.setattr(builder, "_download", looked_before_the_commit)
    calls, node1 = [], entry_in(tmp_path / "node1")
    with caplog.at_level(logging.INFO, logger="megaindex.shared_cache"):
        assert builder.obtain(node1, "described", saver(node1, calls), True) == "loaded"
    assert calls == [] and len(looks) == 2  # fetched after the claim, not built
    assert "committed by another process meanwhile; downloaded, not built" in caplog.text
    assert not fsspec.filesystem("memory").exists(lease_of(store, 1))  # the lease given back


def test_a_node_folder_that_cannot_be_made_names_object_storage_cache_path(
    store, tmp_path, monkeypatch
):
    def refused(path, what):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(shared_cache, "make_folder", refused)  # a folder nobody may write
    entry = CacheEntry(str(tmp_path / "node" / "tables"), "0123-Tables-train", ("a",), store)
    with pytest.raises(CacheError) as raised:
        SharedTableCache(SharedCacheConfig(store)).obtain(
            entry, "described", saver(entry, []), True
        )
    message = str(raised.value)  # a raw PermissionError before
    assert message.startswith(f"cannot write the local copy of the shared index cache {store} ")
    assert "Set object_storage_cache_path (--object-storage-cache-path) to a writable" in message


def test_a_local_store_s_folder_is_made_with_its_first_lease(tmp_path):
    """A file:// store whose folder does not exist yet is made, as a local cache folder is
    (its first lease failed, after 5 s of waiting for another process's)."""
    store = f"file://{tmp_path}/not/yet/store"
    entry = entry_in(tmp_path / "node0")
    cache = SharedTableCache(SharedCacheConfig(store))
    assert cache.obtain(entry, "described", saver(entry, []), may_build=True) == "built"
    assert sorted(os.listdir(tmp_path / "not" / "yet" / "store")) == [
        "0123-Tables-train-a.npy",
        "0123-Tables-train-description.txt",
    ]


def test_a_download_after_the_claim_that_fails_gives_the_lease_back(store, tmp_path, monkeypatch):
    """Left in the store, the lease (never beaten, recording no failure) held off every later
    replacement of the committed entry."""
    node0 = entry_in(tmp_path / "node0")
    SharedTableCache(SharedCacheConfig(store)).obtain(node0, "described", saver(node0, []), True)
    monkeypatch.setattr(shared_cache, "_listings", {store: {}})  # listed before the commit
    builder = SharedTableCache(SharedCacheConfig(store))
    looks = []

    def look_then_fail(entry, description):
        looks.append(entry.base)
        if len(looks) == 1:
            return False  # looked before the other builder committed
        raise ConnectionResetError("the connection was reset mid-download")

    monkeypatch.setattr(builder, "_download", look_then_fail)
    node1 = entry_in(tmp_path / "node1")
    with pytest.raises(ConnectionResetError):
        builder.obtain(node1, "described", saver(node1, []), True)
    assert len(looks) == 2 and not fsspec.filesystem("memory").exists(lease_of(store, 1))


def test_a_local_store_whose_lease_cannot_be_written_fails_at_once(tmp_path, monkeypatch):
    """A local lease is created exclusively: its failure is not another process's lease to
    wait 5 s for (it was, and the message said so twice)."""

    def refused(path, what):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(shared_cache, "make_folder", refused)
    store = f"file://{tmp_path}/store"
    cache = SharedTableCache(SharedCacheConfig(store))
    with pytest.raises(SharedCacheError) as raised:
        cache.store.create("x-lease-1.json", b"{}")
    assert "the lease could not be created or written" in str(raised.value)
    assert "no other process held it" not in str(raised.value)


def test_a_full_disk_under_the_node_folder_during_a_download_names_the_setting(
    store, tmp_path, monkeypatch
):
    """A full disk while a table downloads is the node folder's (it was worded as the store's
    failed download, naming neither the folder's setting nor what to do)."""
    node0 = entry_in(tmp_path / "node0")
    SharedTableCache(SharedCacheConfig(store)).obtain(node0, "described", saver(node0, []), True)

    def full(self, name, local):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shared_cache._Store, "download", full)
    entry = CacheEntry(str(tmp_path / "node1"), "0123-Tables-train", ("a",), store)
    with pytest.raises(CacheError) as raised:
        SharedTableCache(SharedCacheConfig(store)).obtain(
            entry, "described", saver(entry, []), may_build=False
        )
    message = str(raised.value)
    assert message.startswith(f"cannot write the local copy of the shared index cache {store} ")
    assert "The disk is full: free space there, or set object_storage_cache_path" in message
    assert not entry.complete()
