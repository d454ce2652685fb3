"""The preprocess worker pool: workers are forked only from a process with one thread (a child
forked beside other threads can crash in its first moments), else started from a fork server;
a worker that dies ends the run with an error naming the worker, how it ended and the input it
was given, not a bare ``BrokenProcessPool``."""

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
from concurrent.futures.process import BrokenProcessPool

import pytest

from megafmt.preprocess import PreprocessConfig, WorkerDiedError, pool, preprocess

needs_fork = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork here"
)

#: a script that preprocesses with a tokenizer that SIGKILLs its own process on the text "die";
#: the plugin is registered at import, so workers started by a fork server have it too
DYING_RUN = textwrap.dedent(
    """
    import os, signal, sys, threading
    from megafmt.preprocess import PreprocessConfig, WorkerDiedError, preprocess
    from megafmt.preprocess.pool import worker_context
    from megafmt.tokenizers import TOKENIZERS
    from megafmt.tokenizers.simple import BytesTokenizer

    class DyingTokenizer(BytesTokenizer):
        def encode_batch(self, texts):
            if "die" in texts:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().encode_batch(texts)

    TOKENIZERS.register("dying", DyingTokenizer)

    if __name__ == "__main__":
        source, prefix, threaded = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
        stop = threading.Event()
        if threaded:
            threading.Thread(target=stop.wait).start()
        print(worker_context().get_start_method())
        try:
            config = PreprocessConfig(source, prefix, tokenizer_type="dying", workers=2)
            preprocess(config)
        except WorkerDiedError as error:
            print(error)
        finally:
            stop.set()
    """
)


def test_threads_in_process_counts_each_running_thread():
    before = pool.threads_in_process()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert pool.threads_in_process() == before + 1
    finally:
        stop.set()
        thread.join()


@needs_fork
@pytest.mark.parametrize(
    ("more_threads", "python_threads", "method"),
    [
        (0, 1, "fork"),
        (-1, 1, "fork"),
        (1, 1, "forkserver"),
        (30, 1, "forkserver"),
        (0, 2, "forkserver"),
    ],
)
def test_workers_are_forked_only_while_no_thread_was_started(
    monkeypatch, more_threads, python_threads, method
):
    """Native threads beyond those at import, or any thread Python started, mean forkserver."""
    monkeypatch.setattr(pool, "threads_in_process", lambda: pool.THREADS_AT_IMPORT + more_threads)
    monkeypatch.setattr(threading, "active_count", lambda: python_threads)
    assert pool.worker_context().get_start_method() == method


@pytest.mark.parametrize(
    ("exitcode", "words"),
    [
        (-signal.SIGKILL, "was killed by SIGKILL (signal 9): the kernel's out-of-memory killer"),
        (-signal.SIGSEGV, "was killed by SIGSEGV (signal 11): a crash in native code"),
        (-77, "was killed by signal 77"),
        (0, "its start (loading the tokenizer) failed"),
        (3, "exited with status 3"),
        (None, "is still running"),
    ],
)
def test_an_exit_is_described_by_its_status_or_signal(exitcode, words):
    assert words in pool.describe_exit(exitcode)


def test_the_error_is_a_broken_process_pool_and_a_megafmt_error():
    from megafmt.errors import MegafmtError

    assert issubclass(WorkerDiedError, BrokenProcessPool)
    assert issubclass(WorkerDiedError, MegafmtError)


@needs_fork
@pytest.mark.parametrize(("threaded", "method"), [(False, "fork"), (True, "forkserver")])
def test_a_worker_killed_mid_run_is_named_with_its_signal_and_input(tmp_path, threaded, method):
    script = tmp_path / "dying_run.py"
    script.write_text(DYING_RUN)
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "fine"}\n{"text": "die"}\n{"text": "fine again"}\n')
    prefix = tmp_path / "out" / "o"
    run = subprocess.run(
        [sys.executable, str(script), str(source), str(prefix), "1" if threaded else "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    chosen, message = run.stdout.strip().splitlines()
    assert chosen == method
    assert message.startswith(f"a preprocess worker ended while encoding {source} from line 1: ")
    assert "was killed by SIGKILL (signal 9): the kernel's out-of-memory killer" in message
    if method == "fork":  # both workers start at once: one died, the pool stopped the other
        assert message.endswith("(the pool then stopped the other 1)")
    assert not prefix.parent.exists() or os.listdir(prefix.parent) == []  # nothing left


def test_a_run_from_a_threaded_process_writes_the_bytes_of_a_forked_run(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"text": "line {i} of the corpus"}}\n' for i in range(3000)))
    outputs = {}
    for threaded in (False, True):
        prefix = tmp_path / str(threaded) / "o"
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        if threaded:
            thread.start()
        try:
            preprocess(PreprocessConfig(str(source), str(prefix), workers=2, chunk_bytes=4096))
        finally:
            stop.set()
            if threaded:
                thread.join()
        outputs[threaded] = [
            (tmp_path / str(threaded) / f"o_text_document{suffix}").read_bytes()
            for suffix in (".bin", ".idx")
        ]
    assert outputs[False] == outputs[True]


def test_a_start_method_this_platform_lacks_is_refused(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a"}\n')
    config = PreprocessConfig(str(source), str(tmp_path / "o"), start_method="vfork")
    with pytest.raises(ValueError, match="start_method must be one of .*found 'vfork'"):
        preprocess(config)


#: a tokenizer whose loading starts a thread (as a library's self-check does) and which kills
#: its worker unless the worker was forked from the process named by $MEGA_TEST_CALLER
THREADED_TOKENIZER = textwrap.dedent(
    """
    import os, signal, sys, threading
    from megafmt.tokenizers import TOKENIZERS
    from megafmt.tokenizers.simple import BytesTokenizer

    class ThreadedTokenizer(BytesTokenizer):
        @classmethod
        def from_options(cls, options):
            threading.Thread(target=threading.Event().wait, daemon=True).start()
            return cls()

        def encode_batch(self, texts):
            if os.getppid() != int(os.environ["MEGA_TEST_CALLER"]):  # not forked from it
                os.kill(os.getpid(), signal.SIGKILL)
            return super().encode_batch(texts)

    TOKENIZERS.register("threaded", ThreadedTokenizer)
    """
)

#: ``mega preprocess`` with that tokenizer
THREADED_TOKENIZER_RUN = THREADED_TOKENIZER + textwrap.dedent(
    """
    from megafmt.cli.main import main

    if __name__ == "__main__":
        os.environ["MEGA_TEST_CALLER"] = str(os.getpid())
        sys.exit(main(["preprocess", *sys.argv[1:]]))
    """
)


def threaded_script(tmp_path, text: str):
    """``text`` written as a script, and the two-line input it preprocesses."""
    script = tmp_path / "threaded_run.py"
    script.write_text(text)
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "one"}\n{"text": "two"}\n')
    return script, source


def run_successfully(script, *arguments) -> None:
    """Run ``script`` with ``arguments`` in a fresh interpreter; it must exit 0."""
    command = [sys.executable, str(script), *(str(a) for a in arguments)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


@needs_fork
def test_mega_preprocess_forks_though_its_tokenizer_started_threads(tmp_path):
    script, source = threaded_script(tmp_path, THREADED_TOKENIZER_RUN)
    prefix = tmp_path / "out" / "o"
    flags = ["--input", str(source), "--output-prefix", str(prefix), "--tokenizer-type", "threaded"]
    run_successfully(script, *flags, "--workers", "2")
    tokens = (tmp_path / "out" / "o_text_document.bin").read_bytes()  # uint16 byte ids
    assert tokens.decode("utf-16-le") == "onetwo"


@needs_fork
def test_pyarrow_s_allocator_thread_does_not_turn_fork_into_forkserver():
    """A run imports pyarrow before its workers fork (the block path's reader), which starts
    jemalloc's background thread; jemalloc handles fork, so the next run still forks."""
    pytest.importorskip("pyarrow")
    script = textwrap.dedent(
        """
        from megafmt.preprocess.pool import THREADS_AT_IMPORT, threads_in_process, worker_context
        import pyarrow.json
        print(worker_context().get_start_method(), threads_in_process() - THREADS_AT_IMPORT)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.split() == ["fork", "0"]


#: a script without a ``__main__`` guard (as Megatron's tool needs none) that preprocesses twice
#: with that tokenizer: its second run must fork as its first did (a fork server would import
#: the script again, and the tokenizer kills a worker not forked from the script)
TWO_RUNS_UNGUARDED = THREADED_TOKENIZER + textwrap.dedent(
    """
    from megafmt.preprocess import PreprocessConfig, preprocess

    os.environ["MEGA_TEST_CALLER"] = str(os.getpid())
    source, out = sys.argv[1:]
    for name in ("first", "second"):
        config = PreprocessConfig(source, f"{out}/{name}", tokenizer_type="threaded", workers=2)
        preprocess(config)
    """
)


@needs_fork
def test_a_script_s_second_run_forks_beside_the_threads_its_first_run_left(tmp_path):
    script, source = threaded_script(tmp_path, TWO_RUNS_UNGUARDED)
    run_successfully(script, source, tmp_path / "out")
    for name in ("first", "second"):
        tokens = (tmp_path / "out" / f"{name}_text_document.bin").read_bytes()
        assert tokens.decode("utf-16-le") == "onetwo"


def test_a_broken_pool_names_the_chunks_it_had_not_encoded():
    import collections
    from concurrent.futures import Future

    from megafmt.preprocess.pipeline import _in_flight

    def future(state):
        made = Future()
        if state == "done":
            made.set_result(None)
        elif state == "broken":
            made.set_exception(BrokenProcessPool("terminated"))
        else:
            made.cancel()
        return made

    chunks = [
        ("done", "a from line 1"),
        ("broken", "a from line 9"),
        ("cancelled", "b from line 1"),
    ]
    window = collections.deque((future(state), where) for state, where in chunks)
    assert _in_flight(window) == "one of 2 chunks (a from line 9 to b from line 1)"
    window.pop()
    assert _in_flight(window) == "a from line 9"  # the one it had not encoded
