"""What a word means, as the words of its definitions (Lesk): a word's stem expanded by the
stems of its first senses' WordNet definitions (glosses_data.py, made by make_glosses.py;
nothing hand-written). Pure code.

Two texts that share no word can share definition words: "peal" is defined by "ring" and
"bell", "payroll" by "employee" and "salary", "weighbridge" by "weigh" and "scale". The
ranker uses this to tell apart two sentences about one entity by the words only one of them
has (evidence.gloss_overlap).
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Iterable

from . import glosses_data


class Glosses:
    """The table, unpacked once per process (`glosses()`, about 0.1 s)."""

    def __init__(self) -> None:
        packed = zlib.decompress(base64.b64decode(glosses_data.PACKED)).decode()
        expanded, asked, df = packed.split("\n\n")
        # a stem's line is split into its words when the stem is first looked up
        self._expanded = _lines(expanded)
        self._asked = {**self._expanded, **_lines(asked)}
        self._df = _lines(df.replace(" ", "\n").replace(":", " "))
        self._total = glosses_data.NUM_WORDS

    def expand(self, terms: Iterable[str], asked: bool = False) -> set[str]:
        """`terms` and their definitions' stems (`asked`: as a question's words, whose verbs'
        definitions are left out)."""
        table = self._asked if asked else self._expanded
        found = set(terms)
        for term in list(found):
            found.update(table.get(term, "").split())
        return found

    def idf(self, term: str) -> float:
        """log(words / words whose definitions hold `term`); 0 for a word too common to keep."""
        count = self._df.get(term)
        return math.log(self._total / int(count)) if count else 0.0


def _lines(text: str) -> dict[str, str]:
    """stem -> the rest of its line."""
    return dict(line.partition(" ")[::2] for line in text.split("\n"))


_GLOSSES: Glosses | None = None


def glosses() -> Glosses:
    global _GLOSSES
    if _GLOSSES is None:
        _GLOSSES = Glosses()
    return _GLOSSES
