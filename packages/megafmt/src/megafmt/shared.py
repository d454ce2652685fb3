"""What megafmt lends the project's other packages (megaindex, megaload, megadist), apart from
the format SDK: the plugin registry, progress reporting, atomic writes, read-only mappings,
corpus fingerprints, checksums, URL helpers (``redact`` masks credentials in messages,
``confined_path`` keeps local copies inside their folder), tokenizers that decode, the identity
Megatron's tokenizers report, argparse types, and Megatron's ``--data-path`` words and
tokenizer flags for the ``mega`` commands.

Not part of the SDK's API (``megafmt``'s ``__all__``): it changes with those packages, and a
user who reads, writes or checks corpora needs none of it. The data path's Protocols, which
third parties implement, are public, in :mod:`megafmt.protocols`.
"""

from megafmt.atomic import atomic_write, partial_path, remove_stale_partials
from megafmt.blend_list import Blend, BlendListError, parse_blend_list
from megafmt.checked import one_checker, remember_checked, was_checked
from megafmt.cli.command import non_negative_int, positive_int
from megafmt.cli.tokenizer_flags import add_tokenizer_arguments, tokenizer_options
from megafmt.confinement import confined_path, url_components
from megafmt.fingerprint import (
    CHANGE_TIME,
    checksum,
    corpus_fingerprint,
    corpus_stat,
    file_identity,
    fingerprint_changes,
)
from megafmt.mapping import map_file, release_pages
from megafmt.progress import Progress
from megafmt.readers import is_url
from megafmt.redaction import RedactedMessage, redact
from megafmt.registry import Registry
from megafmt.remote import default_cache_dir
from megafmt.tokenizers import Tokenizer, TokenizerOptions, load_text_tokenizer, load_tokenizer
from megafmt.tokenizers.identity import megatron_identifiers

__all__ = [
    "CHANGE_TIME",
    "Blend",
    "BlendListError",
    "Progress",
    "RedactedMessage",
    "Registry",
    "Tokenizer",
    "TokenizerOptions",
    "add_tokenizer_arguments",
    "atomic_write",
    "checksum",
    "confined_path",
    "corpus_fingerprint",
    "corpus_stat",
    "default_cache_dir",
    "file_identity",
    "fingerprint_changes",
    "is_url",
    "load_text_tokenizer",
    "load_tokenizer",
    "map_file",
    "megatron_identifiers",
    "non_negative_int",
    "one_checker",
    "parse_blend_list",
    "partial_path",
    "positive_int",
    "redact",
    "release_pages",
    "remember_checked",
    "remove_stale_partials",
    "tokenizer_options",
    "url_components",
    "was_checked",
]
