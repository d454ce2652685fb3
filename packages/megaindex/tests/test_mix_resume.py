"""Per-corpus accounting of blends and the blend resumed under a new mix
(:mod:`megaindex.mix_resume`), through the builder."""

import numpy
import pytest
import torch

from megafmt import IndexedDataset
from megafmt.testing import write_corpus
from megaindex import BlendedMegatronDatasetBuilder, Split
from megaindex.blended_dataset import BlendedDataset
from megaindex.errors import ConfigError
from megaindex.gpt_dataset import GPTDataset
from megaindex.mix_resume import MixResumedBlend, MixState, consumption_from_megatron
from megaindex.phases import PhaseSchedule, build_phase_datasets


@pytest.fixture
def corpora(tmp_path):
    return [
        write_corpus(str(tmp_path / name), documents, seed=number)
        for number, (name, documents) in enumerate([("a", 300), ("b", 200), ("c", 250)])
    ]


@pytest.fixture
def build(make_config):
    def build(prefixes, weights, size, mix=None, **fields):
        settings = {"split": "100,0,0", "sequence_length": 16, **fields}
        config = make_config(blend=(prefixes, weights), resume_with_new_mix=mix, **settings)
        return BlendedMegatronDatasetBuilder("gpt", [size, 0, 0], lambda: True, config).build()[0]

    return build


def stream(dataset, first, end):
    """``(corpus, its sample)`` of samples ``first`` to ``end``."""
    return [(dataset.sample_origin(i)["corpus"], dataset.sample_origin(i)["sample"])
            for i in range(first, end)]  # fmt: skip


def counts(mix):
    return {name: record["consumed"] for name, record in mix["corpora"].items()}


def test_a_blend_accounts_each_corpus_from_its_tables(corpora, build):
    blend = build(corpora, [0.5, 0.2, 0.3], 400)
    assert isinstance(blend, BlendedDataset)
    for consumed in (0, 1, 57, 400):
        served = stream(blend, 0, consumed)
        expected = {name: sum(1 for c, _ in served if c == name) for name in corpora}
        assert counts(blend.mix_state(consumed)) == expected
        for name in corpora:  # each corpus gave its first samples, in its own order
            assert [s for c, s in served if c == name] == list(range(expected[name]))


def test_a_megatron_checkpoint_gives_the_same_counts(corpora, build):
    blend = build(corpora, [3, 1, 2], 500)
    for consumed in (0, 13, 499):
        expected = counts(blend.mix_state(consumed))
        assert consumption_from_megatron(corpora, [3, 1, 2], consumed) == expected
        state = MixState.from_megatron(corpora, [3, 1, 2], consumed)
        resumed = build(corpora, [3, 1, 2], 500, state)  # continues Megatron's blend
        assert stream(resumed, consumed, 500) == stream(blend, consumed, 500)


def test_a_resume_without_change_serves_what_the_blend_serves(corpora, build):
    blend = build(corpora, [0.5, 0.2, 0.3], 300)
    state = MixState(consumed_samples=120, **blend.mix_state(120))
    resumed = build(corpora, [0.5, 0.2, 0.3], 300, state)
    assert isinstance(resumed, MixResumedBlend)
    assert stream(resumed, 120, 300) == stream(blend, 120, 300)
    with pytest.raises(IndexError, match="sample 119 is outside the resumed run's samples"):
        resumed[119]


def test_a_resumed_blend_reads_a_batch_as_its_samples_one_by_one(corpora, build):
    first = build(corpora[:2], [0.7, 0.3], 200)
    resumed = build(corpora, [1, 1, 1], 300, MixState(consumed_samples=90, **first.mix_state(90)))
    indices = [90, 140, 91, 299, 200, 95]
    batch = resumed.__getitems__(indices).collated
    samples = [resumed[idx] for idx in indices]
    assert len(set(batch["dataset_id"].tolist())) == 3  # every corpus gives rows
    for key in batch:
        assert torch.equal(batch[key], torch.stack([torch.as_tensor(s[key]) for s in samples]))
    with pytest.raises(IndexError, match="sample 89 is outside the resumed run's samples"):
        resumed.__getitems__([90, 89])


def test_a_new_mix_continues_each_corpus_and_a_removed_one_returns(corpora, build):
    first = build(corpora[:2], [0.7, 0.3], 200)
    state = MixState(consumed_samples=100, **first.mix_state(100))
    before = counts(first.mix_state(100))
    second = build(corpora[1:], [1, 1], 300, state)  # 'a' removed, 'c' added
    served = stream(second, 100, 300)
    b = [s for c, s in served if c == corpora[1]]
    assert b == list(range(before[corpora[1]], before[corpora[1]] + len(b)))
    assert [s for c, s in served if c == corpora[2]] == list(range(len(served) - len(b)))
    assert abs(len(b) - 100) <= 1  # the new weights, within the greedy rule's error
    after = second.mix_state(300)
    assert counts(after)[corpora[0]] == before[corpora[0]]  # kept where it stopped
    third = build(corpora, [1, 1, 1], 400, MixState(consumed_samples=300, **after))
    a = [s for c, s in stream(third, 300, 400) if c == corpora[0]]
    assert a[0] == before[corpora[0]] and a == list(range(a[0], a[0] + len(a)))


def test_resuming_is_a_pure_function_of_state_and_config(corpora, build):
    state = MixState(consumed_samples=50, **build(corpora, [1, 2, 3], 200).mix_state(50))
    one = build(corpora[::-1], [2, 1, 1], 260, state)
    two = build(corpora[::-1], [2, 1, 1], 260, state)
    assert stream(one, 50, 260) == stream(two, 50, 260)
    assert one.unique_description_hash == two.unique_description_hash


@pytest.mark.parametrize(
    ("field", "value"), [("random_seed", 7), ("sequence_length", 12), ("split", "90,10,0")]
)
def test_a_corpus_in_another_order_is_refused(corpora, build, field, value):
    state = MixState(consumed_samples=50, **build(corpora[:2], [1, 1], 200).mix_state(50))
    with pytest.raises(ConfigError, match=rf"corpus {corpora[0]}: its {field} was"):
        build(corpora[:2], [1, 2], 200, state, **{field: value})


def test_a_state_past_the_new_blend_or_a_bad_record_is_refused(corpora, build):
    blend = build(corpora[:2], [1, 1], 200)
    state = MixState(consumed_samples=200, **blend.mix_state(200))
    with pytest.raises(ConfigError, match="the run consumed 200 samples, the new blend holds 150"):
        build(corpora[:2], [1, 1], 150, state)
    record = {"consumed": -1}
    with pytest.raises(ConfigError, match="holds consumed=-1; expected an integer >= 0"):
        MixState(consumed_samples=1, corpora={"x": record})


def test_a_blend_named_twice_is_refused(corpora):
    with pytest.raises(ConfigError, match="names corpus .* twice"):
        consumption_from_megatron([corpora[0], corpora[0]], [1, 1], 10)


def test_the_counts_follow_the_greedy_rule_for_any_count(corpora, build):
    weights = [0.25, 0.25, 0.5]
    blend = build(corpora, weights, 200)
    table = numpy.asarray(blend.dataset_index)
    for consumed in (3, 77, 200):
        expected = numpy.bincount(table[:consumed], minlength=3).tolist()
        assert list(consumption_from_megatron(corpora, weights, consumed).values()) == expected


@pytest.mark.parametrize("continue_corpora", [False, True])
def test_phases_continue_each_corpus_only_when_asked(corpora, make_config, continue_corpora):
    a, b, c = corpora
    schedule = PhaseSchedule.parse([f"0:0.5 {a} 0.5 {b}", f"3:1 {b} 3 {c}", f"7:2 {a} 1 {c}"])
    config = make_config(blend=schedule.phases[0].blend, split="100,0,0", sequence_length=16)
    built = build_phase_datasets(
        GPTDataset, schedule, config, 8, 80, [0, 0], continue_corpora=continue_corpora
    )
    served = {name: [] for name in corpora}
    for count, (train, _, _) in zip(schedule.train_samples(8, 80), built, strict=True):
        for corpus, sample in stream(train, 0, count):
            served[corpus].append(sample)
    if continue_corpora:  # each corpus once, in its own order, across the transitions
        assert all(samples == list(range(len(samples))) for samples in served.values())
    else:  # each phase starts its corpora over, as each of Megatron-LM's launches does
        assert served[b][:12] == list(range(12)) and served[b][12:15] == [0, 1, 2]


def test_a_corpus_whose_epochs_change_is_refused(corpora, build):
    state = MixState(consumed_samples=100, **build(corpora[:2], [1, 1], 200).mix_state(100))
    with pytest.raises(ConfigError, match=rf"corpus {corpora[1]}: its num_epochs was 1 when"):
        build(corpora[:2], [1, 100], 3000, state)


def test_a_corpus_keeps_the_tables_it_was_built_with_where_they_suffice(corpora, build):
    first = build(corpora[:2], [1, 1], 1000)  # each corpus built for 503 samples
    state = MixState(consumed_samples=100, **first.mix_state(100))
    assert state.corpora[corpora[0]]["num_samples"] == first.datasets[0].num_samples
    resumed = build(corpora[:2], [1, 3], 300, state)  # a smaller share: the same tables
    assert [d.unique_description_hash for d in resumed.datasets] == [
        d.unique_description_hash for d in first.datasets
    ]


def test_a_corpus_read_through_a_credentialed_url_is_named_without_them(tmp_path, make_config):
    """The state names a corpus as its description does (no secret), and a resume finds the
    record under that name: the corpora continue at the blend's own next samples (hand-checked:
    a 50/50 blend gives each corpus samples 0..29 in its first 60)."""
    config = make_config(split="100,0,0", sequence_length=16)
    parts = []
    for number, name in enumerate("ab"):
        source = IndexedDataset(write_corpus(str(tmp_path / name), 200, seed=number))
        url = f"s3://AKIA:secret@bucket/{name}"
        indices = numpy.arange(len(source), dtype=numpy.int32)
        parts.append(GPTDataset(source, url, indices, 150, Split.train, config))
    blend = BlendedDataset(parts, [0.5, 0.5], 200, config)
    mix = blend.mix_state(60)
    assert counts(mix) == {"s3://***@bucket/a": 30, "s3://***@bucket/b": 30}
    resumed = MixResumedBlend(parts, [0.5, 0.5], 200, MixState(consumed_samples=60, **mix))
    assert [origin[1] for origin in stream(resumed, 60, 64)] == [30, 30, 31, 31]
    assert counts(resumed.mix_state(64)) == {"s3://***@bucket/a": 32, "s3://***@bucket/b": 32}


def test_a_state_worked_out_from_blend_arguments_is_the_one_resumed_blends_record(corpora, build):
    """MixState.after (a switched Megatron-LM's checkpoints, which record only the launch's
    blend, the state it resumed from and the consumed count) along a chain of changes."""
    first = build(corpora[:2], [0.7, 0.3], 200)
    state = MixState.from_megatron(corpora[:2], [0.7, 0.3], 80)
    assert counts(first.mix_state(80)) == counts(vars(state))
    chain = [(corpora[1:], [1, 1], 300, 170), (corpora, [1, 3, 1], 400, 260),
             (corpora, [1, 3, 1], 400, 330), (corpora[:1], [1], 500, 420)]  # fmt: skip
    for prefixes, weights, size, consumed in chain:
        resumed = build(prefixes, weights, size, state)
        state = state.after(prefixes, weights, consumed)
        recorded = resumed.mix_state(consumed)  # with each corpus's order, not checked here
        assert counts(recorded) == counts(vars(state))
        assert recorded["segment"] == state.segment
    with pytest.raises(ConfigError, match="the run consumed 10 samples, fewer than the 420"):
        state.after(corpora, [1, 1, 1], 10)


def test_the_same_corpus_under_another_spelling_is_refused_not_started_again(corpora, build):
    state = MixState(consumed_samples=60, **build(corpora[:2], [1, 1], 200).mix_state(60))
    folder, name = corpora[0].rsplit("/", 1)
    for spelling in (
        f"{folder}/./{name}",
        f"{folder}//{name}",
        f"{folder}/../{folder.rsplit('/', 1)[1]}/{name}",
    ):
        with pytest.raises(ConfigError, match=rf"is the state's corpus {corpora[0]} under another"):
            build([spelling, corpora[1]], [1, 1], 200, state)


def test_a_resumed_blend_refuses_a_weight_of_zero_its_rule_would_still_draw_from(corpora, build):
    state = MixState(consumed_samples=60, **build(corpora, [1, 1, 1], 200).mix_state(60))
    # refused by the builder, before any corpus is opened (as any blend's weight of 0)
    match = rf"the weight of '{corpora[0]}' is 0; .*leave the corpus out of the blend"
    with pytest.raises(ConfigError, match=match):
        build(corpora, [0, 1, 1], 200, state)
    # and by the resumed blend itself, made without the builder
    parts = build(corpora, [1, 1, 1], 200).datasets
    match = rf"gives corpus {corpora[0]} the weight 0.*leave the corpus out of the blend"
    with pytest.raises(ConfigError, match=match):
        MixResumedBlend(parts, [0, 1, 1], 200, state)
    # a run that happened (a Megatron-LM checkpoint's blend) drew from it: its record stands
    assert state.after(corpora, [0, 1, 1], 100).consumed_samples == 100
    # left out, it is not drawn, and keeps its count for a later blend
    resumed = build(corpora[1:], [1, 1], 200, state)
    assert corpora[0] not in {corpus for corpus, _ in stream(resumed, 60, 200)}
    assert counts(resumed.mix_state(200))[corpora[0]] == state.corpora[corpora[0]]["consumed"]


@pytest.mark.parametrize(
    ("mix", "match"),
    [
        ({"corpora": {"x": {"consumed": "18"}}}, r"consumed='18'; expected an integer"),
        ({"corpora": {"x": {"consumed": 18.0}}}, r"consumed=18.0; expected an integer"),
        ({"corpora": {"x": {"consumed": True}}}, r"consumed=True; expected an integer"),
        ({"corpora": {"x": 7}}, r"corpus 'x' is 7; expected a mapping"),
        ({"corpora": {"x": {"consumed": 1, "order": 3}}}, r"order=3; expected a mapping"),
        ({"corpora": [1]}, r"corpora is a list; expected a mapping"),
        ({"segments": {}}, r"'mix' is .*expected a mapping holding 'corpora'"),
        ({"corpora": {}, "segment": {"start": 0}}, r"segment lacks corpora, weights, offsets"),
        (
            {"corpora": {}, "segment": {"start": 0, "corpora": 5, "weights": [], "offsets": []}},
            r"segment\['corpora'\] is 5; expected a list of corpus prefixes",
        ),
        (
            {"corpora": {}, "segment": {"start": 70, "corpora": [], "weights": [], "offsets": []}},
            r"segment\['start'\] is 70; expected an integer from 0 to the consumed_samples 60",
        ),
        (
            {
                "corpora": {},
                "segment": {"start": 0, "corpora": ["x"], "weights": [1.0], "offsets": []},
            },
            r"segment\['offsets'\] is \[\]; expected a list of one entry per corpus",
        ),
        (
            {
                "corpora": {},
                "segment": {
                    "start": 0,
                    "corpora": ["x"],
                    "weights": [float("nan")],
                    "offsets": [0],
                },
            },
            r"segment\['weights'\]\[0\] is nan; expected a finite number >= 0",
        ),
    ],
)
def test_a_damaged_mix_in_a_loader_state_is_refused_naming_the_field(mix, match):
    with pytest.raises(ConfigError, match=match):
        MixState.from_loader_state({"consumed_samples": 60, "mix": mix})


@pytest.mark.parametrize("consumed", [60.9, "60", None, -1])
def test_a_loader_state_s_count_is_taken_as_it_is_not_coerced(consumed):
    with pytest.raises(ConfigError, match="consumed_samples is .*expected an integer >= 0"):
        MixState.from_loader_state({"consumed_samples": consumed, "mix": {"corpora": {}}})
