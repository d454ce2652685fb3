"""``--split-sentences``: NLTK's punkt splitter, from data already on this machine.

Nothing is downloaded. When NLTK or its punkt data is missing, the error says how to install
them. Like Megatron's tool, texts are split in pieces of a million characters.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from megafmt.errors import PluginError

PIECE_CHARACTERS = 1_000_000


def load_splitter(lang: str, keep_newlines: bool) -> Callable[[str], list[str]]:
    """A function that splits a text into sentences with punkt for ``lang``."""
    try:
        import nltk
        from nltk.tokenize.punkt import PunktLanguageVars, PunktSentenceTokenizer
    except ImportError:
        raise PluginError("--split-sentences needs NLTK: pip install nltk") from None
    try:
        splitter = nltk.load(f"tokenizers/punkt/{lang}.pickle")
    except (LookupError, OSError, ValueError):
        try:
            splitter = nltk.tokenize.PunktTokenizer(lang)
        except (LookupError, OSError, ValueError):
            raise PluginError(
                f"--split-sentences: NLTK's punkt data for {lang!r} is not installed; fetch it "
                f"once with python -m nltk.downloader punkt_tab (NLTK_DATA="
                f"{os.environ.get('NLTK_DATA', 'unset')})"
            ) from None
    if keep_newlines:

        class NewlineKeepingVars(PunktLanguageVars):
            """Sentence ends absorb the whitespace after them, newlines included."""

            _period_context_fmt = r"""
                \S*
                %(SentEndChars)s
                \s*
                (?=(?P<after_tok>
                    %(NonWord)s
                    |
                    (?P<next_tok>\S+)
                ))"""

        splitter = PunktSentenceTokenizer(
            train_text=splitter._params, lang_vars=NewlineKeepingVars()
        )

    def split(text: str) -> list[str]:
        return [
            sentence
            for start in range(0, len(text), PIECE_CHARACTERS)
            for sentence in splitter.tokenize(text[start : start + PIECE_CHARACTERS])
        ]

    return split
