"""Agreeing before sending: the ranks of a TP group compare what each will send or expect.

Receivers allocate their buffers from their own topology. If the ranks of a group were built
differently (another sequence length, a mask on one side only, another protocol or pipeline
stage), a broadcast would hand the receiver garbage in its own shape, abort the process inside
gloo ("Received data size doesn't match expected size") or wait forever. So before the data of
a micro-batch moves, every rank of the group takes part in one all-reduce (maximum) of a
fixed-size header of :data:`HEADER_SLOTS` int64:

=============  ====================================================================
slots          meaning
=============  ====================================================================
0              the source's status: :data:`OK`, :data:`FAILED` or :data:`EXHAUSTED`
1-2            the number of ``cu_seqlens`` and ``cu_seqlens_padded`` entries it sends
3              the row length of a hybrid-CP micro-batch (0 without hybrid CP)
4              the byte length of its failure message (sent next, only on failure)
5 to 5+n-1     the rank's view: :data:`WIRE_VERSION`, then its :class:`Description`
5+n to 5+2n-1  the same values negated
=============  ====================================================================

The other ranks put zeros in slots 0-4, so the maximum is the source's; the maximum of a value
and of its negation are the largest and (negated) the smallest value any rank holds, equal
where all ranks agree. The exchange is the same collective, of the same size, on every rank
whatever its settings, so it cannot itself be mismatched. Only where the views differ does the
group gather them all (a second, rare collective), so that every rank raises the same
:class:`AgreementError` naming the fields and which global ranks hold which value. A rank's
view is computed once per topology: what each micro-batch pays is one small all-reduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from megadist.collectives import all_gather, all_reduce_max, broadcast, group_ranks
from megadist.errors import AgreementError, SourceError
from megadist.keys import BATCH_KEYS, BOUNDARY_KEYS, ROW_KEYS
from megadist.topology import BatchTopology, PipelinePosition

#: the version of what TP ranks exchange; a rank of another version disagrees on slot 0
WIRE_VERSION = 3
#: the source's status codes
OK, FAILED, EXHAUSTED = 0, 1, 2
#: the fields of a description, in header order; the first ones are the settings a user chose,
#: the last three follow from them and are named only when the settings agree
FIELDS: tuple[str, ...] = (
    "protocol",
    "pipeline stage",
    "mtp_on_this_rank",
    "micro_batch_size",
    "seq_length",
    "attention_mask",
    "packed_sequences",
    "cp_size",
    "split before sending",
    "moves data for this call (pipeline stage, vp_stage)",
    "keys",
    "packed buffer bytes",
    "shapes and dtypes",
)
DERIVED = 3
_SOURCE_SLOTS = 5
_VIEW = 1 + len(FIELDS)
HEADER_SLOTS = _SOURCE_SLOTS + 2 * _VIEW
_POSITIONS = tuple(PipelinePosition)
_SPLITS = (None, "zigzag", "thd")


@dataclass(frozen=True)
class Description:
    """What one rank sends or expects for a micro-batch, as the integers of :data:`FIELDS`."""

    values: tuple[int, ...]

    @property
    def view(self) -> list[int]:
        """What a rank puts in the header after the source's slots: the wire version and the
        values, then all of them negated."""
        mine = [WIRE_VERSION, *self.values]
        return mine + [-value for value in mine]

    @classmethod
    def of(
        cls,
        topology: BatchTopology,
        protocols: Sequence[str],
        protocol: str,
        split: str | None,
        transfers: bool,
        buffer_bytes: int,
        shapes_digest: int,
    ) -> Description:
        """The description of a call with ``topology``: ``protocol`` (one of ``protocols``),
        the CP ``split`` the source applies before sending (None: the full batch), whether the
        call moves data, the packed buffer's size and a digest of the sent shapes and dtypes."""
        keys = sum(1 << BATCH_KEYS.index(key) for key in topology.payload_keys)
        return cls(
            (
                protocols.index(protocol),
                _POSITIONS.index(topology.pipeline),
                int(topology.mtp_on_this_rank),
                topology.micro_batch_size,
                topology.seq_length,
                int(topology.attention_mask),
                int(topology.packed_sequences),
                topology.cp_size,
                _SPLITS.index(split),
                int(transfers),
                keys,
                buffer_bytes,
                shapes_digest,
            )
        )


def _shown(field: str, value: int, protocols: Sequence[str]) -> str:
    if field == "protocol":
        return repr(protocols[value]) if 0 <= value < len(protocols) else f"code {value}"
    if field == "pipeline stage":
        return _POSITIONS[value].value if 0 <= value < len(_POSITIONS) else f"code {value}"
    if field == "split before sending":
        return repr(_SPLITS[value]) if 0 <= value < len(_SPLITS) else f"code {value}"
    if field == "keys":
        return "[" + ", ".join(k for i, k in enumerate(BATCH_KEYS) if value >> i & 1) + "]"
    if field == "shapes and dtypes":
        return f"{value:#x}"
    if field in ("mtp_on_this_rank", "attention_mask", "packed_sequences") or field.startswith(
        "moves"
    ):
        return str(bool(value))
    return str(value)


def _difference(field: str, column: list[int], ranks: list[int], protocols: Sequence[str]) -> str:
    holders: dict[int, list[int]] = {}
    for rank, value in zip(ranks, column, strict=True):
        holders.setdefault(value, []).append(rank)
    parts = [
        f"{_shown(field, value, protocols)} on global rank{'s' if len(who) > 1 else ''} "
        + ", ".join(map(str, who))
        for value, who in holders.items()
    ]
    return f"{field}: " + "; ".join(parts)


def disagreement(rows: list[list[int]], ranks: list[int], protocols: Sequence[str]) -> str | None:
    """What the gathered views ``rows`` (wire version and description, one per rank of
    ``ranks``) disagree on, or None."""
    if len({row[0] for row in rows}) > 1:
        return _difference("megadist wire version", [row[0] for row in rows], ranks, protocols)
    columns = list(zip(*(row[1:] for row in rows), strict=True))
    differing = [i for i, column in enumerate(columns) if len(set(column)) > 1]
    chosen = [i for i in differing if i < len(FIELDS) - DERIVED] or differing
    if not chosen:
        return None
    return "; ".join(_difference(FIELDS[i], list(columns[i]), ranks, protocols) for i in chosen)


def agree(
    topology: BatchTopology,
    description: Description,
    protocols: Sequence[str],
    *,
    status: int = OK,
    counts: tuple[int, int, int] = (0, 0, 0),
    message: str = "",
) -> tuple[int, int, int]:
    """Exchange headers with the rest of the TP group; return the source's boundary counts
    and hybrid-CP row length (:func:`sizes_sent`).

    Raises :class:`AgreementError` on every rank when the descriptions differ. When the
    source's ``status`` is not OK (only the source passes one), the source sends its
    ``message`` and returns; the other ranks raise ``StopIteration`` (exhausted) or
    :class:`SourceError` with the message.
    """
    text = message.encode("utf-8")
    header = [status, *counts, len(text), *description.view]
    mine = torch.tensor(header, dtype=torch.int64, device=topology.device)
    all_reduce_max(mine, topology.tp_group, "TP")
    reduced = mine.tolist()
    largest, negated_smallest = reduced[_SOURCE_SLOTS:-_VIEW], reduced[-_VIEW:]
    if any(a != -b for a, b in zip(largest, negated_smallest, strict=True)):
        views = torch.tensor(header[_SOURCE_SLOTS:-_VIEW], device=topology.device)
        rows = all_gather(views, topology.tp_group, "TP").tolist()
        ranks = group_ranks(topology.tp_group)
        raise AgreementError(
            f"the TP group of global ranks {ranks} disagrees on what get_batch sends: "
            f"{disagreement(rows, ranks, protocols)}. Every rank of a TP group must build its "
            f"BatchTopology with the same settings and call with the same protocol"
        )
    source_status, *source_counts, length = reduced[:_SOURCE_SLOTS]
    if source_status != OK:
        buffer = torch.zeros(max(length, 1), dtype=torch.uint8, device=topology.device)
        if topology.is_source:
            buffer[:length] = torch.tensor(list(text), dtype=torch.uint8)
        broadcast(buffer, topology.tp_src_rank, topology.tp_group, "TP")
        if not topology.is_source:
            if source_status == EXHAUSTED:
                raise StopIteration
            sent = bytes(buffer[:length].tolist()).decode("utf-8", "replace")
            raise SourceError(
                f"TP source rank {topology.tp_src_rank} could not send its batch: {sent}"
            )
    return source_counts[0], source_counts[1], source_counts[2]


def sizes_sent(payload: dict[str, torch.Tensor | None], hybrid_cp: bool) -> tuple[int, int, int]:
    """The number of entries of each boundary tensor of ``payload`` (0 for an absent one), and
    with ``hybrid_cp`` the length of its rows (else 0): what receivers cannot know in advance."""
    first, second = (0 if payload.get(k) is None else payload[k].numel() for k in BOUNDARY_KEYS)
    rows = [v for k, v in payload.items() if v is not None and k in ROW_KEYS]
    return first, second, rows[0].shape[1] if hybrid_cp and rows else 0
