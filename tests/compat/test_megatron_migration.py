"""The migration, end to end: tools/megatron_switch.py applied to the seed commit's own
pretrain_gpt.py, training.py and data_samplers.py, and the switched training data path run on
gloo ranks beside the unswitched one, batch for batch.

Each rank runs Megatron-LM's own code from the archive (testing/seedref.py): its argument
parser and validation, ``parallel_state.initialize_model_parallel``, pretrain_gpt's dataset
provider, training.py's ``build_train_valid_test_data_iterators`` and pretrain_gpt's
``get_batch``, for a few iterations of the training, validation and test iterators. Switched,
those are megaindex's datasets, megaload's loader and megadist's get_batch. The jobs: GPT on
TP2 x DP2 and TP2 x CP2; ``--fim-data``, ``--sft``, phases (resumed inside the second) and a
Hugging Face tokenizer without a pad token whose post-processor adds a BOS, on TP2 x DP2; and
seeded random cases, each a tokenizer of any type with its options (the files and command lines
of test_tokenizer_seed_compat.py), a jsonl of random documents ``mega preprocess`` tokenizes
with it, a layout and data-path flags.

Stubs, only for what needs CUDA or files the archive leaves out:

- ``torch.cuda.current_device()`` returns ``"cpu"`` and ``Tensor.cuda()`` returns the tensor:
  get_batch and get_batch_on_this_tp_rank place tensors there;
- ``torch.tensor(..., device="cuda")`` makes a CPU tensor: training.py's do-train/valid/test
  flags;
- ``torch.cuda.get_device_properties`` reports compute capability 10: argument validation asks
  the GPU's architecture under tensor or context parallelism;
- modules ``gpt_builders`` and ``model_provider`` (pretrain_gpt.py imports them; they are not
  in the archive, and only the model uses them) are empty stand-ins.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import pytest
from seedref import enter_seed_environment, source_root

from megadist.spawn import run_distributed

pytestmark = [pytest.mark.compat, pytest.mark.distributed]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).parent))
# tools/ and this folder are put on the path first
import test_tokenizer_seed_compat  # noqa: E402
from megatron_switch import SWITCHES, apply, switched_text  # noqa: E402
from test_tokenizer_seed_compat import PREPROCESSED, TYPES, flag_sets, write_jsonl  # noqa: E402

STEPS = 3

#: the tokenizer compat test's files of every tokenizer type (made once per module)
tokenizer_files = test_tokenizer_seed_compat.files


def cuda_stubs() -> None:
    import torch

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(major=10)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    make_tensor = torch.tensor

    def tensor(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return make_tensor(*args, device="cpu" if device == "cuda" else device, **kwargs)

    torch.tensor = tensor
    for name in ("gpt_builders", "model_provider"):
        stand_in = types.ModuleType(name)
        stand_in.gpt_builder = stand_in.model_provider = None
        sys.modules[name] = stand_in


def megatron_iterators(root: str, argv: list[str], iteration: int) -> tuple[Any, Any, Any]:
    """Megatron-LM from ``root`` on this gloo rank, its arguments parsed from ``argv``, its
    groups initialised and its train, valid and test iterators built, started (or resumed) at
    ``iteration``: (its ``args``, its ``pretrain_gpt`` module, the three iterators)."""
    import warnings

    warnings.simplefilter("ignore")
    enter_seed_environment(root=Path(root))
    cuda_stubs()
    import torch.distributed as dist

    # Megatron-LM reads its place in the world from the launcher's environment
    rank, world = str(dist.get_rank()), str(dist.get_world_size())
    os.environ.update({"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world})
    sys.argv = ["pretrain_gpt.py", *argv]
    from megatron.core import parallel_state
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args()
    args.iteration, args.consumed_valid_samples = iteration, 0
    args.consumed_train_samples = iteration * args.global_batch_size
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size,
        hybrid_context_parallel=args.hybrid_context_parallel,
    )
    import pretrain_gpt
    from megatron.training import training

    training.update_train_iters(args)  # as pretrain() does: a sample-based run's iterations

    provider = pretrain_gpt.train_valid_test_datasets_provider
    provider.is_distributed = True
    return args, pretrain_gpt, training.build_train_valid_test_data_iterators(provider)


def as_numpy(values: list[Any]) -> list[Any]:
    """get_batch's values with each tensor as numpy and a process group (hybrid CP's
    ``hybrid_cp_group``) as its global ranks: what pickles back from a rank."""
    import torch
    import torch.distributed as dist

    return [
        v.numpy()
        if isinstance(v, torch.Tensor)
        else dist.get_process_group_ranks(v)
        if isinstance(v, dist.ProcessGroup)
        else v
        for v in values
    ]


def rank_pipeline(root: str, argv: list[str], steps: int, iteration: int = 0) -> dict[str, Any]:
    """One gloo rank of a Megatron-LM run from ``root``, started (or resumed) at ``iteration``:
    the first ``steps`` values of get_batch on each of its train, valid and test iterators, as
    numpy."""
    import torch.distributed as dist

    _, pretrain_gpt, iterators = megatron_iterators(root, argv, iteration)
    taken = {}
    for name, iterator in zip(("train", "valid", "test"), iterators, strict=True):
        taken[name] = [as_numpy(pretrain_gpt.get_batch(iterator)) for _ in range(steps)]
    return {"rank": dist.get_rank(), "batches": taken}


def hybrid_rank_pipeline(root: str, argv: list[str], steps: int) -> dict[str, Any]:
    """One gloo rank of a ``--hybrid-context-parallel`` Megatron-LM run from ``root`` at
    tensor-parallel size 1: its training iterator wrapped in training.py's
    ``HybridCPDataLoaderWrapper`` (as ``train()`` wraps it, on the model configuration
    ``core_transformer_config_from_args`` makes), and for each of the first ``steps`` global
    batches the wrapper's schedule, the sub-sequences it hands this rank, and get_batch of each
    sub-sequence this rank is scheduled, one at a time, in the order and with the
    ``local_cp_size`` the seed's hybrid-CP forward-backward schedule gives them (the count of
    ranks a sub-sequence is dealt to in its group). Validation and testing are left out:
    training.py wraps only the training iterator.

    The seed's wrapper hands a sub-sequence as 1-D tensors without ``cu_seqlens``, and its own
    get_batch reads ``tokens.shape[1]``: at the seed commit that raises. ``raw_get_batch`` is
    the class of what get_batch raises on the first sub-sequence as handed; the others go to
    get_batch as one row of their length with ``cu_seqlens`` [[0, length]] and ``max_seqlen``,
    the shape get_batch reads (test_hybrid_cp_compat.py feeds the same)."""
    import torch
    import torch.distributed as dist

    args, pretrain_gpt, iterators = megatron_iterators(root, argv, 0)
    from megatron.core import parallel_state
    from megatron.training import training
    from megatron.training.arguments import core_transformer_config_from_args

    config = core_transformer_config_from_args(args)
    wrapped = iter(training.HybridCPDataLoaderWrapper(iterators[0], config))
    here = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    taken, schedules, raw = [], [], None
    for _ in range(steps):
        samples, groups = next(wrapped)
        handed = {
            i: dict(zip(s, as_numpy(list(s.values())), strict=True)) for i, s in samples.items()
        }
        schedules.append((groups, handed))
        for group in groups:
            for sample_id in group[here]:
                sample = dict(samples[sample_id])
                sharing = torch.tensor([sum(sample_id in ids for ids in group)], dtype=torch.int32)
                if raw is None:
                    try:
                        pretrain_gpt.get_batch(iter([{**sample, "local_cp_size": sharing}]))
                        raw = "returned"
                    except Exception as error:  # compared: the seed's and ours
                        raw = type(error).__name__
                length = len(sample["tokens"])
                row = {key: value[None] for key, value in sample.items()}
                row["cu_seqlens"] = torch.tensor([[0, length]], dtype=torch.int32)
                row["max_seqlen"] = torch.tensor([length], dtype=torch.int32)
                row["local_cp_size"] = sharing
                taken.append(as_numpy(pretrain_gpt.get_batch(iter([row]))))
    return {"rank": dist.get_rank(), "batches": {"train": taken}, "schedules": schedules,
            "raw_get_batch": raw}  # fmt: skip


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The seed source as it is, and a copy switched by tools/megatron_switch.py."""
    switched = tmp_path_factory.mktemp("checkout") / "megatron-lm"
    shutil.copytree(source_root(), switched)
    diffs = apply(switched)
    assert len(diffs) == len(SWITCHES)  # every file the switch edits
    assert apply(switched) == []  # a second run finds nothing left to switch
    return {"seed": source_root(), "switched": switched}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    from megafmt.testing import write_corpus

    return write_corpus(str(tmp_path_factory.mktemp("corpus") / "web"), 400, vocab=999, eod=999)


@pytest.fixture(scope="module")
def code_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A code corpus and the byte-level BPE folder it is tokenized with (FIM's sentinels and
    split token in its vocabulary), for ``--fim-data``."""
    import random

    from fimtesting import FILE_SEP, code_text, write_code_corpus, write_tokenizer

    from megafmt.tokenizers import TokenizerOptions, load_tokenizer

    rng = random.Random(3)
    texts = [code_text(rng, rng.randint(0, 40)) for _ in range(1000)]
    directory = write_tokenizer(tmp_path_factory.mktemp("fim-tokenizer"), 400, texts)
    tokenizer = load_tokenizer("huggingface", TokenizerOptions(model=directory))
    documents = [FILE_SEP.join(texts[i : i + rng.randint(1, 3)]) for i in range(0, 600, 2)]
    prefix = str(tmp_path_factory.mktemp("fim-corpus") / "code")
    write_code_corpus(prefix, tokenizer, documents)
    return prefix, directory


@pytest.fixture(scope="module")
def chat_jsonl(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Conversations and the SFT tokenizer folder (no pad token), for ``--sft``."""
    from megafmt.sft.testing import write_sft_jsonl, write_sft_tokenizer

    root = tmp_path_factory.mktemp("sft")
    write_sft_jsonl(root / "chat.jsonl", 60, seed=4, conversations=3)
    return str(root / "chat.jsonl"), str(write_sft_tokenizer(root / "tokenizer"))


TP2 = ["--tensor-model-parallel-size", "2"]
CP2 = ["--context-parallel-size", "2"]
GPT = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
#: data-path flags the random cases draw from: each changes what a sample holds
DATA_OPTIONS = [["--reset-position-ids"], ["--reset-attention-mask"], ["--eod-mask-loss"],
                ["--no-create-attention-mask-in-dataloader"]]  # fmt: skip


def job_flags(job: str, inputs: dict[str, Any]) -> list[str]:
    """The data, tokenizer and length flags of a hand-picked job: ``gpt`` over the
    NullTokenizer corpus; ``fim`` over the code corpus (every FIM option the seed's parser
    has); ``sft`` over conversations, packed as the seed packs them (one pack a micro-batch, no
    attention mask: the seed's SFTDataset asserts both); ``phases``, the second of
    three phases (``--phase-transition-iterations``: the test resumes the run inside it);
    ``hf``, a corpus of a Hugging Face tokenizer that has no pad token and whose
    post-processor adds a BOS."""
    if job == "gpt":
        return ["--data-path", inputs["corpus"], *GPT, "--train-iters", "10"]
    if job == "phases":
        return ["--data-path", inputs["corpus"], *GPT, "--train-samples", "96",
                "--phase-transition-iterations", "4,8"]  # fmt: skip
    if job == "sft":
        jsonl, tokenizer = inputs["chat"]
        return ["--data-path", jsonl, "--sft", "--tokenizer-type", "SFTTokenizer",
                "--tokenizer-model", tokenizer, "--seq-length", "64",
                "--max-position-embeddings", "64", "--micro-batch-size", "1",
                "--no-create-attention-mask-in-dataloader", "--train-iters", "10"]  # fmt: skip
    if job == "hf":
        return ["--data-path", inputs["tokenized"]("huggingface", 0, 5), "--tokenizer-type",
                "HuggingFaceTokenizer", "--tokenizer-model", inputs["files"]["hf"],
                "--train-iters", "10"]  # fmt: skip
    prefix, directory = inputs["code"]
    return [
        "--data-path", prefix, "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", directory, "--fim-data", "--fim-rate", "0.8",
        "--fim-spm-rate", "0.5", "--fim-split-sample", "<file_sep>", "--fim-fragment-rate", "0.5",
        "--train-iters", "10",
    ]  # fmt: skip


def random_job(seed: int, inputs: dict[str, Any]) -> tuple[list[str], list[str]]:
    """A seeded random case: a tokenizer of any type the seed builds (its command line drawn
    from the tokenizer compat test's), a jsonl of seeded random documents tokenized with it by
    ``mega preprocess``, a layout and data-path flags; (layout, flags)."""
    rng = random.Random(seed)
    kind = rng.choice(TYPES)
    usable = [
        n
        for n in PREPROCESSED[kind]  # the legacy sentencepiece wrapper has no EOD to train with
        if "--tokenizer-sentencepiece-legacy" not in flag_sets(inputs["files"])[kind][n]
    ]
    number = rng.choice(usable)
    layout = rng.choice([TP2, [*TP2, *CP2], CP2])
    options = [flag for option in DATA_OPTIONS if rng.random() < 0.4 for flag in option]
    flags = [
        "--data-path", inputs["tokenized"](kind, number, seed),
        *flag_sets(inputs["files"])[kind][number], *options, "--train-iters", "10",
    ]  # fmt: skip
    return layout, flags


@pytest.fixture
def tokenized(tokenizer_files: dict[str, str], tmp_path: Path) -> Callable[[str, int, int], str]:
    """``(kind, number, seed) -> prefix``: seeded random documents tokenized by ``mega
    preprocess`` with command line ``number`` of ``kind``'s in the tokenizer compat test."""
    from megafmt.cli.main import main

    def tokenize(kind: str, number: int, seed: int) -> str:
        source = tmp_path / f"{kind}-{number}-{seed}.jsonl"
        write_jsonl(source, kind, seed)
        prefix = str(tmp_path / f"{kind}-{number}-{seed}")
        flags = flag_sets(tokenizer_files)[kind][number]
        common = ["--input", str(source), "--json-keys", "text", "--append-eod", "--workers", "1"]
        assert main(["preprocess", *common, *flags, "--output-prefix", prefix]) == 0
        return f"{prefix}_text_document"

    return tokenize


def full_argv(argv: list[str], cache: Path) -> list[str]:
    """``argv`` after the model and batch flags every job shares, with a data cache in
    ``cache`` and no loader workers."""
    return [
        "--micro-batch-size", "2", "--global-batch-size", "8", "--seq-length", "16",
        "--max-position-embeddings", "16", "--num-layers", "2", "--hidden-size", "8",
        "--num-attention-heads", "2", "--lr", "1e-4", "--eval-interval", "5",
        "--eval-iters", "2", "--split", "90,8,2", *argv,
        "--data-cache-path", str(cache), "--num-workers", "0",
    ]  # fmt: skip


def run_both(
    checkouts: dict[str, Path],
    argv: list[str],
    cache: Path,
    iteration: int = 0,
    hybrid: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Every rank's batches from the seed checkout and the switched one, on 4 gloo ranks
    (``hybrid``: by hybrid_rank_pipeline)."""
    results = {}
    for name, root in checkouts.items():
        full = full_argv(argv, cache / f"cache-{name}")
        pipeline = (hybrid_rank_pipeline, ()) if hybrid else (rank_pipeline, (iteration,))
        results[name] = run_distributed(
            pipeline[0], 4, str(root), full, STEPS, *pipeline[1], timeout=600, group_timeout=300
        )
    return results


def assert_same_batches(
    results: dict[str, list[dict[str, Any]]], cache: Path, cached: bool = True
) -> None:
    """Every rank, split and step: the same get_batch values; and the same cache files, of
    which the seed wrote some if ``cached`` (all but the SFT job, whose dataset caches nothing),
    so that an empty cache on both sides does not pass for an equal one."""
    for seed_rank, switched_rank in zip(results["seed"], results["switched"], strict=True):
        assert seed_rank["batches"].keys() == switched_rank["batches"].keys()
        for split, seed_batches in seed_rank["batches"].items():
            for step, (theirs, ours) in enumerate(
                zip(seed_batches, switched_rank["batches"][split], strict=True)
            ):
                where = f"rank {seed_rank['rank']}, {split} step {step}"
                assert len(theirs) == len(ours) == 10, where
                for index, (a, b) in enumerate(zip(theirs, ours, strict=True)):
                    assert (a is None) == (b is None), (where, index)
                    if a is not None:
                        numpy.testing.assert_array_equal(a, b, err_msg=f"{where}, value {index}")
    # the two runs wrote the same cache: the same names, byte for byte
    seed_cache, our_cache = cache / "cache-seed", cache / "cache-switched"
    seed_files = sorted(p.relative_to(seed_cache) for p in seed_cache.rglob("*.npy"))
    our_files = sorted(p.relative_to(our_cache) for p in our_cache.rglob("*.npy"))
    assert bool(seed_files) == cached and seed_files == our_files
    for name in seed_files:
        assert (seed_cache / name).read_bytes() == (our_cache / name).read_bytes(), name


@pytest.fixture
def offline_hub(tokenizer_files: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks read "gpt2" from the Hub cache the tokenizer files hold (the seed's
    GPT2BPETokenizer asks the Hub for it), offline."""
    for name, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HOME", tokenizer_files["hub_home"])


@pytest.fixture
def inputs(
    corpus: str,
    code_corpus: tuple[str, str],
    chat_jsonl: tuple[str, str],
    tokenizer_files: dict[str, str],
    tokenized: Callable[[str, int, int], str],
) -> dict[str, Any]:
    return {"corpus": corpus, "code": code_corpus, "chat": chat_jsonl, "files": tokenizer_files,
            "tokenized": tokenized}  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "job", "iteration"),
    [
        pytest.param(TP2, "gpt", 0, id="tp2-dp2"),
        # the other jobs take minutes each (two 4-rank runs): `make test-slow` runs them
        pytest.param([*TP2, *CP2], "gpt", 0, id="tp2-cp2", marks=pytest.mark.slow),
        pytest.param(TP2, "fim", 0, id="fim-tp2-dp2", marks=pytest.mark.slow),
        pytest.param(TP2, "sft", 0, id="sft-tp2-dp2", marks=pytest.mark.slow),
        # resumed in the second phase, 2 of its 4 iterations taken
        pytest.param(TP2, "phases", 6, id="phases-tp2-dp2", marks=pytest.mark.slow),
        pytest.param(TP2, "hf", 0, id="hf-tp2-dp2", marks=pytest.mark.slow),
    ],
)
def test_the_switched_data_path_gives_the_seed_commit_s_batches_on_every_rank(
    checkouts: dict[str, Path],
    inputs: dict[str, Any],
    tmp_path: Path,
    layout: list[str],
    job: str,
    iteration: int,
) -> None:
    """``fim``: the switched run builds megaindex's GPTFIMDataset from megaindex's
    GPTFIMDatasetConfig (the seed runs Megatron-LM's); ``sft``: megaindex's SFTDataset from
    megaindex's GPTDatasetConfig, with an SFT tokenizer that has no pad token; ``hf``: the
    tokenizer's pad is None."""
    results = run_both(checkouts, [*layout, *job_flags(job, inputs)], tmp_path, iteration)
    assert_same_batches(results, tmp_path, cached=job != "sft")


@pytest.mark.usefixtures("offline_hub")
@pytest.mark.slow  # minutes each: `make test-slow`
@pytest.mark.parametrize("seed", [2701, 2702])
def test_seeded_random_tokenizers_and_jsonl_give_the_seed_commit_s_batches(
    checkouts: dict[str, Path], inputs: dict[str, Any], tmp_path: Path, seed: int
) -> None:
    layout, flags = random_job(seed, inputs)
    assert_same_batches(run_both(checkouts, [*layout, *flags], tmp_path), tmp_path)


#: hybrid context parallelism with Megatron's defaults where the seed runs them: packed
#: conversations (the only samples with the ``cu_seqlens`` its wrapper splits), two a
#: micro-batch, each sub-sequence dealt at most 32 tokens a rank; CP 4, so that the seed's
#: SFTDataset pads each conversation to a multiple of 8, which a sub-sequence split over up
#: to 4 ranks needs (unpadded, the seed's get_batch fails on it)
HYBRID_CP = ["--hybrid-context-parallel", "--calculate-per-token-loss",
             "--max-seqlen-per-dp-cp-rank", "32", "--micro-batch-size", "2",
             "--context-parallel-size", "4"]  # fmt: skip


@pytest.mark.slow
def test_hybrid_context_parallel_with_megatron_s_defaults_gives_the_seed_commit_s_batches(
    checkouts: dict[str, Path], inputs: dict[str, Any], tmp_path: Path
) -> None:
    """``--hybrid-context-parallel`` on 4 ranks at tensor-parallel size 1 (CP 4), with
    ``--micro-batch-size 2``: training.py's wrapper (megadist.megatron's, switched) schedules
    each global batch's sub-sequences over the ranks and get_batch gives each rank its share:
    on every rank and step the schedule, the sub-sequences handed over and each get_batch share
    equal the seed's. The seed's get_batch raises on a sub-sequence as its wrapper hands it (an
    IndexError, see hybrid_rank_pipeline); ours refuses it too, with a BatchError naming the
    shape it needs. The attention mask stays off: the seed's SFTDataset, the one dataset whose
    samples hybrid CP can split, asserts it is (megaindex's refuses it when built)."""
    results = run_both(checkouts, [*job_flags("sft", inputs), *HYBRID_CP], tmp_path, hybrid=True)
    assert all(rank["batches"]["train"] for rank in results["seed"])  # each rank had a share
    assert_same_batches(results, tmp_path, cached=False)
    for seed_rank, our_rank in zip(results["seed"], results["switched"], strict=True):
        where = f"rank {seed_rank['rank']}"
        assert (seed_rank["raw_get_batch"], our_rank["raw_get_batch"]) == (
            "IndexError",
            "BatchError",
        ), where
        for step, ((seed_groups, theirs), (our_groups, ours)) in enumerate(
            zip(seed_rank["schedules"], our_rank["schedules"], strict=True)
        ):
            assert seed_groups == our_groups and theirs.keys() == ours.keys(), (where, step)
            for sample_id, values in theirs.items():
                assert values.keys() == ours[sample_id].keys(), (where, step, sample_id)
                for key, value in values.items():
                    numpy.testing.assert_array_equal(
                        value, ours[sample_id][key], err_msg=f"{where}, step {step}, {key}"
                    )


@pytest.mark.slow
def test_hybrid_context_parallel_above_tensor_parallel_size_1_is_refused_naming_the_flag(
    checkouts: dict[str, Path], inputs: dict[str, Any], tmp_path: Path
) -> None:
    """At tensor-parallel size 2 the seed's get_batch would size the other TP rank's buffers
    for ``--micro-batch-size`` rows where a hybrid-CP micro-batch is one sub-sequence, and
    corrupt the batch: the switched run refuses on every rank, naming the flag and the fix."""
    hybrid = [*job_flags("sft", inputs), *HYBRID_CP, *TP2, "--context-parallel-size", "1"]
    argv = full_argv(hybrid, tmp_path)
    with pytest.raises(RuntimeError) as refused:
        run_distributed(hybrid_rank_pipeline, 4, str(checkouts["switched"]), argv, STEPS,
                        timeout=600, group_timeout=300)  # fmt: skip
    message = str(refused.value)
    for rank in range(4):
        assert f"rank {rank}:" in message
    assert message.count("TopologyError: --hybrid-context-parallel with --micro-batch-size 2 at "
                         "tensor-parallel size 2") == 4  # fmt: skip
    assert "give --micro-batch-size 1 (or tensor-parallel size 1)" in message


def test_pretrain_gpt_s_fim_and_sft_datasets_come_from_megaindex(
    checkouts: dict[str, Path],
) -> None:
    """The switched pretrain_gpt.py imports GPTFIMDataset, GPTFIMDatasetConfig and SFTDataset
    from megaindex (``--sft`` builds SFTDataset with the GPTDatasetConfig, megaindex's too);
    nothing else it imports from megatron.training.datasets is left."""
    seed = (checkouts["seed"] / "pretrain_gpt.py").read_text()
    switched = (checkouts["switched"] / "pretrain_gpt.py").read_text()
    for line in (
        "from megatron.training.datasets.fim_dataset import GPTFIMDataset, GPTFIMDatasetConfig\n",
        "from megatron.training.datasets.sft_dataset import SFTDataset\n",
    ):
        assert line in seed and line not in switched
    assert "megatron.training.datasets" not in switched
    added = set(switched.splitlines(keepends=True)) - set(seed.splitlines(keepends=True))
    assert {
        "from megaindex import GPTFIMDataset, GPTFIMDatasetConfig\n",
        "from megaindex import SFTDataset\n",
    } <= added


def test_training_py_s_hybrid_cp_wrapper_comes_from_megadist(
    checkouts: dict[str, Path], tmp_path: Path
) -> None:
    """The switched training.py imports megadist.megatron's HybridCPDataLoaderWrapper (its use
    is left as it is); a training.py without the import (an older checkout) still switches.
    The wrapper's samples under Megatron's groups: test_hybrid_cp_compat.py."""
    from megadist import HybridCPDataLoaderWrapper, megatron

    old = "from megatron.core.datasets.data_schedule import HybridCPDataLoaderWrapper\n"
    new = "from megadist.megatron import HybridCPDataLoaderWrapper\n"
    use = "iter(HybridCPDataLoaderWrapper(train_data_iterator, config))"
    seed = (checkouts["seed"] / "megatron/training/training.py").read_text()
    switched = (checkouts["switched"] / "megatron/training/training.py").read_text()
    assert old in seed and new not in seed
    assert new in switched and old not in switched
    assert use in seed and use in switched
    added = set(switched.splitlines(keepends=True)) - set(seed.splitlines(keepends=True))
    assert added == {new, "from megaload.megatron import cyclic_iter\n"}
    assert issubclass(megatron.HybridCPDataLoaderWrapper, HybridCPDataLoaderWrapper)
    training = next(s for s in SWITCHES if s.path.endswith("training.py"))
    older = tmp_path / "training.py"
    older.write_text("import os\n\n\ndef cyclic_iter(iterable):\n    yield from iterable\n")
    expected = "import os\n\n\nfrom megaload.megatron import cyclic_iter\n"
    assert switched_text(older, training) == expected
