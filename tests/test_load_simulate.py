"""`mega load simulate` over megaindex's GPT datasets: an interrupted and resumed run hashes the
same global batches as an uninterrupted one; with ``--hybrid-cp`` over SFT packs, what each rank
trains on."""

import itertools

from megafmt.cli.main import main
from megafmt.sft import SFTTokenizer
from megafmt.sft.testing import write_sft_jsonl, write_sft_tokenizer
from megafmt.testing import write_corpus
from megaindex import BlendedMegatronDatasetBuilder, SFTDatasetConfig


def simulate(tmp_path, *extra):
    corpus = write_corpus(str(tmp_path / "corpus"), longest=40)
    return main(
        [
            "load",
            "simulate",
            "--data-path",
            corpus,
            "--split",
            "1",
            "--seq-length",
            "16",
            "--null-tokenizer",
            "1000",
            "--samples",
            "200",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--global-batch-size",
            "8",
            "--micro-batch-size",
            "2",
            "--dp",
            "2",
            *extra,
        ]
    )


def hashes_of_a_stop_and_resume(tmp_path, run, stop: int) -> dict[str, list[str]]:
    """The hash logs of 6 steps in one run ("whole") and of the same steps stopped after
    ``stop`` ("first") and resumed there ("rest"); 8 samples a step."""
    for name, extra in (
        ("whole", ["--steps", "6"]),
        ("first", ["--steps", str(stop)]),
        ("rest", ["--steps", str(6 - stop), "--resume-at", str(8 * stop)]),
    ):
        assert run(tmp_path, *extra, "--hash-log", str(tmp_path / name)) == 0
    return {name: (tmp_path / name).read_text().split() for name in ("whole", "first", "rest")}


def test_interrupted_and_resumed_runs_read_the_same_batches(tmp_path, capsys):
    hashes = hashes_of_a_stop_and_resume(tmp_path, simulate, 3)
    assert len(hashes["whole"]) == 6
    assert hashes["first"] + hashes["rest"] == hashes["whole"]
    assert "disjoint and covering" in capsys.readouterr().out


def test_dry_run_resume_names_the_first_samples(tmp_path, capsys):
    assert simulate(tmp_path, "--dry-run-resume", "16") == 0
    assert capsys.readouterr().out.splitlines() == [
        "rank 0: first micro-batch after 16 consumed samples: [16, 17]",
        "rank 1: first micro-batch after 16 consumed samples: [18, 19]",
    ]


def test_the_cyclic_loader_runs_past_an_epoch(tmp_path, capsys):
    assert simulate(tmp_path, "--dataloader-type", "cyclic", "--steps", "40") == 0
    assert "40 steps of 8 samples over 2 ranks" in capsys.readouterr().out


def simulate_hybrid_cp(tmp_path, *extra):
    """``mega load simulate --hybrid-cp 64`` over packed SFT samples of 256 tokens, on 2 DP x 2
    CP ranks, 2 micro-batches per rank and step."""
    tokenizer = str(write_sft_tokenizer(tmp_path / "tokenizer"))
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 30, seed=1, conversations=3)
    data = ["--dataset", "sft", "--data-path", path, "--seq-length", "256", "--split", "100,0,0"]
    data += ["--sft-tokenizer", tokenizer, "--samples", "40", "--cache-dir", str(tmp_path / "c")]
    data += ["--no-create-attention-mask-in-dataloader"]  # packed: Megatron's default is on
    layout = ["--global-batch-size", "4", "--micro-batch-size", "1", "--dp", "2", "--cp", "2"]
    return main(["load", "simulate", *data, *layout, "--hybrid-cp", "64", *extra])


def test_hybrid_cp_prints_each_rank_s_sub_sequences_and_groups(tmp_path, capsys):
    assert simulate_hybrid_cp(tmp_path, "--steps", "3", "--hash-log", str(tmp_path / "all")) == 0
    lines = capsys.readouterr().out.splitlines()
    # a run resumed after the first step hashes the same later steps
    assert (
        simulate_hybrid_cp(
            tmp_path, "--steps", "2", "--resume-at", "4", "--hash-log", str(tmp_path / "rest")
        )
        == 0
    )
    whole = (tmp_path / "all").read_text().split()
    assert len(whole) == 3 and (tmp_path / "rest").read_text().split() == whole[1:]
    step0 = [line.split(": ", 1) for line in lines if line.startswith("step 0 ")]
    # every sub-sequence of the step's 4 samples (0-3, cut at their cu_seqlens) is dealt once,
    # to as many ranks as share it, and every rank works in every group
    config = SFTDatasetConfig(
        random_seed=1234,
        sequence_length=256,
        blend=([str(tmp_path / "chat.jsonl")], None),
        split="100,0,0",
        tokenizer=SFTTokenizer(str(tmp_path / "tokenizer")),
        path_to_cache=str(tmp_path / "c"),
    )
    train = BlendedMegatronDatasetBuilder("sft", [40, None, None], lambda: True, config).build()[0]
    expected = {}
    for index in range(4):
        bounds = train[index]["cu_seqlens"].tolist()
        for piece, (start, end) in enumerate(itertools.pairwise(bounds)):
            expected[f"{index}.{piece}"] = end - start
    dealt: dict[str, list[str]] = {}
    for where, work in step0:
        assert work, where
        for item in work.split("; "):
            name, _, length, _, size, *_ = item.split()
            assert int(length) == expected[name]
            dealt.setdefault(name, []).append(size)
    assert sorted(dealt) == sorted(expected)
    assert all(len(sizes) == int(sizes[0]) for sizes in dealt.values())


def test_hybrid_cp_with_phases_deals_each_phase_s_samples_and_resumes_across(tmp_path, capsys):
    other = str(tmp_path / "other.jsonl")
    write_sft_jsonl(other, 30, seed=2, conversations=3)
    phases = ["--phases", f"0:{tmp_path / 'chat.jsonl'}", f"2:{other}", "--hash-log"]
    assert simulate_hybrid_cp(tmp_path, "--steps", "4", *phases, str(tmp_path / "all")) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    # a run resumed in phase 0 crosses into phase 1 as the whole run does
    rest = ["--steps", "3", "--resume-at", "4", *phases, str(tmp_path / "rest")]
    assert simulate_hybrid_cp(tmp_path, *rest) == 0
    whole = (tmp_path / "all").read_text().split()
    assert len(whole) == 4 and (tmp_path / "rest").read_text().split() == whole[1:]
    steps = {}
    for line in lines:
        step, phase, work = line.split()[1], line.split()[3], line.split(": ", 1)[1]
        steps.setdefault(step, set()).add(phase)
        # phase 1 reads its own dataset from its first sample: samples 0-3 at step 2
        names = {item.split()[0].split(".")[0] for item in work.split("; ")}
        assert names <= ({"0", "1", "2", "3"} if step in ("0", "2") else {"4", "5", "6", "7"})
    assert steps == {"0": {"0"}, "1": {"0"}, "2": {"1"}, "3": {"1"}}


def phased(tmp_path, *extra):
    corpus = write_corpus(str(tmp_path / "other"), seed=1, longest=40)
    first = str(tmp_path / "corpus")
    return simulate(
        tmp_path,
        "--phases",
        f"0:0.3 {first} 0.7 {corpus}",
        f"3:{corpus}",
        "--samples",  # the last phase ends at 200; a weighted blend's splits need sizes
        "200,0,0",
        *extra,
    )


def test_phases_print_what_each_rank_receives_and_resume_inside_a_phase(tmp_path, capsys):
    hashes = hashes_of_a_stop_and_resume(tmp_path, phased, 4)  # phase 1 starts at step 3
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    whole = lines[:24]  # 6 steps x 2 ranks x 2 micro-batches
    assert whole[0] == "step 0 rank 0 phase 0: samples [0, 1] loss tokens [16, 16]"
    assert whole[12] == "step 3 rank 0 phase 1: samples [0, 1] loss tokens [16, 16]"
    assert [line.split(":")[0] for line in whole[:4]] == [
        "step 0 rank 0 phase 0",
        "step 0 rank 0 phase 0",
        "step 0 rank 1 phase 0",
        "step 0 rank 1 phase 0",
    ]
    assert len(hashes["whole"]) == 6 and len(set(hashes["whole"])) == 6
    assert hashes["first"] + hashes["rest"] == hashes["whole"]


def test_hybrid_cp_flags_are_refused_where_they_would_be_ignored(tmp_path, capsys):
    """--hybrid-cp brings its own sampler (Megatron's, for the 'single' type only), and --cp
    means nothing without it: both are errors naming the flags, not silently dropped."""
    assert simulate(tmp_path, "--hybrid-cp", "64", "--dataloader-type", "cyclic") == 1
    assert "found --dataloader-type cyclic" in capsys.readouterr().err
    assert simulate(tmp_path, "--cp", "2") == 1
    assert "--cp 2 takes effect with --hybrid-cp only" in capsys.readouterr().err
