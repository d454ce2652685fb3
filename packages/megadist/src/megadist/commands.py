"""megadist's ``mega`` command, declared by its help line; ``mega dist`` imports its
implementation (and torch) only when chosen."""

from megafmt.cli.command import DeferredCommand


class DistCommand(DeferredCommand):
    help = "show how get_batch spreads a micro-batch over tensor, context and pipeline ranks"
    implementation = "megadist.cli:DistCommand"
