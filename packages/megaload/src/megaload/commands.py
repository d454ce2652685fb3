"""megaload's ``mega`` command, declared by its help line; ``mega load`` imports its
implementation (and torch) only when chosen."""

from megafmt.cli.command import DeferredCommand


class LoadCommand(DeferredCommand):
    help = "simulate data-parallel loading: disjointness, coverage, resume, throughput"
    implementation = "megaload.cli:LoadCommand"
