"""Each corpus's consumption in a loader's state, and the check that a run resumed under a new
mix continues exactly where the state left every corpus.

The dataset accounts for its corpora (megafmt's ``CorpusAccounting``: megaindex's blends); the
loader records the accounts at each ``state_dict()`` under ``mix``. With
``DataLoaderConfig.resume_with_new_mix`` a state may be restored over another blend, but only
one that, at the saved consumed count, reports for every corpus exactly the saved count: the
blend resumed from that very state (megaindex's ``resume_with_new_mix`` config field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megafmt.protocols import CorpusAccounting, changed_order_setting, split_name
from megaload.checks import COUNT, MAPPING, check_state
from megaload.errors import ResumeError


def mix_state(dataset: Any, consumed_samples: int) -> dict[str, Any] | None:
    """Where each corpus stands once ``consumed_samples`` were consumed; None for a dataset
    that keeps no accounts."""
    if isinstance(dataset, CorpusAccounting):
        return dataset.mix_state(consumed_samples)
    return None


def _records(mix: Any, where: str) -> Mapping[str, Mapping[str, Any]]:
    """The per-corpus records of a ``mix`` (``where`` names it in errors), after checking
    that each holds its consumed count."""
    check_state(mix, {"corpora": MAPPING}, where)
    for name, record in mix["corpora"].items():
        check_state(record, {"consumed": COUNT}, f"{where}['corpora'][{name!r}]")
    return mix["corpora"]


def consumed_counts(mix: Mapping[str, Any], where: str = "loader state['mix']") -> dict[str, int]:
    """Per corpus prefix, the samples it gave, from a state's ``mix``."""
    return {name: int(record["consumed"]) for name, record in _records(mix, where).items()}


def check_resumed_mix(dataset: Any, state: Mapping[str, Any]) -> None:
    """Refuse, naming the corpus, a dataset that does not continue every corpus of ``state``
    at its next unseen sample."""
    if state["mix"] is None:
        raise ResumeError(
            "the loader state records no per-corpus consumption ('mix' is None: it was saved "
            "over a dataset that keeps no accounts, or by megaload before state version 4); "
            "resume_with_new_mix cannot know where each corpus stopped"
        )
    if state["sampler"] != "single":
        raise ResumeError(
            f"the state was saved by the {state['sampler']!r} sampler; resume_with_new_mix "
            "continues a sequential ('single') run, which consumed a prefix of each corpus"
        )
    if not isinstance(dataset, CorpusAccounting):
        raise ResumeError(
            f"resume_with_new_mix needs a dataset that accounts for its corpora "
            f"(megafmt.protocols.CorpusAccounting); got {type(dataset).__name__}"
        )
    consumed = int(state["consumed_samples"])
    try:
        mine = dataset.mix_state(consumed)
    except IndexError as error:
        raise ResumeError(
            f"the dataset does not continue the state's {consumed} consumed samples: {error}"
        ) from error
    if mine is None:
        raise ResumeError(f"{type(dataset).__name__} keeps no per-corpus accounts")
    before = consumed_counts(state["mix"])
    after = consumed_counts(mine, f"{type(dataset).__name__}.mix_state()")
    split = split_name(dataset)
    for name in sorted(set(before) | set(after)):
        if before.get(name, 0) == after.get(name, 0):
            continue
        where = (
            f"corpus {name} gave {before.get(name, 0)} samples before the state was saved, "
            f"the dataset continues it at sample {after.get(name, 0)}"
        )
        if split in ("valid", "test"):
            raise ResumeError(
                f"{where}: this loader reads the {split} split, and resume_with_new_mix "
                f"continues the training split only (megaindex resumes only the training "
                f"blend from a state); restore the {split} loader's state over its saved "
                f"{split} data, or build it afresh from consumed_samples 0"
            )
        raise ResumeError(
            f"{where}: build the blend with resume_with_new_mix set to this state (megaindex's "
            "config field)"
        )
    _check_orders(state["mix"]["corpora"], mine["corpora"])


def _check_orders(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Refuse, naming the corpus and the setting, a dataset that serves a corpus in another
    order than the state recorded (another seed, sequence length, split): its counts agree
    with the state's, but the samples it continues with are not the ones left unseen."""
    for name in sorted(set(saved) & set(mine)):
        before, now = saved[name].get("order"), mine[name].get("order")
        if not isinstance(before, Mapping) or not isinstance(now, Mapping):
            continue  # not recorded (a Megatron-LM checkpoint's counts): not checked
        setting = changed_order_setting(before, now)
        if setting is not None:
            raise ResumeError(
                f"corpus {name}: its {setting} was {before.get(setting)!r} when the state was "
                f"saved and is {now.get(setting)!r} in this dataset, so its samples come in "
                "another order (some already trained on would come again); keep the corpus's "
                "settings"
            )
