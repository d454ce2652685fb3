"""Per-corpus accounting of a blend, and a blend that continues a run under a new mix.

Megatron's blend serves sample ``i`` of the run from corpus ``dataset_index[i]``, its sample
``dataset_sample_index[i]``; the greedy rule gives each corpus its samples in its own order
(0, 1, 2, ...), so after ``consumed`` samples a corpus has given exactly its first
``bincount(dataset_index[:consumed])`` samples. The greedy rule never looks ahead, so that count
depends only on the weights and ``consumed`` (:func:`greedy_counts`), which is how a Megatron-LM
checkpoint's ``consumed_train_samples`` and its blend arguments give the same counts
(:func:`consumption_from_megatron`).

:class:`MixResumedBlend` continues a run from a saved per-corpus account (:class:`MixState`)
under a new blend: sample ``start + j`` is drawn by Megatron's greedy rule with the new weights
over ``j`` (the remaining samples), and each corpus gives its next unseen sample. A corpus new
to the run starts at 0; a corpus the state holds but the new blend lacks keeps its count, and
continues from it if a later blend names it again. A corpus is known by its path prefix.

A corpus whose own order changed (another seed, sequence length, split, or sample count that
changes its epochs) cannot continue exactly: it is refused, naming the corpus and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch

from megafmt.protocols import CollatedBatch, changed_order_setting
from megafmt.readers import is_url
from megaindex.batch_merge import merge_rows
from megaindex.errors import ConfigError, IndexBuildError
from megaindex.gpt_dataset import GPTDataset
from megaindex.helpers import build_blending_indices
from megaindex.megatron_dataset import described_path
from megaindex.part_batches import BlendReader
from megaindex.utils import is_count, normalize

#: the unique identifiers of a corpus that do not shape its order (the sample count does only
#: through its epochs, which the order records itself)
_NOT_ORDER = frozenset({"num_samples"})


def greedy_counts(weights: Sequence[float], consumed: int) -> numpy.ndarray:
    """How many samples of each corpus Megatron's greedy blending rule (normalised ``weights``)
    draws in its first ``consumed`` samples."""
    dataset_index = numpy.zeros(consumed, dtype=numpy.int16)
    dataset_sample_index = numpy.zeros(consumed, dtype=numpy.int64)
    if consumed:
        build_blending_indices(
            dataset_index, dataset_sample_index, list(weights), len(weights), consumed, False
        )
    return numpy.bincount(dataset_index, minlength=len(weights))


def consumption_from_megatron(
    prefixes: Sequence[str], weights: Sequence[float], consumed_train_samples: int
) -> dict[str, int]:
    """Each corpus's consumed samples in a Megatron-LM run of the blend ``prefixes`` and
    ``weights`` (its saved ``--data-path`` arguments) that consumed ``consumed_train_samples``
    (its checkpoint's count)."""
    _check_distinct(prefixes, "the blend")
    counts = greedy_counts(normalize(list(weights)), consumed_train_samples)
    return {_named(prefix): int(count) for prefix, count in zip(prefixes, counts, strict=True)}


def corpus_name(dataset: Any) -> str:
    """How the loader state names a corpus: its path prefix as its description records it (a
    URL without its credentials), so that the state holds no secret and a resume under a new
    signature of the same objects finds the corpus's record."""
    return _named(dataset.dataset_path)


def _named(prefix: str) -> str:
    return described_path(prefix) or prefix


def corpus_order(dataset: Any) -> dict[str, Any]:
    """What defines the order of a corpus's samples: its unique identifiers (seed, sequence
    length, split, ...) without the sample count, and the epochs that count gives."""
    if not isinstance(dataset, GPTDataset):
        raise ConfigError(
            f"a run resumed with a new mix continues GPT corpora only; found "
            f"{type(dataset).__name__}"
        )
    identifiers = json.loads(dataset.unique_description)
    order = {k: v for k, v in identifiers.items() if k not in _NOT_ORDER}
    plan = dataset.epoch_plan
    order["num_epochs"] = plan.num_epochs
    order["separate_final_epoch"] = plan.separate_final_epoch
    return order


def corpus_records(
    datasets: Sequence[Any], counts: Sequence[int], carried: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The loader state's ``corpora``: per corpus prefix its consumed samples, its order and the
    sample count its tables were built for, with the ``carried`` records of corpora the blend
    no longer holds."""
    records = {name: dict(record) for name, record in (carried or {}).items()}
    for dataset, count in zip(datasets, counts, strict=True):
        records[corpus_name(dataset)] = {
            "consumed": int(count),
            "order": corpus_order(dataset),
            "num_samples": dataset.num_samples,
        }
    return records


def sample_origin(dataset: Any, sample: int) -> dict[str, Any]:
    """Corpus ``dataset``'s sample ``sample``: its prefix, index and documents."""
    documents = [int(d) for d in dataset.sample_spans(sample)[0]]
    return {"corpus": corpus_name(dataset), "sample": int(sample), "documents": documents}


@dataclass(frozen=True, kw_only=True)
class MixState:
    """Where a run stood, as a loader's ``state_dict()`` saves it (its ``consumed_samples`` and
    ``mix``): each corpus's consumed samples and the order it was served in, and the segment
    of the run under the current blend."""

    consumed_samples: int
    """Samples the run consumed, all ranks together."""
    corpora: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per corpus prefix: ``{"consumed": samples, "order": {...}}`` (no ``order`` where it
    was not recorded, as for a Megatron-LM checkpoint: then it is not checked)."""
    segment: Mapping[str, Any] | None = None
    """The blend the run was under: ``{"start": its first sample, "corpora": prefixes,
    "weights": normalised weights, "offsets": each corpus's count at the start}``. A resume
    under the same corpora and weights continues it, so a restart without a change serves
    exactly what an uninterrupted run would (Megatron's blend, from the first segment)."""

    def __post_init__(self) -> None:
        if not is_count(self.consumed_samples):
            raise ConfigError(
                f"the mix state's consumed_samples is {self.consumed_samples!r}; expected an "
                "integer >= 0"
            )
        if not isinstance(self.corpora, Mapping):
            raise ConfigError(
                f"the mix state's corpora is a {type(self.corpora).__name__}; expected a "
                "mapping of corpus prefix to its record"
            )
        for name, record in self.corpora.items():
            where = f"the saved record of corpus {name!r}"
            if not isinstance(record, Mapping):
                raise ConfigError(f"{where} is {record!r}; expected a mapping")
            if not is_count(record.get("consumed")):
                raise ConfigError(
                    f"{where} holds consumed={record.get('consumed')!r}; expected an integer >= 0"
                )
            if "order" in record and not isinstance(record["order"], Mapping):
                raise ConfigError(f"{where} holds order={record['order']!r}; expected a mapping")
        if self.segment is not None:
            _check_segment(self.segment, self.consumed_samples)

    @classmethod
    def from_loader_state(cls, state: Mapping[str, Any]) -> MixState:
        """The mix state in a loader's saved ``state_dict()``."""
        mix = state.get("mix")
        if mix is None:
            raise ConfigError(
                "the loader state records no per-corpus consumption (its 'mix' is missing or "
                "None): it was saved over a dataset that is not a blend of corpora, or by "
                "megaload before state version 4"
            )
        if not isinstance(mix, Mapping) or "corpora" not in mix:
            raise ConfigError(
                f"the loader state's 'mix' is {mix!r}; expected a mapping holding 'corpora' "
                "(and 'segment'), as the loader's state_dict() records it"
            )
        return cls(
            consumed_samples=state.get("consumed_samples"),
            corpora=mix["corpora"],
            segment=mix.get("segment"),
        )

    @classmethod
    def from_megatron(
        cls, prefixes: Sequence[str], weights: Sequence[float], consumed_train_samples: int
    ) -> MixState:
        """The state of a Megatron-LM run of the blend ``prefixes`` and ``weights`` (its saved
        ``--data-path``) that consumed ``consumed_train_samples`` (its checkpoint's count). The
        corpora's orders were not recorded, so they are not checked: resume with the run's
        seed, sequence length and split."""
        return cls(consumed_samples=0).after(prefixes, weights, consumed_train_samples)

    def after(
        self, prefixes: Sequence[str], weights: Sequence[float], consumed_samples: int
    ) -> MixState:
        """The state of a run resumed from this one under the blend ``prefixes`` and
        ``weights`` once it consumed ``consumed_samples`` (counted from the run's start): what
        :meth:`MixResumedBlend.mix_state` records, worked out from the blend's arguments alone
        (a Megatron-LM checkpoint's saved ones), so that chains of changes compose."""
        names = [_named(prefix) for prefix in prefixes]
        _check_distinct(names, "the blend")
        if consumed_samples < self.consumed_samples:
            raise ConfigError(
                f"the run consumed {consumed_samples} samples, fewer than the "
                f"{self.consumed_samples} of the state it resumed from"
            )
        weights = normalize(list(weights))
        counts = [int(self.corpora.get(name, {}).get("consumed", 0)) for name in names]
        start, offsets = resume_point(self, names, weights, counts)
        totals = numpy.array(offsets, dtype=numpy.int64)
        totals += greedy_counts(weights, consumed_samples - start)
        corpora = {name: dict(record) for name, record in self.corpora.items()}
        for name, total in zip(names, totals.tolist(), strict=True):
            corpora[name] = {**corpora.get(name, {}), "consumed": int(total)}
        return MixState(
            consumed_samples=consumed_samples,
            corpora=corpora,
            segment=segment(names, weights, start, offsets),
        )


def _check_segment(saved: Any, consumed_samples: int) -> None:
    """Refuse, naming the field, a saved segment (:attr:`MixState.segment`) that is not one
    :func:`segment` records: a start within the run, and one prefix, weight and offset per
    corpus."""
    where = "the mix state's segment"
    if not isinstance(saved, Mapping):
        raise ConfigError(f"{where} is {saved!r}; expected a mapping or None")
    missing = [key for key in ("start", "corpora", "weights", "offsets") if key not in saved]
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)}")
    if not is_count(saved["start"]) or saved["start"] > consumed_samples:
        raise ConfigError(
            f"{where}['start'] is {saved['start']!r}; expected an integer from 0 to the "
            f"consumed_samples {consumed_samples}"
        )
    fields = {
        "corpora": ("a corpus prefix", lambda v: isinstance(v, str)),
        "weights": (
            "a finite number >= 0",
            lambda v: (
                isinstance(v, numbers.Real)
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v >= 0
            ),
        ),
        "offsets": ("an integer >= 0", is_count),
    }
    if not isinstance(saved["corpora"], (list, tuple)):
        raise ConfigError(
            f"{where}['corpora'] is {saved['corpora']!r}; expected a list of corpus prefixes"
        )
    for key, (allowed, test) in fields.items():
        values = saved[key]
        if not isinstance(values, (list, tuple)) or len(values) != len(saved["corpora"]):
            raise ConfigError(
                f"{where}[{key!r}] is {values!r}; expected a list of one entry per corpus of "
                f"{where}['corpora'] ({len(saved['corpora'])})"
            )
        for number, value in enumerate(values):
            if not test(value):
                raise ConfigError(f"{where}[{key!r}][{number}] is {value!r}; expected {allowed}")


def resume_point(
    state: MixState, names: Sequence[str], weights: Sequence[float], counts: Sequence[int]
) -> tuple[int, list[int]]:
    """Where the greedy rule of a blend of corpora ``names`` and normalised ``weights`` resumed
    from ``state`` starts: the state's segment's first sample and offsets where the corpora and
    weights are that segment's (a restart without a change), else the state's consumed count
    and each corpus's ``counts`` there."""
    saved = state.segment
    if (
        saved is not None
        and list(saved["corpora"]) == list(names)
        and [float(w) for w in saved["weights"]] == list(weights)
    ):
        return int(saved["start"]), [int(o) for o in saved["offsets"]]
    return state.consumed_samples, [int(c) for c in counts]


def segment(
    names: Sequence[str], weights: Sequence[float], start: int, offsets: Sequence[int]
) -> dict[str, Any]:
    """A segment record (:attr:`MixState.segment`), as plain values."""
    return {
        "start": int(start),
        "corpora": list(names),
        "weights": [float(w) for w in weights],
        "offsets": [int(o) for o in offsets],
    }


def blend_mix_state(
    datasets: Sequence[Any], weights: Sequence[float], dataset_index: numpy.ndarray, consumed: int
) -> dict[str, Any]:
    """A Megatron blend's ``mix`` after ``consumed`` samples: counts from its ``dataset_index``
    (the greedy rule gives each corpus its samples 0, 1, 2, ... in turn), one segment from 0."""
    names = [corpus_name(d) for d in datasets]
    offsets = numpy.zeros(len(datasets), dtype=numpy.int64)
    return mix_record(datasets, names, weights, dataset_index[:consumed], 0, offsets)


def mix_record(
    datasets: Sequence[Any],
    names: Sequence[str],
    weights: Sequence[float],
    served: numpy.ndarray,
    start: int,
    offsets: numpy.ndarray,
    carried: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``mix`` of a segment that began at sample ``start`` with each corpus at its
    ``offsets`` and has served the corpora ``served`` (its ``dataset_index`` so far): each
    corpus's record (with the ``carried`` ones of corpora it no longer holds), and the segment.
    One rule for a Megatron blend (one segment from 0) and a resumed one."""
    counts = offsets + numpy.bincount(served, minlength=len(datasets))
    return {
        "corpora": corpus_records(datasets, counts.tolist(), carried),
        "segment": segment(names, weights, start, offsets.tolist()),
    }


class MixResumedBlend(torch.utils.data.Dataset):
    """Samples ``state.consumed_samples`` to ``size`` of a run resumed under the blend
    ``datasets`` and ``weights``: each corpus from its next unseen sample, blended by
    Megatron's greedy rule over the remaining samples (or, where the corpora and weights are
    the state's segment's, continuing that segment). Earlier indices were served before and
    are refused."""

    def __init__(
        self, datasets: list[Any], weights: list[float], size: int, state: MixState
    ) -> None:
        names = [corpus_order(d)["dataset_path"] for d in datasets]
        _check_distinct(names, "the new blend")
        _check_spellings(names, state.corpora)
        _check_positive(names, weights)
        if not state.consumed_samples <= size:
            raise ConfigError(
                f"the run consumed {state.consumed_samples} samples, the new blend holds "
                f"{size}: nothing is left to serve"
            )
        self.datasets = datasets
        self.names = names
        self.weights = normalize(list(weights))
        self.size = size
        self.split = datasets[0].index_split
        self.carried = {n: r for n, r in state.corpora.items() if n not in names}
        counts = [
            _check_order(d, state.corpora.get(n)) for d, n in zip(datasets, names, strict=True)
        ]
        self.start, offsets = resume_point(state, names, self.weights, counts)
        self.offsets = numpy.array(offsets, dtype=numpy.int64)
        remaining = size - self.start
        self.dataset_index = numpy.zeros(remaining, dtype=numpy.int16)
        self.dataset_sample_index = numpy.zeros(remaining, dtype=numpy.int64)
        if remaining:
            build_blending_indices(
                self.dataset_index,
                self.dataset_sample_index,
                self.weights,
                len(datasets),
                remaining,
                False,
            )
        self.dataset_sample_index += self.offsets[self.dataset_index]
        self._check_held()
        self.first = state.consumed_samples
        self._check_continues(state, counts)  # holds trivially unless a segment continues
        description = json.dumps(
            {
                "class": type(self).__name__,
                "datasets": [d.unique_description_hash for d in datasets],
                "segment": segment(names, self.weights, self.start, offsets),
                "size": size,
            }
        )
        self.unique_description_hash = hashlib.md5(
            description.encode(), usedforsecurity=False
        ).hexdigest()
        self._reader = BlendReader(datasets)

    def _check_held(self) -> None:
        drawn = numpy.bincount(self.dataset_index, minlength=len(self.datasets))
        for name, dataset, offset, count in zip(
            self.names, self.datasets, self.offsets, drawn, strict=True
        ):
            if offset + count > len(dataset):
                raise IndexBuildError(
                    f"corpus {name} must give samples {offset}..{offset + count - 1} to the "
                    f"resumed run, its tables hold {len(dataset)}"
                )

    def _check_continues(self, state: MixState, counts: list[int]) -> None:
        served = self.dataset_index[: state.consumed_samples - self.start]
        mine = self.offsets + numpy.bincount(served, minlength=len(self.datasets))
        for name, count, saved in zip(self.names, mine.tolist(), counts, strict=True):
            if count != saved:
                raise ConfigError(
                    f"corpus {name}: the state's segment gives it {count} samples by "
                    f"consumed_samples {state.consumed_samples}, its record says {saved}: the "
                    "state is inconsistent"
                )

    @property
    def index_split(self) -> Any:
        """The split served (the train split: only training consumes a run's samples)."""
        return self.split

    def __len__(self) -> int:
        return self.size

    def _position(self, idx: int, end: int = 0) -> int:
        """Where sample ``idx`` (or, with ``end`` 1, the count ``idx``) is in the tables."""
        if not self.first <= idx < self.size + end:
            raise IndexError(
                f"sample {idx} is outside the resumed run's samples {self.first}..{self.size - 1}"
                " (the ones before were served before the run resumed)"
            )
        return idx - self.start

    def __getitem__(self, idx: int) -> dict[str, Any]:
        position = self._position(idx)
        dataset_id = self.dataset_index[position]
        sample = self.datasets[dataset_id][self.dataset_sample_index[position]]
        return {"dataset_id": dataset_id, **sample}

    def __getitems__(self, indices: Sequence[int]) -> CollatedBatch:
        """The samples at ``indices``, collated, read as a blend's batch is read: whole by the
        corpora's class where it can, else each corpus reads its rows and their class merges
        them in order."""
        positions = [self._position(idx) for idx in indices]
        batch = self._reader.read(
            positions, [False] * len(positions), self.dataset_index, self.dataset_sample_index
        )
        ids = self.dataset_index[positions]
        return CollatedBatch({"dataset_id": torch.from_numpy(ids), **batch})

    def merge_batches(
        self, batches: Sequence[CollatedBatch], rows: Sequence[Sequence[int]]
    ) -> CollatedBatch:
        """One batch with row ``j`` of ``batches[i]`` at row ``rows[i][j]``."""
        return merge_rows(batches, rows)

    def mix_state(self, consumed_samples: int) -> dict[str, Any]:
        """Each corpus's record after the run consumed ``consumed_samples`` (megafmt's
        ``CorpusAccounting``), with the corpora the blend no longer holds, and the segment."""
        served = self.dataset_index[: self._position(consumed_samples, end=1)]
        return mix_record(
            self.datasets, self.names, self.weights, served, self.start, self.offsets, self.carried
        )

    def sample_origin(self, idx: int) -> dict[str, Any]:
        """Which corpus sample ``idx`` comes from, its index there and its documents."""
        position = self._position(idx)
        dataset = self.datasets[self.dataset_index[position]]
        return sample_origin(dataset, int(self.dataset_sample_index[position]))


def _check_order(dataset: Any, record: Mapping[str, Any] | None) -> int:
    """The samples ``dataset`` gave before (0 for a corpus new to the run), after checking
    that its order is the recorded one."""
    if record is None:
        return 0
    if "order" not in record:  # not recorded (a Megatron-LM checkpoint's counts)
        return int(record["consumed"])
    mine, saved = corpus_order(dataset), record["order"]
    name = changed_order_setting(saved, mine)  # the corpus settings before its epochs
    if name is not None:
        raise ConfigError(
            f"corpus {mine['dataset_path']}: its {name} was {saved.get(name)!r} when the "
            f"state was saved and is {mine.get(name)!r} now, so its samples come in another "
            "order; a run resumed with a new mix refuses it (no sample may repeat or be "
            "skipped): keep the corpus's settings, or start it afresh under another path"
        )
    return int(record["consumed"])


def _check_positive(names: Sequence[str], weights: Sequence[float]) -> None:
    """Refuse a weight that is not above 0 in a resumed blend: Megatron's rule still draws
    from a corpus of weight 0 (on ties), where a user meant to leave it out."""
    for name, weight in zip(names, weights, strict=True):
        if not weight > 0:
            raise ConfigError(
                f"the new blend gives corpus {name} the weight {weight!r}; a resumed blend's "
                "weights must be above 0 (Megatron's rule would still draw from a corpus of "
                "weight 0): leave the corpus out of the blend instead, and the state keeps its "
                "count for a later blend that names it again"
            )


def _check_spellings(names: Sequence[str], saved: Mapping[str, Any]) -> None:
    """Refuse a corpus of the new blend that is new to the run only by its spelling: its
    local path names the files of a corpus the state holds under another (``data/web`` and
    ``./data/web``). Corpora are known by their prefix, so it would start again at its first
    sample, serving those already trained on."""
    known = {}
    for name in saved:
        if not is_url(name):
            known.setdefault(os.path.realpath(name), name)
    for name in names:
        if name in saved or is_url(name):
            continue
        same = known.get(os.path.realpath(name))
        if same is not None:
            raise ConfigError(
                f"the new blend's corpus {name} is the state's corpus {same} under another "
                "spelling (the same files); a run resumed with a new mix knows a corpus by its "
                f"path prefix, so it would start again at its first sample: name it {same}"
            )


def _check_distinct(names: Sequence[str], where: str) -> None:
    seen = [name for number, name in enumerate(names) if name in names[:number]]
    if seen:
        raise ConfigError(
            f"{where} names corpus {seen[0]!r} twice; a run resumed with a new mix knows "
            "corpora by their path prefix, so each must appear once"
        )


def resumed_part_sizes(
    prefixes: Sequence[str], weights: Sequence[float], size: int, state: MixState, surplus: float
) -> list[int]:
    """Samples each corpus of a resumed blend of ``size`` samples must hold: those it gave
    before and its share of the remaining samples with ``surplus``, as Megatron sizes a blend's
    parts; at least what its tables were built for before, so that they stay the same tables
    where that suffices."""
    remaining = max(0, size - state.consumed_samples)
    sizes = []
    for prefix, weight in zip(prefixes, normalize(list(weights)), strict=True):
        record = state.corpora.get(_named(prefix), {})
        needed = int(record.get("consumed", 0))
        needed += math.ceil(math.ceil(remaining * weight) * (1 + surplus))
        sizes.append(max(needed, int(record.get("num_samples") or 0)))
    return sizes
