"""Sample construction against a plain loop written from the documented semantics."""

import itertools
from types import SimpleNamespace

import numpy
import pytest
import torch

from megaindex.sample import SampleMaker

EOD, PAD = 7, -1


def reference(
    text,
    extra,
    reset_position_ids,
    reset_attention_mask,
    eod_mask_loss,
    create_attention_mask,
    padding_sample,
    pad=PAD,
):
    """One token at a time: every EOD ends a document; resets start a new one after it."""
    text = list(text)
    tokens = text[:-1] if extra else text
    labels = text[1:] if extra else [*text[1:], pad]
    length = len(tokens)
    loss = [1.0] * length
    positions = list(range(length))
    allowed = [[c <= r for c in range(length)] for r in range(length)]
    start = 0
    for r in range(length):
        if reset_position_ids:
            positions[r] = r - start
        if reset_attention_mask:
            for c in range(start):
                allowed[r][c] = False
        if tokens[r] == EOD:
            if eod_mask_loss:
                loss[r] = 0.0
            start = r + 1
    for i in range(length):
        if labels[i] == pad:
            loss[i] = 0.0
    if padding_sample:
        loss = [0.0] * length
    out = {
        "tokens": [0 if t == pad else t for t in tokens],
        "labels": [0 if t == pad else t for t in labels],
        "loss_mask": loss,
        "position_ids": positions,
    }
    if create_attention_mask:
        out["attention_mask"] = [[not a for a in row] for row in allowed]
    return out


FLAGS = list(itertools.product([False, True], repeat=5))


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join("1" if x else "0" for x in f))
def test_every_flag_combination(flags):
    extra, reset_positions, reset_mask, eod_loss, create_mask = flags
    rng = numpy.random.default_rng(sum(b << i for i, b in enumerate(flags)))
    length = 24
    config = SimpleNamespace(
        sequence_length=length,
        add_extra_token_to_sequence=extra,
        tokenizer=SimpleNamespace(eod=EOD),
        reset_position_ids=reset_positions,
        reset_attention_mask=reset_mask,
        eod_mask_loss=eod_loss,
        create_attention_mask=create_mask,
    )
    make = SampleMaker(config, PAD)
    for trial in range(6):
        text = rng.integers(0, 10, length + int(extra))
        if trial % 2:
            text[-int(rng.integers(1, 6)) :] = PAD  # a padded sample
        padding_sample = trial == 5
        expected = reference(
            text, extra, reset_positions, reset_mask, eod_loss, create_mask, padding_sample
        )
        sample = make(text.astype(numpy.int64), padding_sample=padding_sample)
        keys = (
            ["tokens", "labels"]
            + (["attention_mask"] if create_mask else [])
            + ["loss_mask", "position_ids"]
        )
        assert list(sample) == keys
        assert sample["tokens"].dtype == torch.int64 and sample["labels"].dtype == torch.int64
        assert sample["loss_mask"].dtype == torch.float32
        assert sample["position_ids"].dtype == torch.int64
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert sample[key].tolist() == expected[key], key
        if create_mask:
            assert sample["attention_mask"].dtype == torch.bool
            assert sample["attention_mask"].shape == (1, length, length)
            assert sample["attention_mask"][0].tolist() == expected["attention_mask"]


def mask_config(**changes):
    """A configuration of 8-token samples with a data-independent (causal) attention mask."""
    settings = dict(
        sequence_length=8,
        add_extra_token_to_sequence=True,
        tokenizer=SimpleNamespace(eod=EOD),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=True,
    )
    return SimpleNamespace(**{**settings, **changes})


def test_the_data_independent_mask_is_built_once():
    make = SampleMaker(mask_config(), PAD)
    first = make(numpy.arange(9, dtype=numpy.int64))
    second = make(numpy.arange(9, dtype=numpy.int64))
    assert first["attention_mask"] is second["attention_mask"]
    assert first["loss_mask"] is not second["loss_mask"]


def test_datasets_of_equal_settings_share_one_maker_and_its_cached_tensors():
    """A blend of thousands of corpora builds its position ids and causal mask once (an S x S
    mask per corpus would not fit), not once per corpus; other settings get their own."""
    first, second = SampleMaker.shared(mask_config(), PAD), SampleMaker.shared(mask_config(), PAD)
    assert first is second
    text = numpy.arange(9, dtype=numpy.int64)
    alone = SampleMaker(mask_config(), PAD)(text.copy())
    for key, value in first(text).items():
        assert torch.equal(value, alone[key]), key
    unhashable = mask_config(tokenizer=SimpleNamespace(eod=numpy.array(EOD)))
    assert SampleMaker.shared(unhashable, PAD).settings[3] == EOD  # its own maker, unshared
    others = [
        SampleMaker.shared(mask_config(sequence_length=16), PAD),
        SampleMaker.shared(mask_config(), PAD + 1),
        SampleMaker.shared(mask_config(tokenizer=SimpleNamespace(eod=EOD + 1)), PAD),
        SampleMaker.shared(mask_config(eod_mask_loss=True), PAD),
    ]
    assert all(other is not first for other in others)
    assert len({id(other) for other in others}) == len(others)
