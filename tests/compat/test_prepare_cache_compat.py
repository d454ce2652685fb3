"""``mega index build`` with tools/prepare_cache.py's flags against the seed commit's tool: the
same cache files (names and bytes), each side hitting the other's cache, and the dataset log
records Megatron writes (build and hit) written alike, through Megatron's logger names."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

import pytest

from megafmt.cli.main import main
from megafmt.testing import write_corpus

sys.path.insert(0, str(Path(__file__).parent / "seedside"))
from seed_names import dataset_log_records  # (seedside/ is put on the path first)

# --rampup-batch-size warns on every run; the build checks it once
pytestmark = [pytest.mark.compat, pytest.mark.filterwarnings("ignore:--rampup-batch-size")]


@pytest.fixture(scope="module")
def seed(shared_seed):
    return shared_seed


VOCAB = 1000
#: a training job's model and training flags: those Megatron-LM's argument validation requires
#: of any job, and others a job's command line has; none shapes the cache
MODEL_FLAGS = [
    "--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2",
    "--max-position-embeddings", "32", "--ffn-hidden-size", "16", "--swiglu",
    "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
    "--lr", "0.0001", "--min-lr", "1e-05", "--weight-decay", "0.1", "--clip-grad", "1.0",
    "--log-interval", "5", "--save-interval", "1000", "--use-mcore-models",
]  # fmt: skip
#: prepare_cache.py's flags ``mega index build`` leaves unrecognised: the tool refuses them, or
#: validation rejects them (deprecated), or they change the data (an argparse error, never
#: a silent difference)
REFUSED_FLAGS = {
    "--encoder-seq-length", "--decoder-seq-length", "--batch-size", "--model-parallel-size",
    "--fim-data", "--sft", "--yaml-cfg",
}  # fmt: skip
#: megaindex's own notes beside the cache (not a Megatron file)
OUR_SIDECAR = "-megaindex.json"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("corpora")
    return [
        write_corpus(str(directory / name), documents, seed=n, vocab=VOCAB - 1, eod=VOCAB - 1)
        for n, (name, documents) in enumerate((("web", 160), ("code", 70)))
    ]


def data_flags(corpora: list[str], cache: Path, variant: list[str]) -> list[str]:
    return [
        "--data-path", "0.7", corpora[0], "0.3", corpora[1], "--split", "90,8,2",
        "--seq-length", "32", "--seed", "77", "--micro-batch-size", "2",
        "--train-iters", "20", "--eval-interval", "10", "--eval-iters", "2",
        "--data-cache-path", str(cache), *variant,
    ]  # fmt: skip


def mega_index_build(flags: list[str], tokenizer: list[str]) -> list[tuple[str, str, str]]:
    """Run ``mega index build``; the records of Megatron's two dataset loggers."""
    records, code = dataset_log_records(lambda: main(["index", "build", *flags, *tokenizer]))
    assert code == 0
    return records


def cache_files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.endswith(OUR_SIDECAR)
    }


def tokenizer_flags(cache: Path) -> list[str]:
    """Our tokenizer identity flags for the seed's NullTokenizer, read from the description
    the seed wrote (the identity enters the cache key)."""
    description = json.loads(next(cache.glob("*-GPTDataset-train-description.txt")).read_text())
    return [
        "--tokenizer-identifiers", json.dumps(description["tokenizer"]),
        "--eod", str(VOCAB - 1), "--vocab-size", str(VOCAB),
    ]  # fmt: skip


#: the world size sets the data-parallel size, and with it the default global batch size
#: (micro batch x data-parallel size = 8); rampup is taken and ignored (deprecated there)
VARIANT = ["--prepare-cache-world-size", "4", "--rampup-batch-size", "2", "2", "40"]


def test_mega_index_build_takes_prepare_cache_s_flags(
    seed, corpora: list[str], tmp_path: Path
) -> None:
    variant = VARIANT
    theirs, ours = tmp_path / "seed-cache", tmp_path / "our-cache"
    seed_flags = [*data_flags(corpora, theirs, variant), *MODEL_FLAGS]
    seed_flags += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB)]
    seed_built, summary = seed.call("seed_names:prepare_cache", seed_flags)
    assert summary["global_batch_size"] == 8 and summary["data_parallel_size"] == 4
    tokenizer = tokenizer_flags(theirs)
    with pytest.warns(DeprecationWarning, match="rampup"):  # the tool's whole command line
        our_built = mega_index_build([*data_flags(corpora, ours, variant), *MODEL_FLAGS], tokenizer)
    # the same files, byte for byte
    assert cache_files(ours) == cache_files(theirs)
    # the same records for the build, and for a hit on each side's own cache
    assert our_built == seed_built
    assert any("Build and save" in message for _, _, message in our_built)
    seed_hit, _ = seed.call("seed_names:prepare_cache", seed_flags)
    assert not any("Build and save" in message for _, _, message in seed_hit)
    our_hit = mega_index_build(data_flags(corpora, ours, variant), tokenizer)
    assert our_hit == [(n, level, m.replace(str(theirs), str(ours))) for n, level, m in seed_hit]
    # each side hits the other's cache, rewriting nothing
    before = {p: p.stat().st_mtime_ns for p in theirs.iterdir()}
    assert mega_index_build(data_flags(corpora, theirs, variant), tokenizer) == seed_hit
    assert {p: p.stat().st_mtime_ns for p in theirs.iterdir()} == before
    seed_flags_ours = [*data_flags(corpora, ours, variant), *MODEL_FLAGS]
    seed_flags_ours += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB)]
    hit_ours, _ = seed.call("seed_names:prepare_cache", seed_flags_ours)
    assert hit_ours == our_hit


def test_mega_index_build_takes_every_flag_of_prepare_cache_s_parser(
    seed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each flag the seed's tool parses is read by ``mega index build`` or taken and ignored
    (``--help`` says so), but the refused few; every ignored name is one of the seed's."""
    from megaindex.megatron_flags import IGNORED_FLAGS

    theirs = set(seed.call("seed_tools:prepare_cache_flags"))
    with pytest.raises(SystemExit):
        main(["index", "build", "--help"])
    shown = capsys.readouterr().out
    assert "taken and ignored" in shown and "--num-layers" in shown
    read = set(re.findall(r"--[\w-]+", shown))
    assert set(IGNORED_FLAGS) <= theirs
    left = {flag for flag in theirs - read - set(IGNORED_FLAGS) if not recognised(flag, capsys)}
    assert left == REFUSED_FLAGS


def recognised(flag: str, capsys: pytest.CaptureFixture[str]) -> bool:
    """Whether ``mega index build`` parses ``flag`` (one its ``--help`` does not show)."""
    with contextlib.suppress(SystemExit):  # argparse's error, or the build's own
        main(["index", "build", "--seq-length", "8", flag])
    error = capsys.readouterr().err
    return "unrecognized arguments" not in error and "ambiguous option" not in error


def test_dataset_log_records_without_a_cache_path_match_the_seed_s(
    seed, corpora: list[str], tmp_path: Path
) -> None:
    """A blend of one weighted corpus and no path_to_cache: the GPTDataset tables go beside
    the corpus, the blend's stay in memory with Megatron's warnings; built, then hit."""
    from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
    from megaindex.tokenizer import IdentifiedTokenizer

    copies = []
    for side in ("seed", "ours"):
        (tmp_path / side).mkdir()
        for suffix in (".bin", ".idx"):
            target = tmp_path / side / ("web" + suffix)
            target.write_bytes(Path(corpora[0] + suffix).read_bytes())
        copies.append(str(tmp_path / side / "web"))
    fields = {
        "random_seed": 3, "sequence_length": 16, "split": "80,15,5",
        "reset_position_ids": False, "reset_attention_mask": False, "eod_mask_loss": False,
    }  # fmt: skip
    sizes = [200, 30, 10]
    null = {"vocab_size": VOCAB}
    identifiers = {
        "class": "megatron.core.tokenizers.text.libraries.null_tokenizer.NullTokenizer",
        "vocab_size": VOCAB, "eod_id": VOCAB - 1, "pad_id": -1,
    }  # fmt: skip

    def ours(prefix: str) -> list[tuple[str, str, str]]:
        config = GPTDatasetConfig(
            blend=([prefix], [1.0]),
            tokenizer=IdentifiedTokenizer(VOCAB - 1, VOCAB, identifiers, pad=-1),
            **fields,
        )
        builder = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config)
        return dataset_log_records(builder.build)[0]

    seed_built = seed.call("seed_names:gpt_log_records", fields, ([copies[0]], [1.0]), sizes, null)
    assert ours(copies[1]) == seed_built
    assert ("megatron.core.datasets.blended_dataset", "WARNING",
            "Building a BlendedDataset for a single MegatronDataset") in seed_built  # fmt: skip
    seed_hit = seed.call("seed_names:gpt_log_records", fields, ([copies[0]], [1.0]), sizes, null)
    assert seed_hit != seed_built
    assert ours(copies[0]) == seed_hit
