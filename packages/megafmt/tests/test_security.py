"""Credentials never reach a message, local paths made from URLs stay in their folder, caches
are never unpickled, and atomic writes neither follow planted links nor ignore the umask."""

import json
import logging
import os
import traceback

import numpy
import pytest

from megafmt import IndexedDatasetBuilder
from megafmt.atomic import atomic_write, write_atomically
from megafmt.cli.main import main
from megafmt.confinement import confined_path, url_components
from megafmt.errors import MissingFileError, ReadError, UnsafePathError
from megafmt.redaction import redact
from megafmt.remote import cached_index
from megafmt.retry import RetryPolicy
from megafmt.sft.lines import JsonlLineIndex
from megafmt.testing import write_corpus

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"
KEY_ID = "AKIAIOSFODNN7FAKE"
SECRET_URLS = [
    f"s3://{KEY_ID}:{SECRET}@corpora/c",
    f"https://b.s3.amazonaws.com/c.bin?X-Amz-Credential={KEY_ID}%2F1&X-Amz-Signature={SECRET}",
    f"https://b.s3.amazonaws.com/c.bin?AWSAccessKeyId={KEY_ID}&Signature={SECRET}&Expires=9",
    f"az://container/c.bin?sv=2020-08-04&sig={SECRET}&token={SECRET}",
]


def assert_no_secret(text):
    assert SECRET not in text and KEY_ID not in text
    assert "***" in text


@pytest.mark.parametrize("url", SECRET_URLS)
def test_redact_masks_credentials_in_urls_and_keeps_the_rest(url):
    shown = redact(f"{url}: not found")
    assert_no_secret(shown)
    assert shown.endswith(": not found") and shown.split("://")[0] == url.split("://")[0]


def test_redact_masks_user_info_a_storage_library_quotes_without_the_scheme():
    shown = redact(f'Invalid bucket name "{KEY_ID}:{SECRET}@corpora": must match')
    assert shown == 'Invalid bucket name "***@corpora": must match'


def test_redact_masks_known_secret_settings():
    text = (
        f"options {{'secret': '{SECRET}', \"token\": \"{SECRET}\"}} aws_secret_access_key={SECRET}"
    )
    shown = redact(text)
    assert SECRET not in shown
    assert shown == "options {'secret': '***', \"token\": \"***\"} aws_secret_access_key=***"


@pytest.mark.parametrize(
    "text", ["s3://bucket/a@b/c.bin?versionId=3: 5 bytes", "memory://x/y", "eod token: 3"]
)
def test_redact_leaves_text_without_credentials_alone(text):
    assert redact(text) == text


@pytest.mark.parametrize("error_type", [MissingFileError, ReadError, UnsafePathError])
def test_errors_and_their_tracebacks_mask_credentials(error_type):
    error = error_type(f"{SECRET_URLS[0]}.bin: not found")
    assert_no_secret(str(error))
    assert_no_secret("".join(traceback.format_exception_only(error)))


def test_retry_log_lines_and_the_final_error_mask_credentials(caplog, monkeypatch):
    monkeypatch.setattr("megafmt.retry.time.sleep", lambda seconds: None)
    url = SECRET_URLS[1]

    def fails():
        raise ConnectionError(f"connection reset while reading {url}")

    with caplog.at_level(logging.WARNING), pytest.raises(ReadError) as raised:
        RetryPolicy(retries=2).call(f"{url} bytes 0-8", fails)
    assert "retry 1 of 2" in caplog.text
    assert_no_secret(caplog.text)
    assert_no_secret(str(raised.value))


def test_cli_errors_and_json_output_mask_credentials(tmp_path, capsys):
    missing = f"{tmp_path}/none?token={SECRET}"
    assert main(["info", missing]) == 1
    err = capsys.readouterr().err
    assert "mega info: error:" in err and "token=***" in err and SECRET not in err
    from megafmt.cli.command import print_json

    print_json({"corpus": SECRET_URLS[0], "options": {"secret": SECRET}})
    out = capsys.readouterr().out
    assert SECRET not in out and KEY_ID not in out
    assert json.loads(out)["corpus"] == "s3://***@corpora/c"


def test_mega_info_and_verify_output_mask_credentials(tmp_path, capsys):
    folder = tmp_path / f"token={SECRET.replace('/', '')}"
    folder.mkdir()
    prefix = write_corpus(str(folder / "c"), documents=5)
    for command in (["info", prefix], ["info", prefix, "--json"], ["verify", prefix]):
        assert main(command) == 0
        out = capsys.readouterr().out
        assert "token=***" in out and SECRET.replace("/", "") not in out


def test_url_components_drop_user_info_and_query():
    assert url_components(SECRET_URLS[0] + "/x.idx?token=1") == ["s3", "corpora", "c", "x.idx"]


@pytest.mark.parametrize(
    "url", ["s3://corpora/a/../../../outside/c.idx", "s3://corpora/./c.idx", "s3://../c.idx"]
)
def test_url_keys_with_dot_components_are_refused(url):
    with pytest.raises(UnsafePathError, match=r"would make a local copy leave its cache folder"):
        url_components(url)


@pytest.mark.parametrize("component", ["/etc/passwd", "a/../../x", ".."])
def test_confined_path_refuses_absolute_and_parent_components(tmp_path, component):
    with pytest.raises(UnsafePathError, match=r"absolute or holds '\.\.'"):
        confined_path(str(tmp_path), "ok", component)
    assert confined_path(str(tmp_path), "a", "b.idx") == str(tmp_path / "a" / "b.idx")


def test_the_idx_copy_of_a_key_with_dots_is_refused_before_any_write(tmp_path):
    cache = tmp_path / "cache" / "idx"
    with pytest.raises(UnsafePathError, match=r"'\.\.'"):
        cached_index("memory://corpora/c/../../../escape.idx", str(cache))
    assert not (tmp_path / "escape.idx").exists() and not cache.exists()


def test_the_source_note_of_an_idx_copy_holds_no_credentials(tmp_path):
    import fsspec

    url = f"memory://note-corpora/c.idx?token={SECRET}"  # the memory store keeps the query
    with fsspec.open(url, "wb") as stream:
        stream.write(b"index bytes")
    local = cached_index(url, str(tmp_path))
    assert os.path.dirname(local) == str(tmp_path) and local.endswith("-c.idx")
    with open(local + ".source.json") as stream:
        assert SECRET not in stream.read()


@pytest.fixture
def victim(tmp_path):
    """A file another user wants overwritten, and a link to it planted at ``victim.link``."""
    path = tmp_path / "victim"
    path.write_bytes(b"precious")
    (tmp_path / "victim.link").symlink_to(path)
    return path


def write_by_stream(path, data):
    with atomic_write(path) as stream:
        stream.write(data)


# the two ways of writing a file atomically: a stream, and bytes in hand by the descriptor
ATOMIC_WRITERS = [write_by_stream, write_atomically]


@pytest.mark.parametrize("write", ATOMIC_WRITERS)
def test_an_atomic_write_replaces_a_link_planted_at_the_destination(tmp_path, victim, write):
    destination = tmp_path / "victim.link"
    write(str(destination), b"new")
    assert victim.read_bytes() == b"precious"
    assert not destination.is_symlink() and destination.read_bytes() == b"new"


@pytest.mark.parametrize("write", ATOMIC_WRITERS)
def test_an_atomic_write_refuses_a_link_planted_at_its_temporary_name(
    tmp_path, victim, monkeypatch, write
):
    monkeypatch.setattr("megafmt.atomic.partial_path", lambda path: str(tmp_path / "victim.link"))
    with pytest.raises(FileExistsError):
        write(str(tmp_path / "table.npy"), b"new")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "table.npy").exists()


def test_a_corpus_writer_refuses_a_link_planted_at_its_temporary_name(
    tmp_path, victim, monkeypatch
):
    monkeypatch.setattr("megafmt.builder.partial_path", lambda path: str(tmp_path / "victim.link"))
    with pytest.raises(FileExistsError):
        IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=numpy.uint16)
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("write", ATOMIC_WRITERS)
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_an_atomic_write_gives_the_permissions_the_umask_allows(tmp_path, umask, write):
    previous = os.umask(umask)
    try:
        write(str(tmp_path / "f"), b"x")
    finally:
        os.umask(previous)
    assert os.stat(tmp_path / "f").st_mode & 0o777 == 0o666 & ~umask


class Planted:
    """Unpickling this makes the folder ``sign``: the mark that a cache was unpickled."""

    def __init__(self, sign):
        self.sign = sign

    def __reduce__(self):
        return (os.mkdir, (self.sign,))


def test_a_cached_line_index_holding_pickled_objects_is_rebuilt_never_unpickled(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n' * 3)
    index = JsonlLineIndex(str(path))
    planted = numpy.array([Planted(str(tmp_path / "unpickled"))], dtype=object)
    with open(index.index_path, "wb") as stream:
        numpy.savez(stream, starts=planted, ends=planted, lines=planted, meta=planted)
    again = JsonlLineIndex(str(path))
    assert not (tmp_path / "unpickled").exists()
    assert len(again) == 3 and again.starts.dtype != object
