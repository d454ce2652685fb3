import json
import os

import numpy
import pytest

from megafmt import IndexedDataset
from megafmt.cli.main import main
from megafmt.testing import write_corpus
from megaindex import (
    BlendedMegatronDatasetBuilder,
    GPTDataset,
    StepBatchSizeSchedule,
    get_train_valid_test_num_samples,
)
from megaindex.phases import PhaseSchedule, build_phase_datasets


def dataset_args(corpus, cache):
    return [
        "--data-path",
        corpus,
        "--seq-length",
        "32",
        "--split",
        "90,8,2",
        "--null-tokenizer",
        "1000",
        "--cache-dir",
        cache,
    ]


def test_build_then_hit(corpus, tmp_path, capsys):
    cache = str(tmp_path / "cache")
    assert main(["index", "build", *dataset_args(corpus, cache), "--samples", "1000,50,10"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["train", "1,023", "samples", "built"]
    assert "tables" in lines[1] and "save" in lines[1]  # a small split: built in one call
    assert "epoch(s) of" in lines[2]
    assert main(["index", "build", *dataset_args(corpus, cache), "--samples", "1000,50,10"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[3] == "cache"


def test_built_cache_is_the_one_the_job_hits(corpus, tmp_path, make_config, capsys):
    cache = str(tmp_path / "cache")
    budget = [
        "--train-iters",
        "10",
        "--global-batch-size",
        "16",
        "--eval-interval",
        "5",
        "--eval-iters",
        "2",
    ]
    assert main(["index", "build", *dataset_args(corpus, cache), *budget]) == 0
    capsys.readouterr()
    # what a Megatron job with these flags asks for: 160 train, 3 * 2 * 16 valid, 32 test
    sizes = list(
        get_train_valid_test_num_samples(16, train_iters=10, eval_interval=5, eval_iters=2)
    )
    assert sizes == [160, 96, 32]
    job = BlendedMegatronDatasetBuilder(
        GPTDataset, sizes, lambda: True, make_config(path_to_cache=cache, split="90,8,2")
    ).build()
    assert [d.index_source.kind for d in job] == ["cache"] * 3


def test_inspect_lists_each_cached_dataset(corpus, tmp_path, capsys):
    cache = str(tmp_path / "cache")
    main(["index", "build", *dataset_args(corpus, cache), "--samples", "1000,50,10"])
    capsys.readouterr()
    assert main(["index", "inspect", cache]) == 0
    out = capsys.readouterr().out
    assert out.count("GPTDataset train of") == 1 and "samples: 1,023" in out
    assert "epochs: 4, separate final epoch: no" in out
    assert main(["index", "inspect", cache, "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    train = next(r for r in reports if r["description"]["index_split"] == "train")
    assert train["tables"]["sample_index"]["shape"] == [1024, 2]
    assert train["bytes_on_disk"] == sum(
        os.path.getsize(os.path.join(cache, f"{train['base']}-{t}.npy"))
        for t in ("document_index", "sample_index", "shuffle_index")
    )


def test_inspect_names_a_damaged_sidecar(corpus, tmp_path, capsys):
    cache = str(tmp_path / "cache")
    main(["index", "build", *dataset_args(corpus, cache), "--samples", "1000,50,10"])
    (sidecar,) = [n for n in os.listdir(cache) if n.endswith("-train-megaindex.json")]
    with open(os.path.join(cache, sidecar), "w") as stream:
        stream.write("{not json")
    capsys.readouterr()
    assert main(["index", "inspect", cache]) == 0
    out = capsys.readouterr().out
    assert f"damaged, rebuilt at its next load: {cache}/{sidecar}: the sidecar cannot" in out


def test_explain_names_the_documents_of_a_sample(corpus, tmp_path, capsys):
    cache = str(tmp_path / "cache")
    args = [*dataset_args(corpus, cache), "--samples", "1000,50,10", "--sample", "4"]
    assert main(["index", "explain", *args, "--tokens"]) == 0
    out = capsys.readouterr().out.splitlines()
    # the expected values come from the cached tables on disk (equal to megatron-core's, as the
    # compat tests show) and the corpus, read as megatron-core's table layout documents them
    (base,) = {n.rsplit("-", 1)[0] for n in os.listdir(cache) if "-GPTDataset-train-" in n}
    tables = ("document_index", "sample_index", "shuffle_index")
    table = {t: numpy.load(os.path.join(cache, f"{base}-{t}.npy")) for t in tables}
    row = int(table["shuffle_index"][4])
    (begin, begin_offset), (end, end_offset) = table["sample_index"][row : row + 2].tolist()
    documents = table["document_index"][begin : end + 1].tolist()
    assert out[0].startswith(f"train sample 4 is row {row} ")
    spans = [line.split() for line in out[1:-1]]
    assert [int(span[1]) for span in spans] == documents
    assert spans[0][3] == f"[{begin_offset}," and spans[-1][4] == f"{end_offset + 1})"
    corpus_tokens = IndexedDataset(corpus)
    expected = []
    for span in spans:
        first, last = int(span[3][1:-1]), int(span[4][:-1])
        expected += corpus_tokens.get(int(span[1]), first, last - first).tolist()
    assert out[-1] == " ".join(map(str, expected))


def test_explain_refuses_a_sample_out_of_range(corpus, tmp_path, capsys):
    args = [*dataset_args(corpus, str(tmp_path / "c")), "--samples", "100", "--sample", "5000"]
    assert main(["index", "explain", *args]) == 1
    assert "sample 5000 out of range: the train split has" in capsys.readouterr().err


def test_train_iters_needs_a_batch_size(corpus, tmp_path, capsys):
    assert main(["index", "build", *dataset_args(corpus, str(tmp_path)), "--train-iters", "5"]) == 1
    assert "give --samples, or --global-batch-size (or --micro-batch-size) with --train-iters" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("argv", [["index"], ["index", "build"]])
def test_usage_errors(argv):
    with pytest.raises(SystemExit):
        main(argv)


def test_blend_build_inspect_and_explain(corpus, tmp_path, capsys):
    other = write_corpus(str(tmp_path / "other"), documents=150, seed=5)
    cache = str(tmp_path / "cache")
    args = [
        "--data-path",
        "0.25",
        corpus,
        "0.75",
        other,
        "--split",
        "90,10,0",
        "--seq-length",
        "16",
        "--null-tokenizer",
        "1000",
        "--cache-dir",
        cache,
        "--samples",
        "400,40,0",
    ]
    assert main(["index", "build", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["train", "400", "samples", "blend", "of", "2"]
    parts = [line for line in out[1:] if line.strip().startswith("train")]
    assert len(parts) == 2 and all("GPTDataset-train" in line for line in parts)
    assert main(["index", "inspect", cache, "--first", "100"]) == 0
    report = capsys.readouterr().out
    assert "BlendedDataset train: 2 datasets, size 400" in report
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("source"))
    train_rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [float(r[1]) for r in train_rows] == [0.25, 0.75]
    assert [float(r[3]) for r in train_rows] == pytest.approx([0.25, 0.75], abs=0.01)
    assert all(float(r[5]) > 0 for r in train_rows)  # epochs read of each source
    assert main(["index", "explain", *args, "--sample", "3"]) == 0
    assert "of the blend" in capsys.readouterr().out.splitlines()[0]


def test_no_split_warns_about_the_legacy_default(tmp_path, capsys):
    big = write_corpus(str(tmp_path / "big"), documents=2000, longest=8)  # 0.1% test: 2 docs
    args = [
        "--data-path",
        big,
        "--seq-length",
        "16",
        "--null-tokenizer",
        "1000",
        "--cache-dir",
        str(tmp_path / "c"),
        "--samples",
        "100,10,1",
    ]
    with pytest.warns(UserWarning, match="legacy default '969, 30, 1'"):
        assert main(["index", "build", *args]) == 0


def test_inspect_plots_blend_shares(corpus, tmp_path, capsys):
    other = write_corpus(str(tmp_path / "other"), documents=150, seed=5)
    cache = str(tmp_path / "cache")
    main(
        [
            "index",
            "build",
            "--data-path",
            "1",
            corpus,
            "3",
            other,
            "--split",
            "1",
            "--seq-length",
            "16",
            "--null-tokenizer",
            "1000",
            "--cache-dir",
            cache,
            "--samples",
            "200,0,0",
        ]
    )
    plot = tmp_path / "shares.png"
    assert main(["index", "inspect", cache, "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class Shifted(GPTDataset):
    """A third party's dataset class: GPT samples with every token id plus one."""

    shapes_samples = True

    def shape_sample(self, idx, text):
        return text + 1


def test_dataset_classes_are_plugins_by_name(corpus, tmp_path, capsys, make_config):
    from megafmt import PluginError
    from megaindex.plugins import DATASETS

    assert {"gpt", "mock"} <= set(DATASETS.available())
    DATASETS.register("shifted-test", Shifted, replace=True)
    cache = str(tmp_path / "cache")
    args = [*dataset_args(corpus, cache), "--samples", "100,10,0"]
    assert main(["index", "build", "--dataset", "shifted-test", *args]) == 0
    assert "ShiftedDataset" not in capsys.readouterr().out  # the class name keys the cache
    assert any(name.endswith("-Shifted-train-description.txt") for name in os.listdir(cache))
    # the builder takes the same name: it finds the cache just built
    config = make_config(path_to_cache=cache, split="90,8,2")
    shifted = BlendedMegatronDatasetBuilder("shifted-test", [100, 10, 0], lambda: True, config)
    train = shifted.build()[0]
    plain = BlendedMegatronDatasetBuilder("gpt", [100, 10, 0], lambda: True, config).build()[0]
    assert train.index_source.kind == "cache" and isinstance(train, Shifted)
    assert (train[3]["tokens"] == plain[3]["tokens"] + 1).all()
    mock = ["--seq-length", "16", "--null-tokenizer", "1000", "--samples", "20,5,5"]
    assert main(["index", "build", "--dataset", "mock", *mock, "--cache-dir", cache]) == 0
    assert "MockGPTDataset" in capsys.readouterr().out
    assert main(["index", "build", "--dataset", "gtp", *args]) == 1
    assert "unknown megaindex dataset 'gtp'" in capsys.readouterr().err
    with pytest.raises(PluginError, match="did you mean 'gpt'"):
        BlendedMegatronDatasetBuilder("gtp", [1, 0, 0], lambda: True, config)


def test_build_takes_megatron_s_budget_flags(corpus, tmp_path, make_config, capsys):
    cache = str(tmp_path / "cache")
    flags = [
        "--train-samples", "96", "--global-batch-size", "8", "--eval-interval", "4",
        "--eval-iters", "1", "--start-eval-at-iter", "4",
        "--step-batch-size-schedule", "0:4 256:8",  # tokens: 256 / seq 32 = 8 samples
        "--phase-transition-iterations", "6", "--iteration", "7",
    ]  # fmt: skip
    assert main(["index", "build", *dataset_args(corpus, cache), *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    schedule = StepBatchSizeSchedule.parse("0:4 256:8", seq_length=32)
    expected = get_train_valid_test_num_samples(
        8, train_samples=96, eval_interval=4, eval_iters=1, start_eval_at_iter=4,
        step_batch_size_schedule=schedule, phase_transition_iterations=[6], iteration=7,
    )  # fmt: skip
    # 2 iterations of 4, then 11 of 8: 13 in all; points 0, 4, 8, 12 less the one before 4;
    # the phase from iteration 6 (48 samples) to the end (96)
    assert expected == (48, 3 * 8, 8)
    assert lines[0].split()[0] == "train"
    job = BlendedMegatronDatasetBuilder(
        GPTDataset, list(expected), lambda: True, make_config(path_to_cache=cache, split="90,8,2")
    ).build()
    assert [d.index_source.kind for d in job] == ["cache"] * 3


def test_megatron_tokenizer_flags_name_the_job_s_tokenizer(corpus, tmp_path, capsys):
    """--tokenizer-type and its flags give the seed commit's identity (the cache key), with
    0.16.1's under --tokenizer-compat; without any tokenizer the command says what to give."""
    from megafmt.tokenizers import TokenizerOptions
    from megaindex.tokenizer import IdentifiedTokenizer

    seed = IdentifiedTokenizer.from_flags("NullTokenizer", TokenizerOptions(vocab_size=1000))
    assert (seed.eod, seed.vocab_size, seed.pad) == (999, 1000, -1)
    assert list(seed.unique_identifiers.items()) == [
        ("class", "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText"),
        ("tokenizer_path", None),
        ("vocab_size", "1000"),
        ("pad_id", "-1"),
    ]
    old = IdentifiedTokenizer.from_flags(
        "NullTokenizer", TokenizerOptions(vocab_size=1000, compat="0.16.1")
    )
    assert (old.eod, old.vocab_size) == (1000, 1001)
    assert list(old.unique_identifiers) == ["class", "tokenizer_path", "vocab_size"]
    base = ["index", "build", "--data-path", corpus, "--seq-length", "32", "--split", "90,8,2",
            "--samples", "100,10,10"]  # fmt: skip
    flags = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
    assert main([*base, *flags, "--cache-dir", str(tmp_path / "a")]) == 0
    assert (
        main([*base, *flags, "--tokenizer-compat", "0.16.1", "--cache-dir", str(tmp_path / "b")])
        == 0
    )
    names = [sorted(os.listdir(tmp_path / folder)) for folder in ("a", "b")]
    assert names[0] != names[1]  # another identity, another cache
    capsys.readouterr()
    assert main([*base, "--cache-dir", str(tmp_path / "c")]) != 0
    assert "give the job's tokenizer: --tokenizer-type" in capsys.readouterr().err


def test_inspect_shows_a_phase_schedule(corpus, tmp_path, capsys, make_config):
    other = write_corpus(str(tmp_path / "other"), documents=150, seed=5)
    cache = str(tmp_path / "cache")
    phases = ["--phases", f"0:0.25 {corpus} 0.75 {other}", f"3:{other}"]
    budget = ["--global-batch-size", "8", "--train-iters", "6"]
    args = ["--seq-length", "16", "--split", "1", "--null-tokenizer", "1000"]
    assert main(["index", "build", *args, "--cache-dir", cache, *phases, *budget]) == 0
    assert "phase from iteration 3:" in capsys.readouterr().out
    assert main(["index", "inspect", cache, *phases, f"5:{corpus}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"phase 0 from iteration 0: 0.25 {corpus} 0.75 {other}"
    # the phases' datasets as the API builds them: 24 samples each (3 iterations of 8)
    config = make_config(blend=([corpus], None), split="1", sequence_length=16)
    schedule = PhaseSchedule.parse(phases[1:])
    (blend, *_), (single, *_) = build_phase_datasets(GPTDataset, schedule, config, 8, 48, [0, 0])
    drawn = numpy.bincount(blend.dataset_index, minlength=2)
    assert lines[1].startswith(f"  {len(blend)} samples, {len(blend) * 16} tokens")
    assert [int(line.split()[2]) for line in lines[3:5]] == drawn.tolist()
    epochs = (24 * 16 + 1) / single.epoch_plan.tokens_per_epoch
    assert lines[5] == f"phase 1 from iteration 3: {other}"
    assert lines[6].startswith("  24 samples, 384 tokens")
    assert lines[8].split()[1:] == ["1.0000", "24", f"{epochs:.3f}"]
    assert lines[-1] == "  not in the cache: build it with mega index build --phases"
    assert main(["index", "inspect", cache, *phases, "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    assert [phase["samples"] for phase in reported] == [len(blend), 24]


@pytest.mark.parametrize("blended", [False, True], ids=["single", "blend"])
def test_inspect_phases_names_a_description_without_sequence_length(
    corpus, tmp_path, capsys, blended
):
    """A description megatron-core did not write (no sequence_length) is an error naming the
    file and the field, not a KeyError or a TypeError."""
    other = write_corpus(str(tmp_path / "other"), documents=150, seed=5)
    cache = tmp_path / "cache"
    phase = f"0:0.25 {corpus} 0.75 {other}" if blended else f"0:{other}"
    budget = ["--global-batch-size", "8", "--train-iters", "2"]
    args = ["--seq-length", "16", "--split", "1", "--null-tokenizer", "1000"]
    assert (
        main(["index", "build", *args, "--cache-dir", str(cache), "--phases", phase, *budget]) == 0
    )
    kind = "BlendedDataset" if blended else "GPTDataset"
    (path,) = [p for p in cache.glob(f"*-{kind}-train-description.txt")]
    described = json.loads(path.read_text())
    del (described["datasets"][0] if blended else described)["sequence_length"]
    path.write_text(json.dumps(described, indent=4))
    capsys.readouterr()
    assert main(["index", "inspect", str(cache), "--phases", phase]) != 0
    error = capsys.readouterr().err
    assert str(path) in error and "'sequence_length'" in error
    assert ("in datasets[0]" in error) == blended
