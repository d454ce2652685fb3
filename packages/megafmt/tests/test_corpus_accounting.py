"""What megafmt declares of a dataset's per-corpus accounts (``CorpusAccounting``): the
comparison of two records of a corpus's order, which megaindex and megaload both refuse a
resume on."""

from megafmt.protocols import changed_order_setting


def test_the_first_changed_setting_of_two_corpus_orders_is_named():
    saved = {"dataset_path": "/d/a", "random_seed": 1, "sequence_length": 8}
    assert changed_order_setting(saved, dict(saved)) is None
    assert changed_order_setting(saved, {**saved, "sequence_length": 4, "random_seed": 2}) == (
        "random_seed"  # the saved record's order
    )
    assert changed_order_setting(saved, {**saved, "num_epochs": 2}) == "num_epochs"  # added
    assert changed_order_setting({**saved, "split": "1"}, saved) == "split"  # removed
