"""Hybrid context-parallel test support: a scheduler whose routing a test can state by hand.

Test support, not part of any package (pytest puts this folder on ``sys.path``; spawned ranks
inherit it).
"""

from __future__ import annotations


class EveryIdAlone:
    """Global id g to rank g mod ranks, one group."""

    def __init__(self, max_seq_len_per_rank: int, total_ranks: int) -> None:
        self.total_ranks = total_ranks

    def schedule(self, sub_sequences):
        ranks = [[] for _ in range(self.total_ranks)]
        for gid, _ in sub_sequences:
            ranks[gid % self.total_ranks].append(gid)
        return [ranks]
