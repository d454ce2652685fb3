"""What killed runs leave (``*.partial`` files, trial folders) is cleared by the next run of
the same output, and temporary names never overflow the file system's name limit when the
requested name fits. A run is killed for real (SIGKILL, mid-input) as well as simulated (a
leftover named after a process that no longer exists)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from megafmt import atomic
from megafmt.atomic import (
    DEFAULT_NAME_MAX,
    PARTIAL_SUFFIX,
    atomic_write,
    partial_path,
    remove_stale_partials,
    write_atomically,
)
from megafmt.builder import IndexedDatasetBuilder
from megafmt.cli.main import main
from megafmt.preprocess import PreprocessConfig
from megafmt.preprocess.tuning import TRIALS_SUFFIX, preprocess_with_best_workers

#: seconds a killed-run test waits for the run to reach the stage it is killed at
STAGE_WAIT_SECONDS = 60.0


def dead_pid() -> int:
    """The id of a process that has exited."""
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(finished.stdout)


def leftover(path: str, folder: bool = False) -> Path:
    """A temporary name of ``path`` as a killed writer would have left it."""
    name = partial_path(path).replace(f".{os.getpid()}-", f".{dead_pid()}-")
    target = Path(name)
    if folder:
        target.mkdir()
        (target / "trial-16_text_document.bin").write_bytes(b"x")
    else:
        target.write_bytes(b"half")
    return target


@pytest.mark.parametrize("length", [200, 240, DEFAULT_NAME_MAX - len(".bin")])
@pytest.mark.parametrize("letter", [b"n", b"\xe9"], ids=["ascii", "not-utf8"])
def test_temporary_names_fit_where_the_name_fits(tmp_path, length, letter):
    name = os.fsdecode(letter * length)  # a byte that is not UTF-8 is surrogate-escaped
    path = str(tmp_path / name)
    assert len(os.fsencode(os.path.basename(partial_path(path)))) <= DEFAULT_NAME_MAX
    with atomic_write(path) as stream:
        stream.write(b"x")
    assert Path(path).read_bytes() == b"x"
    builder = IndexedDatasetBuilder(path + ".bin")
    builder.add_document([1, 2, 3], [3])
    builder.finalize(path + ".idx")
    assert sorted(os.listdir(tmp_path)) == sorted([name, name + ".bin", name + ".idx"])


def test_a_write_of_bytes_that_fails_midway_leaves_the_old_file_and_no_partial(
    tmp_path, monkeypatch
):
    path = tmp_path / "table.npy"
    path.write_bytes(b"old")
    real_write = os.write
    written = []

    def full_disk(descriptor, data):
        if written:
            raise OSError(28, "No space left on device")
        written.append(len(data))
        return real_write(descriptor, bytes(data)[:3])  # a short write: the rest is retried

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_atomically(str(path), b"new contents")
    monkeypatch.undo()
    assert written == [len(b"new contents")]
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["table.npy"]
    write_atomically(str(path), memoryview(b"new contents"))
    assert path.read_bytes() == b"new contents"


def test_leftovers_of_a_long_name_are_found_and_removed(tmp_path):
    path = str(tmp_path / ("n" * 250))
    stale = leftover(path)
    assert remove_stale_partials(path) == [str(stale)] and not stale.exists()
    mine = partial_path(path)
    Path(mine).write_bytes(b"")
    assert remove_stale_partials(path) == [] and Path(mine).exists()  # a live writer's stays


def test_a_later_run_clears_trial_folders_and_partials_of_killed_runs(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "hello"}\n' * 50)
    prefix = str(tmp_path / "out" / "o")
    os.makedirs(tmp_path / "out")
    stale = [
        leftover(prefix + TRIALS_SUFFIX, folder=True),
        leftover(prefix + "_text_document.bin"),
        leftover(prefix + "_text_document.idx"),
    ]
    config = PreprocessConfig(input=str(source), output_prefix=prefix, workers=1)
    preprocess_with_best_workers(config, [1, 2], max_documents=10, stream=io.StringIO())
    assert sorted(os.listdir(tmp_path / "out")) == [
        ".mega",
        "o_text_document.bin",
        "o_text_document.idx",
    ]
    assert not any(path.exists() for path in stale)


def test_a_later_merge_clears_partials_of_a_killed_merge(make_corpus, tmp_path, capsys):
    prefix = make_corpus([[[1, 2]], [[3]]])
    out = str(tmp_path / "merged")
    stale = leftover(out + ".bin")
    assert main(["merge", out, prefix]) == 0
    assert not stale.exists()
    assert not list(tmp_path.glob(f"*{PARTIAL_SUFFIX}"))


@contextlib.contextmanager
def preprocess_mid_input(tmp_path, workers: int) -> Iterator[tuple[subprocess.Popen, Path]]:
    """A ``mega preprocess`` run (in a session of its own) reading from a pipe held open: it
    has its partial files open in ``<tmp_path>/out``, waiting for more input, while the block
    runs; it is killed afterwards if the block left it running. Yields the run and its output
    folder."""
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "megafmt.cli.main", "preprocess", "--input", str(fifo)]
    run = subprocess.Popen(
        [*command, "--output-prefix", str(out / "o"), "--workers", str(workers)],
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with open(fifo, "w") as writer:  # opens once the run opens the pipe
            writer.write('{"text": "hello"}\n' * 10)
            writer.flush()
            deadline = time.monotonic() + STAGE_WAIT_SECONDS
            while not list(out.glob(f"*{PARTIAL_SUFFIX}")) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert list(out.glob(f"*{PARTIAL_SUFFIX}")), "the run never started writing"
            yield run, out
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=STAGE_WAIT_SECONDS)
        os.remove(fifo)


def test_a_preprocess_killed_mid_input_leaves_only_what_the_next_run_clears(tmp_path):
    """Killed while it has its partial files open; the next run with the same output removes
    them."""
    with preprocess_mid_input(tmp_path, workers=1) as (run, out):
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate(timeout=STAGE_WAIT_SECONDS)
    left = list(out.glob(f"*{PARTIAL_SUFFIX}"))
    assert left and not list(out.glob("*.idx"))  # nothing that looks complete
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "hello"}\n')
    assert main(["preprocess", "--input", str(source), "--output-prefix", str(out / "o")]) == 0
    assert not any(path.exists() for path in left)
    assert sorted(os.listdir(out)) == [".mega", "o_text_document.bin", "o_text_document.idx"]


@pytest.mark.parametrize("group", [True, False], ids=["its process group", "the run alone"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_preprocess_terminated_mid_input_removes_its_partial_files(tmp_path, workers, group):
    """SIGTERM to the run's process group (a scheduler's time limit), or to the run alone
    (``kill``), stops it as Ctrl-C does: exit status 143, its partial files removed (Python's
    default ended it where it stood, and they stayed until the next run of the same output)."""
    with preprocess_mid_input(tmp_path, workers) as (run, out):
        (os.killpg if group else os.kill)(run.pid, signal.SIGTERM)
        _, stderr = run.communicate(timeout=STAGE_WAIT_SECONDS)
    assert run.returncode == 143, stderr
    assert "mega preprocess: terminated (SIGTERM)" in stderr
    assert not list(out.glob(f"*{PARTIAL_SUFFIX}")) and not list(out.glob("*.idx"))


def test_leftovers_of_several_paths_are_found_with_one_listing_of_their_folder(
    tmp_path, monkeypatch
):
    dead = 2**22 + 54321  # beyond pid_max: a writer that no longer runs
    live = os.getpid()
    paths = [str(tmp_path / f"entry-{table}.npy") for table in ("a", "b")]
    stale = [f"{path}.{dead}-0badf00d{PARTIAL_SUFFIX}" for path in paths]
    running = f"{paths[0]}.{live}-0badf00d{PARTIAL_SUFFIX}"
    unrelated = str(tmp_path / f"other.npy.{dead}-0badf00d{PARTIAL_SUFFIX}")
    for path in [*stale, running, unrelated]:
        Path(path).write_bytes(b"half")
    listings = []
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda folder: listings.append(folder) or listdir(folder))
    assert sorted(remove_stale_partials(*paths)) == sorted(stale)
    assert listings == [str(tmp_path)]
    assert os.path.exists(running) and os.path.exists(unrelated)


def test_leftovers_of_writers_on_other_machines_are_left_to_them(tmp_path):
    """A pid names a process on its own machine (and PID namespace) only: a temporary name
    written elsewhere on a shared file system is never judged by this machine's processes;
    one of a release that named no machine is judged by its pid, as it was."""
    dead = 2**22 + 54321  # beyond pid_max: no process here
    path = str(tmp_path / "entry-a.npy")
    mine = partial_path(path).replace(f".{os.getpid()}-", f".{dead}-")
    where = mine[-len(PARTIAL_SUFFIX) - 8 : -len(PARTIAL_SUFFIX)]
    elsewhere = mine.replace(f"-{where}{PARTIAL_SUFFIX}", f"-{'0' * 8}{PARTIAL_SUFFIX}")
    if elsewhere == mine:
        elsewhere = mine.replace(f"-{where}{PARTIAL_SUFFIX}", f"-{'1' * 8}{PARTIAL_SUFFIX}")
    legacy = f"{path}.{dead}-0badf00d{PARTIAL_SUFFIX}"
    for name in (mine, elsewhere, legacy):
        Path(name).write_bytes(b"half")
    assert sorted(remove_stale_partials(path)) == sorted([mine, legacy])
    assert os.path.exists(elsewhere)
    # a day later it is removed: a container restarted under another name never comes back
    day_ago = time.time() - atomic.FOREIGN_LEFTOVER_SECONDS - 60
    os.utime(elsewhere, (day_ago, day_ago))
    assert remove_stale_partials(path) == [elsewhere]


def test_a_long_name_s_leftover_of_a_release_before_the_machine_was_named_is_removed(tmp_path):
    """Its stem was cut at another length: both cuts are looked for."""
    dead = 2**22 + 54321
    path = str(tmp_path / ("n" * (DEFAULT_NAME_MAX - len(".bin")) + ".bin"))
    stem = atomic._partial_stem(path, atomic.LEGACY_PARTIAL_EXTRA)
    legacy = f"{stem}.{dead}-0badf00d{PARTIAL_SUFFIX}"
    Path(legacy).write_bytes(b"half")
    assert remove_stale_partials(path) == [legacy]


def test_temporary_names_differ_call_by_call_and_between_processes(tmp_path):
    """Each call its own name (counted from a random start), a process of its own its own
    start: no two writers, nor a writer and a killed run's leftover, share a name."""
    import re

    path = str(tmp_path / "table.npy")
    names = [partial_path(path) for _ in range(1000)]
    assert len(set(names)) == len(names)
    shape = re.compile(
        re.escape(f"{path}.{os.getpid()}-") + r"[0-9a-f]{8}-[0-9a-f]{8}" + PARTIAL_SUFFIX
    )
    assert all(shape.fullmatch(name) for name in names)  # the names the next run clears
    code = "from megafmt.atomic import partial_path; print(partial_path('x'))"
    others = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
        for _ in range(3)
    ]
    assert len({name.split("-")[1] for name in others}) == 3  # three random starts
