"""Seeded random dataset configurations, built by megaindex, megatron-core 0.16.1 and the seed
commit's code (testing/seedref.py): the three agree on whether each builds or raises (and the
error's kind), and where they build, on lengths, index tables, cache files and samples.

A case draws every field of ``GPTDatasetConfig`` (and so of ``BlendedMegatronDatasetConfig``),
the sizes asked of each split, and corpora of every shape: one document to thousands, empty and
length-1 documents, documents of several sequences, every token dtype; splits and blends of
every shape, ``sequences_per_dataset`` right, wrong or missing a corpus, ``fast_cache_load`` and
``defer_npy_index_mmap`` over a cache built before (or none), mock data.

CI runs ``FUZZ_COUNT`` cases from ``FUZZ_START`` (default: 24 from 0) plus every seed in
``REGRESSIONS``, seeds that once failed; ``make fuzz`` runs more (``FUZZ_COUNT=500``). A seed is
a whole case: ``FUZZ_START=S FUZZ_COUNT=1`` replays it. Where megaindex differs on purpose
(``KNOWN_DIFFERENCES``), the test checks megaindex's behaviour instead of equality.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import gc
import os
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
from seedref import SeedProcess, SeedRaised

import megaindex
from megafmt import Index, IndexedDatasetBuilder
from megaindex.tokenizer import IdentifiedTokenizer

SEEDSIDE = Path(__file__).parent / "seedside"
sys.path.insert(0, str(SEEDSIDE))
import dataset_fuzz_reference as reference  # noqa: E402 (a seed-side module, run here too)

# megatron-core 0.16.1's BlendedDataset asks torch.distributed for its rank, unguarded
pytestmark = [pytest.mark.compat, pytest.mark.usefixtures("single_process_group")]

START = int(os.environ.get("FUZZ_START", "0"))
COUNT = int(os.environ.get("FUZZ_COUNT", "24"))
#: seeds that once found a difference; they run in CI whatever the range. 474: blend_per_split
#: of only None is mock data, and GPTDataset let an AttributeError escape (now a ConfigError).
#: 61: a rank that builds nothing was asked for the header-dtype warning of a corpus it never
#: opens. 84: token ids past the vocabulary, which megaindex refuses by default (below)
REGRESSIONS: list[int] = [61, 84, 474]

TOKEN_DTYPES = [
    numpy.uint8,
    numpy.int8,
    numpy.int16,
    numpy.uint16,
    numpy.int32,
    numpy.int64,
    numpy.float32,
    numpy.float64,
]
VOCAB_SIZES = [1000, 65499, 65500, 65536, 65537, 100000]
EOD = 100  # fits every dtype

#: ``reason -> predicate(reference outcome)``: the reference raises where megaindex builds, on
#: purpose (each documented in the packages' READMEs)
KNOWN_DIFFERENCES = {
    "megafmt maps a .bin of 0 bytes (a corpus of empty documents); megatron-core cannot": (
        lambda ref: "cannot mmap an empty file" in ref.get("message", "")
    ),
    "a deferred empty dataset has length 0; megatron-core's formula gives -1 and len() fails": (
        lambda ref: "__len__() should return >= 0" in ref.get("message", "")
    ),
}


# ---- drawing a case -----------------------------------------------------------------------------


def _document_lengths(rng: numpy.random.Generator) -> list[list[int]]:
    """Documents as lists of sequence lengths: one to thousands, empty and length-1 ones."""
    shape = rng.choice(["one", "few", "many", "thousands", "empties"], p=[0.1, 0.4, 0.3, 0.1, 0.1])
    count = {"one": 1, "few": int(rng.integers(2, 12)), "many": int(rng.integers(12, 300))}.get(
        shape, int(rng.integers(1000, 3000))
    )
    if shape == "empties":
        count = int(rng.integers(1, 20))
    documents = []
    for _ in range(count):
        sequences = 1 if rng.random() < 0.85 else int(rng.integers(1, 4))
        lengths = []
        for _ in range(sequences):
            kind = rng.random()
            if shape == "empties" or kind < 0.08:
                lengths.append(0 if shape == "empties" or rng.random() < 0.6 else 1)
            elif kind < 0.9:
                lengths.append(int(rng.integers(1, 40)))
            else:
                lengths.append(int(rng.integers(40, 300)))
        documents.append(lengths)
    return documents


def _write_corpus(prefix: str, rng: numpy.random.Generator) -> tuple[int, int]:
    """A corpus of random shape and dtype at ``prefix``; returns its (sequences, documents + 1)."""
    # float corpora build but serve no sample (here and there): drawn rarely
    dtype = TOKEN_DTYPES[int(rng.choice(len(TOKEN_DTYPES), p=[0.16] * 6 + [0.02] * 2))]
    high = 120 if numpy.dtype(dtype).itemsize == 1 else 30000
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    sequences = 0
    documents = _document_lengths(rng)
    for lengths in documents:
        tokens = rng.integers(0, high, sum(lengths))
        for end in numpy.cumsum(lengths):
            if end and rng.random() < 0.7:
                tokens[end - 1] = EOD
        builder.add_document(tokens, lengths)
        sequences += len(lengths)
    builder.finalize(prefix + ".idx")
    return sequences, len(documents) + 1


def _split(rng: numpy.random.Generator) -> str:
    weights = [int(rng.choice([0, 0, 1, 2, 5, 10, 90, 98])) for _ in range(int(rng.integers(1, 4)))]
    if not any(weights):
        weights[0] = 1
    text = ",".join(str(w) for w in weights)
    return text if rng.random() < 0.8 else text.replace(",", "/")


def _blend(rng: numpy.random.Generator, prefixes: list[str], weighted: bool) -> tuple:
    chosen = [prefixes[int(i)] for i in rng.choice(len(prefixes), int(rng.integers(1, 4)))]
    if not weighted:
        return (chosen, None)
    weights = [
        float(rng.choice([0.0, 0.2, 1.0, 3.0]))
        if rng.random() < 0.1
        else float(rng.uniform(0.1, 5))
        for _ in chosen
    ]
    return (chosen, weights)


def _size(rng: numpy.random.Generator, weighted: bool) -> int | None:
    """A split's sample count; rarely None for weighted blends, which refuse it."""
    if rng.random() < (0.05 if weighted else 0.25):
        return None
    return [0, int(rng.integers(1, 20)), int(rng.integers(20, 2000))][int(rng.integers(3))]


def _negative_sizes(rng: numpy.random.Generator, sizes: list[int | None]) -> list[int | None]:
    """Some splits' counts made negative: megatron-core builds one epoch of a corpus for them
    (and refuses them where a blend must draw them)."""
    return [int(rng.choice([-1, -5, -1000])) if rng.random() < 0.12 else size for size in sizes]


def _first_opened(config: dict[str, Any]) -> str:
    """The corpus the builders open first: the first of the first blend."""
    blends = [config.get("blend"), *(config.get("blend_per_split") or [])]
    return next(blend for blend in blends if blend)[0][0]


def draw_case(seed: int, root: str) -> dict[str, Any]:
    """Case ``seed``: its corpora are written under ``root``; the rest is a picklable dict."""
    rng = numpy.random.default_rng(seed)
    prefixes, counts = [], {}
    for number in range(int(rng.integers(1, 4))):
        prefix = os.path.join(root, f"corpus{number}")
        counts[prefix] = _write_corpus(prefix, rng)
        prefixes.append(prefix)

    form = rng.choice(["single", "blend", "per_split", "mock"], p=[0.32, 0.32, 0.32, 0.04])
    weighted = rng.random() < 0.5
    config: dict[str, Any] = {
        "random_seed": int(rng.integers(0, 2**31)),
        "sequence_length": int(rng.choice([1, 2, 3, 8, 16, 31, 64, 128])),
        "num_dataset_builder_threads": int(rng.integers(1, 4)),
        "path_to_cache": os.path.join(root, "cache") if rng.random() < 0.8 else None,
        "mmap_bin_files": bool(rng.random() < 0.8),
        "mid_level_dataset_surplus": float(rng.choice([0.005, 0.0, 0.05, 0.3])),
        "allow_ambiguous_pad_tokens": bool(rng.random() < 0.2),
        "reset_position_ids": bool(rng.random() < 0.5),
        "reset_attention_mask": bool(rng.random() < 0.5),
        "eod_mask_loss": bool(rng.random() < 0.5),
        "create_attention_mask": bool(rng.random() < 0.7),
        "drop_last_partial_validation_sequence": bool(rng.random() < 0.6),
        "add_extra_token_to_sequence": bool(rng.random() < 0.7),
        "object_storage_cache_path": None,
        "data_parallel_size": int(rng.choice([1, 2, 8])),
        "sequence_parallel_size": int(rng.choice([0, 2])),
        "hybrid_context_parallel": bool(rng.random() < 0.1),
        "context_parallel_size": [None, 1, 2][int(rng.integers(3))],
        "multiple_validation_sets": [None, False, True][int(rng.integers(3))],
        "full_validation": [None, False, True][int(rng.integers(3))],
        "fast_cache_load": False,
        "defer_npy_index_mmap": False,
    }
    if form == "single":
        config["blend"] = ([prefixes[0]], None if rng.random() < 0.8 else [1.0])
        config["split"] = _split(rng)
    elif form == "blend":
        config["blend"] = _blend(rng, prefixes, weighted)
        config["split"] = _split(rng)
    elif form == "per_split":
        config["blend_per_split"] = [
            _blend(rng, prefixes, weighted) if rng.random() < 0.8 else None for _ in range(3)
        ]
    blends = [config.get("blend"), *(config.get("blend_per_split") or [])]
    if any(blend and len(set(blend[0])) < len(blend[0]) for blend in blends):
        # megatron-core's threads race on one corpus listed twice: each writes the same cache
        # files in place while another may load them half written (EOFError, or worse)
        config["num_dataset_builder_threads"] = 1
    if config["path_to_cache"] is not None and rng.random() < 0.3:
        config["defer_npy_index_mmap"] = bool(rng.random() < 0.5)
        config["fast_cache_load"] = form == "per_split" and rng.random() < 0.8
    vocab_size = int(rng.choice(VOCAB_SIZES))
    pad = [None, None, EOD, 7][int(rng.integers(4))]
    tokenizer = {
        "eod": EOD,
        "vocab_size": vocab_size,
        "identifiers": {"class": "FuzzTokenizer", "vocab": vocab_size},
        "pad": pad,
    }

    expect: dict[str, Any] = {}
    reference_overrides: dict[str, Any] = {}
    if (
        form != "mock"
        and any(config.get("blend_per_split") or [config.get("blend")])
        and (rng.random() < 0.35)
    ):
        listed = {prefix: list(count) for prefix, count in counts.items()}
        fault = rng.choice(["none", "none", "sequences", "documents", "missing"])
        victim = _first_opened(config)
        if fault == "sequences":
            listed[victim][0] += int(rng.choice([-1, 1, 5]))
        elif fault == "documents":
            listed[victim][1] += int(rng.choice([-1, 1, 5]))
        elif fault == "missing":
            del listed[victim]
            if not listed:  # an empty list is no list, there and here
                fault = "none"
        config["sequences_per_dataset"] = listed
        expect["counts_fault"] = None if fault == "none" else str(fault)
    sizes = [_size(rng, weighted) for _ in range(3)]
    case = {
        "seed": seed,
        "root": root,
        "mock": form == "mock",
        "config": config,
        "sizes": sizes,
        "tokenizer": tokenizer,
        "prime": bool(
            (config["fast_cache_load"] or config["defer_npy_index_mmap"]) and rng.random() < 0.85
        ),
        "fractions": [float(f) for f in rng.random(4)],
        "reference_overrides": reference_overrides,
        "expect": expect,
        "counts": counts,
    }
    # drawn from a second stream, so the cases drawn before these were added stay the same
    extra = numpy.random.default_rng([seed, 1])
    case["sizes"] = _negative_sizes(extra, sizes)
    # a rank that builds no dataset (is_built_on_rank() False) opens no corpus: the test hides
    # the corpora while the three build, and every split is None, wrong counts or not
    case["built_on_rank"] = bool(extra.random() >= 0.1)
    if not case["built_on_rank"]:
        expect["counts_fault"] = None
    if expect.get("counts_fault") or (
        config.get("sequences_per_dataset") and header_disagrees(case)
    ):
        # megatron-core trusts the list: wrong counts read garbage (past the file, with
        # fast_cache_load), a dtype other than the header's wrong tokens. Without the list
        # it shows what megaindex must build (or refuse before opening a corpus)
        reference_overrides["sequences_per_dataset"] = None
    return case


# ---- running the three --------------------------------------------------------------------------


def build_ours(case: dict) -> dict[str, Any]:
    """megaindex's outcome, its token-id check off: the corpora hold ids up to 30000 whatever
    the vocabulary, which megatron-core reads unchecked (the check has its own tests)."""
    spec = case["tokenizer"]
    tokenizer = IdentifiedTokenizer(
        spec["eod"], spec["vocab_size"], spec["identifiers"], pad=spec["pad"]
    )
    dataset_class = megaindex.MockGPTDataset if case["mock"] else megaindex.GPTDataset
    return reference.outcome(
        lambda: reference.build_with(
            megaindex.BlendedMegatronDatasetBuilder,
            functools.partial(megaindex.GPTDatasetConfig, check_token_ids=False),
            dataset_class,
            tokenizer,
            case,
        ),
        case,
    )


def build_seed(seed_process: SeedProcess, case: dict) -> dict[str, Any]:
    try:
        return seed_process.call("dataset_fuzz_reference:build", case)
    except SeedRaised as raised:  # the harness's own failure, not the case's
        raise AssertionError(f"seed worker failed: {raised}") from None


@contextlib.contextmanager
def corpora_hidden_unless_built(case: dict) -> Iterator[None]:
    """For a rank that builds no dataset, its corpora moved away while it builds: a side that
    opens or checks one fails (megatron-core touches none there)."""
    moved = []
    if not case["built_on_rank"]:
        hidden = os.path.join(case["root"], "hidden")
        os.makedirs(hidden)
        for prefix in case["counts"]:
            for suffix in (".bin", ".idx"):
                away = os.path.join(hidden, os.path.basename(prefix) + suffix)
                os.replace(prefix + suffix, away)
                moved.append((away, prefix + suffix))
    try:
        yield
    finally:
        for away, back in moved:
            os.replace(away, back)


def header_disagrees(case: dict) -> bool:
    """Whether a corpus's header names another dtype than the vocabulary implies."""
    vocab = case["tokenizer"]["vocab_size"]
    assumed = 4 if vocab > 65536 else 8
    config = case["config"]
    blends = [config.get("blend"), *(config.get("blend_per_split") or [])]
    used = {prefix for blend in blends if blend for prefix in blend[0]}
    return any(Index(prefix + ".idx").dtype_code != assumed for prefix in used)


def compare(case: dict, ours: dict, theirs: dict, who: str) -> list[str]:
    """The differences between megaindex's outcome and a reference's (empty: none)."""
    expect = case["expect"]
    fault = expect.get("counts_fault")
    differs_on_purpose = "raised" in theirs and any(
        applies(theirs) for applies in KNOWN_DIFFERENCES.values()
    )
    if fault is not None:
        wanted = "MissingSequenceCountError" if fault == "missing" else "SequenceCountError"
        if wanted in ours.get("raised", []):
            return []
        if "built" in ours:
            return [f"expected {wanted} for a wrong sequences_per_dataset; megaindex built"]
        # megaindex refused the configuration before opening a corpus: as the reference did?
    if "raised" in ours and not {"MegaindexError", "MegafmtError"} & set(ours["raised"]):
        return [f"megaindex let {ours['raised'][0]} escape (not a documented error class)"]
    if "raised" in theirs:
        if "WouldLoopForever" in theirs["raised"]:
            if "EmptySplitError" not in ours.get("raised", []):
                return [f"{who} loops forever; expected megaindex's EmptySplitError, got {ours}"]
            return []
        if differs_on_purpose and "built" in ours:
            return []
        if "raised" not in ours:
            return [f"{who} raised {theirs['raised'][0]}: {theirs['message']}; megaindex built"]
        builtin = next(name for name in theirs["raised"] if hasattr(builtins, name))
        if builtin not in ours["raised"]:
            return [
                f"{who} raised {builtin} ({theirs['message']}); megaindex raised "
                f"{ours['raised'][0]}, not a subclass: {ours['message']}"
            ]
        return []
    if "raised" in ours:
        return [f"{who} built; megaindex raised {ours['raised'][0]}: {ours['message']}"]
    problems = []
    if ours["cache"] != theirs["cache"]:
        problems.append(
            f"cache files differ from {who}'s: {_dict_diff(ours['cache'], theirs['cache'])}"
        )
    for split, (mine, reference_split) in enumerate(
        zip(ours["built"], theirs["built"], strict=True)
    ):
        if mine != reference_split:
            problems.append(
                f"split {split} differs from {who}'s: {_first_difference(mine, reference_split)}"
            )
    return problems


def _dict_diff(a: dict, b: dict) -> str:
    keys = sorted(set(a) ^ set(b))
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    return f"only one side: {keys[:4]}; different: {changed[:4]}"


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: megaindex {str(a)[:300]} vs {str(b)[:300]}"


# ---- the tests ----------------------------------------------------------------------------------

SEEDS = sorted(set(range(START, START + COUNT)) | set(REGRESSIONS))
#: per implementation, how its cases ended ("built", or the class raised)
OUTCOMES: dict[str, Counter] = {
    "megaindex": Counter(),
    "megatron-core": Counter(),
    "seed": Counter(),
}
MISMATCHES: list[int] = []


@pytest.fixture(scope="module")
def seed_process():
    with SeedProcess(paths=[SEEDSIDE]) as process:
        yield process


@pytest.fixture(scope="module", autouse=True)
def report(request):
    """After the run: the seed range and how many cases built, raised, or hit a known
    difference (shown by ``make fuzz``)."""
    yield
    cases = sum(OUTCOMES["megaindex"].values())
    lines = [
        f"dataset fuzz: seeds {START}..{START + COUNT - 1} (+{len(REGRESSIONS)} regressions), "
        f"{cases} cases, {len(MISMATCHES)} with a mismatch {MISMATCHES}"
    ]
    for side, counts in OUTCOMES.items():
        ends = ", ".join(f"{key} {value}" for key, value in counts.most_common())
        lines.append(f"  {side}: {ends}")
    line = "\n".join(lines)
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print(f"\n{line}")


def _kind(outcome: dict) -> str:
    return "built" if "built" in outcome else f"raised {outcome['raised'][0]}"


@pytest.fixture
def garbage_collected_here() -> Iterator[None]:
    """Python's cyclic garbage collected once the test is done, in its teardown: the objects
    of megatron-core's whose ``__init__`` raised (kept in cycles by their tracebacks) are
    deleted under the test's own warning filters, not in whichever later test the collector
    happens to run (their ``__del__`` fails there: a PytestUnraisableExceptionWarning)."""
    yield
    gc.collect()


# megatron-core's IndexedDataset.__del__ fails on an object whose __init__ raised
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.usefixtures("garbage_collected_here")
@pytest.mark.parametrize("seed", SEEDS)
def test_megaindex_agrees_with_both_references(seed, tmp_path, seed_process):
    case = draw_case(seed, str(tmp_path))
    with warnings.catch_warnings(), corpora_hidden_unless_built(case):
        warnings.simplefilter("ignore")
        ours = build_ours(case)
        core = reference.build(case)
        seed_side = build_seed(seed_process, case)
    problems = [
        *compare(case, ours, core, "megatron-core 0.16.1"),
        *compare(case, ours, seed_side, "the seed commit"),
    ]
    listed = case["config"].get("sequences_per_dataset")
    opened = "built" in ours and case["built_on_rank"]  # a rank that builds nothing reads none
    if opened and listed and header_disagrees(case) and not ours["warnings"]:
        problems.append("the header's dtype was used without the warning that says so")
    for side, outcome in (("megaindex", ours), ("megatron-core", core), ("seed", seed_side)):
        OUTCOMES[side][_kind(outcome)] += 1
    if problems:
        MISMATCHES.append(seed)
    assert not problems, f"seed {seed} ({case['config']}, sizes {case['sizes']}): {problems}"


def test_cases_cover_every_config_field(tmp_path):
    """Together, the cases draw every field megatron-core's configuration takes."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MegatronConfig

    drawn = {"tokenizer"}
    for seed in range(40):
        root = tmp_path / str(seed)
        root.mkdir()
        drawn |= set(draw_case(seed, str(root))["config"])
    wanted = {f.name for f in dataclasses.fields(MegatronConfig) if f.init}
    assert wanted <= drawn, sorted(wanted - drawn)
