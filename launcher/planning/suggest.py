"""The one did-you-mean helper: the closest known name to a mistyped one (torch-free)."""

from __future__ import annotations

import difflib
from typing import Callable, Iterable


def closest(word: str, choices: Iterable[object]) -> str | None:
    """The choice equal to `word` but for case, else the closest by difflib (ratio >= 0.6), else None."""
    options = [str(c) for c in choices]
    same = [o for o in options if o.lower() == word.lower()]
    if same:
        return same[0]
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return match[0] if match else None


def did_you_mean(word: str, choices: Iterable[object], show: Callable[[str], str] = lambda s: f"'{s}'") -> str:
    """' (did you mean 'x'?)' for the closest choice, or ''."""
    match = closest(word, choices)
    return f" (did you mean {show(match)}?)" if match is not None else ""
