"""Limits of the machine met by a run: a full disk (a small tmpfs where one can be mounted, the
file-size limit RLIMIT_FSIZE everywhere), the open-files limit (RLIMIT_NOFILE) and the
address-space limit (RLIMIT_AS). Each error names the files being written or the limit and its
value, and leaves no ``*.partial`` file and no output that looks complete."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys

import pytest

from megafmt import limits
from megafmt.cli.main import main
from megafmt.limits import limit_hint, naming_full_disk

#: seconds a command under a limit may take (it fails early)
RUN_SECONDS = 120


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    """About 300 KB of text: more than the small disk and the file-size limit hold."""
    path = tmp_path_factory.mktemp("limits") / "in.jsonl"
    rng = random.Random(30)
    with open(path, "w") as stream:
        for _ in range(1000):
            words = (rng.choice(["alpha", "beta", "gamma"]) for _ in range(50))
            stream.write(json.dumps({"text": " ".join(words)}) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(jsonl, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("corpus") / "c")
    assert main(["preprocess", "--input", str(jsonl), "--output-prefix", prefix]) == 0
    return prefix + "_text_document"


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (needs the right to mount: root in a container); skipped elsewhere, where
    the RLIMIT_FSIZE test covers the same paths."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def commands(jsonl, corpus, out):
    return {
        "preprocess": ["preprocess", "--input", str(jsonl), "--output-prefix", str(out / "o")],
        "merge": ["merge", str(out / "m"), corpus, corpus],
    }


@pytest.mark.parametrize("command", ["preprocess", "merge"])
def test_a_full_disk_names_the_output_and_leaves_nothing(
    jsonl, corpus, small_disk, capsys, command
):
    status = main(commands(jsonl, corpus, small_disk)[command])
    err = capsys.readouterr().err
    assert status == 1
    assert "No space left on device (writing " in err and str(small_disk) in err
    assert sorted(os.listdir(small_disk)) in ([], [".mega"])  # no .partial, no pair


def run_limited(limit: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``mega argv`` run in a child process whose resource ``limit`` (the arguments of
    ``resource.setrlimit``, as source) is set before the command starts."""
    script = (
        "import resource, sys; from megafmt.cli.main import main; "
        f"resource.setrlimit(resource.{limit}); sys.exit(main({argv!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=RUN_SECONDS
    )


@pytest.mark.parametrize("command", ["preprocess", "merge"])
def test_the_file_size_limit_is_named_and_leaves_nothing(jsonl, corpus, tmp_path, command):
    out = tmp_path / "out"
    out.mkdir()
    run = run_limited(
        "RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY)", commands(jsonl, corpus, out)[command]
    )
    assert run.returncode == 1, run.stderr
    assert "File too large" in run.stderr and "RLIMIT_FSIZE: 65,536 bytes" in run.stderr
    assert "Traceback" not in run.stderr
    assert sorted(os.listdir(out)) in ([], [".mega"])


def test_the_open_files_limit_is_named(jsonl, tmp_path):
    argv = ["preprocess", "--input", str(jsonl), "--output-prefix", str(tmp_path / "o")]
    run = run_limited("RLIMIT_NOFILE, (16, 16)", [*argv, "--workers", "8"])
    assert run.returncode == 1, run.stderr
    assert "RLIMIT_NOFILE: 16 files" in run.stderr and "fewer --workers" in run.stderr
    assert "Traceback" not in run.stderr
    assert not [name for name in os.listdir(tmp_path) if name.startswith("o")]


def test_the_address_space_limit_is_named(monkeypatch, capsys, tmp_path):
    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr("megafmt.cli.preprocess.preprocess", exhausted)
    monkeypatch.setattr(limits.resource, "getrlimit", lambda which: (1 << 30, 1 << 31))
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a"}\n')
    assert main(["preprocess", "--input", str(source), "--output-prefix", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "MemoryError" in err and "RLIMIT_AS: 1,073,741,824 bytes" in err


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (errno.EMFILE, "the open-files limit was reached"),
        (errno.ENFILE, "the system's open-files table was reached"),
        (errno.ENOSPC, "the disk (or the user's quota) is full"),
        (errno.EDQUOT, "the disk (or the user's quota) is full"),
        (errno.ENOMEM, "RLIMIT_AS"),
        (errno.EFBIG, "RLIMIT_FSIZE"),
        (errno.ENOENT, ""),
    ],
)
def test_limit_hints(monkeypatch, code, said):
    monkeypatch.setattr(limits.resource, "getrlimit", lambda which: (100, 200))
    hint = limit_hint(OSError(code, os.strerror(code)))
    assert said in hint if said else hint == ""


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENOMEM])
def test_a_limit_hint_advises_fewer_workers_only_where_the_caller_has_them(monkeypatch, code):
    monkeypatch.setattr(limits.resource, "getrlimit", lambda which: (100, 200))
    error = OSError(code, os.strerror(code))
    assert limit_hint(error).endswith("raise it, or use fewer --workers")
    assert limit_hint(error, fewer=None).endswith("raise it")


def test_naming_full_disk_keeps_errors_that_name_a_file():
    with pytest.raises(OSError) as caught, naming_full_disk("out.bin"):
        raise OSError(errno.ENOSPC, "No space left on device", "named.bin")
    assert caught.value.filename == "named.bin" and "out.bin" not in str(caught.value)
    written = pytest.raises(OSError, match=r"\(writing out.bin, out.idx\)")
    with written as caught, naming_full_disk("out.bin", "out.idx"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert caught.value.errno == errno.ENOSPC


def test_soft_limit_is_the_soft_value_or_none_when_unlimited():
    script = (
        "import resource; from megafmt.limits import soft_limit; "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY)); "
        "small = soft_limit('RLIMIT_FSIZE'); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2); "
        "print(small, soft_limit('RLIMIT_FSIZE'))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=RUN_SECONDS
    )
    assert run.stdout.split() == ["65536", "None"], run.stderr
