"""The records megatron-core's GPTDataset and BlendedDataset log, under its logger names, when
their tables are built, loaded from the cache, or deferred (the comparison with the seed
commit's own records is tests/compat/test_prepare_cache_compat.py)."""

import logging

import pytest

from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, MockGPTDataset

GPT = "megatron.core.datasets.gpt_dataset"
BLENDED = "megatron.core.datasets.blended_dataset"


def records(caplog, make_config, sizes, **overrides):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="megatron.core.datasets"):
        config = make_config(**overrides)
        BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    return [(r.name, r.getMessage()) for r in caplog.records if r.name in (GPT, BLENDED)]


def test_a_build_then_a_hit_log_as_megatron_logs_them(caplog, make_config):
    built = records(caplog, make_config, [100, None, None], split="100,0,0")
    assert built[0] == (GPT, "Build and save the GPTDataset train indices")
    assert built[-1][1].startswith("> total number of epochs: ")
    hit = records(caplog, make_config, [100, None, None], split="100,0,0")
    assert hit[0] == (GPT, "Load the GPTDataset train indices")
    assert [m.split(" from ")[0] for _, m in hit[1:4]] == [
        "\tLoad the document index", "\tLoad the sample index", "\tLoad the shuffle index"
    ]  # fmt: skip
    assert hit[-1] == built[-2]  # the same "> total number of samples: N"


def test_deferred_tables_log_nothing_until_used(caplog, make_config):
    records(caplog, make_config, [50, None, None], split="100,0,0")
    deferred = records(caplog, make_config, [50, None, None], split="100,0,0",
                       defer_npy_index_mmap=True)  # fmt: skip
    assert deferred == []


def test_only_global_rank_zero_logs(caplog, make_config, monkeypatch: pytest.MonkeyPatch):
    import megaindex.megatron_log as megatron_log

    monkeypatch.setattr(megatron_log, "builds_shared_files", lambda: False)
    assert records(caplog, make_config, [50, None, None], split="100,0,0") == []


def test_with_info_off_only_the_warning_of_tables_kept_in_memory_is_logged(caplog, make_config):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="megatron.core.datasets"):
        cached = make_config(split="100,0,0")
        BlendedMegatronDatasetBuilder(GPTDataset, [50, None, None], lambda: True, cached).build()
        in_memory = make_config(blend=None, split="100,0,0", path_to_cache=None)
        BlendedMegatronDatasetBuilder(
            MockGPTDataset, [50, None, None], lambda: True, in_memory
        ).build()
    logged = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name == GPT]
    assert logged  # one per split of the mock data, and nothing of the corpus's
    assert set(logged) == {
        (
            GPT,
            logging.WARNING,
            "Unable to save MockGPTDataset indexes because path_to_cache is None",
        )
    }
