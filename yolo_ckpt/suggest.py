""""Did you mean": the close matches of a misspelt word among the valid ones, as Ultralytics suggests keys
(``ultralytics.cfg.check_dict_alignment``: ``difflib.get_close_matches``)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


def did_you_mean(word: str, choices: Iterable[str], key: Callable[[str], str] = str) -> str:
    """`` (did you mean 'segment'?)`` for the up to 3 ``choices`` closest to ``word`` (case-insensitive, difflib's
    default cutoff 0.6), or ``""`` when none is close. ``key``: the part of a word compared (a file name's stem: the
    ``.yaml`` every choice shares would make any name close)."""
    vocabulary = {key(str(c)).lower(): str(c) for c in choices}
    close = [vocabulary[c] for c in difflib.get_close_matches(key(str(word)).lower(), vocabulary, n=3, cutoff=0.6)]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
