r"""Text to terms: the analyzer every ranker shares (lower-cased `\w+` words, English stop
words out, Snowball English stems), and the batch analysis that turns a document's sections
into integer word ids at indexing. Pure code (PyStemmer, numpy)."""

from __future__ import annotations

import bisect
import re
from itertools import repeat

import numpy as np
import Stemmer

_STOP_WORDS_TEXT = """
a about above after again against all also am an and any are aren't as at be because been
before being below between both but by can could did didn't do does doesn't doing don't down
during each either else ever few for from further had has hasn't have having he her here
hers herself him himself his how however i if in into is isn't it its itself just let me
might more most much must my myself neither nor not now of off on once only or other ought
our ours ourselves out over own per rather same shall she should so some such than that the
their theirs them themselves then there these they this those through thus to too under
until up upon us very was wasn't we were weren't what whatever when whence where whereas
whether which while who whom whose why will with within without would yet you your yours
yourself yourselves tell name named give know
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())
_WORD = re.compile(r"\w+")

_KEEP = frozenset(b"0123456789_abcdefghijklmnopqrstuvwxyz") | frozenset(range(128, 256))
# One pass per text (bytes.translate, at C speed): ASCII letters lower-cased, other ASCII marks
# to spaces, non-ASCII bytes kept, so `split` gives runs of word bytes. A run with a non-ASCII
# mark in it ("1939–1945") is split by `\w+` when the analyzer first sees it, so the terms
# are exactly those of `\w+` over the lower-cased text.
_FOLD = bytes((c + 32 if 65 <= c <= 90 else c if c in _KEEP else 32) for c in range(256))
_SEPARATOR = b"\xff"  # never in UTF-8: between the texts of one batch
_STOP, _CUT, _NEW = -1, -2, -(2**31)  # codes besides word ids; <= -3: a run of several words


class Analyzer:
    r"""Text to terms: lower case, `\w+` words, stop words out, Snowball English stems.

    Indexing never stems. Each distinct word gets an integer id the first time it is seen (its
    bytes -> id, one dictionary look-up per word after that; numpy gathers the ids), so a batch
    of texts costs one translate, one split and one look-up per word. A term of a question is a
    stem; `family(stem)` finds the ids of every word with that stem when a question first asks
    for it: a Snowball English stem less its last two letters is a prefix of every word that
    has it (checked on 186,000 distinct words of WordNet, Wikipedia and pydoc), so only the
    words with that prefix are stemmed, once each."""

    def __init__(self) -> None:
        self._stemmer = Stemmer.Stemmer("english", 0)  # no cache of its own: ours is faster
        self._codes: dict[bytes, int] = {_SEPARATOR: _CUT}  # word -> word id or code
        self._codes.update((word.encode(), _STOP) for word in STOP_WORDS)
        self._runs: list[tuple[int, ...]] = []  # code -3 - i -> the word ids of run i
        self._words: list[bytes] = []  # word id -> the word
        self._ordered: list[bytes] = []  # the words, sorted (completed on a question)
        self._num_words = 0
        self._stem_of: dict[int, str] = {}  # word id -> stem, for the words stemmed so far
        self._families: dict[str, tuple[int, list[int]]] = {}  # stem -> (words then, ids)

    @property
    def num_words(self) -> int:
        return self._num_words

    def stems(self, words: list[str]) -> list[str]:
        return self._stemmer.stemWords(words)

    def terms(self, text: str) -> list[str]:
        """The stems of `text`'s words, in order, stop words out."""
        words = [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]
        return self._stemmer.stemWords(words) if words else []

    def family(self, stem: str) -> list[int]:
        """The ids of the words seen so far whose stem is `stem`."""
        known = self._families.get(stem)
        if known is not None and known[0] == self._num_words:
            return known[1]
        ordered = self._ordered
        if len(ordered) < self._num_words:
            ordered += self._words[len(ordered) :]
            ordered.sort()  # timsort: the sorted part and the new run are merged
        prefix = stem[: max(1, len(stem) - 2)].encode()
        low = bisect.bisect_left(ordered, prefix)
        high = bisect.bisect_left(ordered, prefix + b"\xff", low)  # no UTF-8 byte is 0xff
        codes, stem_of = self._codes, self._stem_of
        found = [codes[word] for word in ordered[low:high]]
        fresh = [i for i in found if i not in stem_of]
        if fresh:
            words = [self._words[i].decode("utf-8") for i in fresh]
            stem_of.update(zip(fresh, self._stemmer.stemWords(words), strict=True))
        ids = [i for i in found if stem_of[i] == stem]
        self._families[stem] = (self._num_words, ids)
        return ids

    def batch(self, texts) -> list[np.ndarray]:
        """The word ids (int32) of each text (str or UTF-8 bytes), in order, stop words out."""
        if not texts:
            return []
        blob = b" \xff ".join(t if isinstance(t, bytes) else t.encode() for t in texts)
        words = blob.translate(_FOLD).split()
        codes = self._codes
        ids = np.fromiter(map(codes.get, words, repeat(_NEW)), dtype=np.int32, count=len(words))
        missing = np.flatnonzero(ids == _NEW)
        if len(missing):
            at = missing.tolist()
            self._learn(dict.fromkeys(words[i] for i in at))
            ids[missing] = [codes[words[i]] for i in at]
        if self._runs and (ids <= -3).any():
            ids = self._expand(ids)
        ids = ids[ids != _STOP]
        bounds = np.flatnonzero(ids == _CUT).tolist()
        starts = [0, *(cut + 1 for cut in bounds)]
        return [ids[a:b] for a, b in zip(starts, [*bounds, len(ids)], strict=True)]

    def lists(self, texts: list[str]) -> list[list[int]]:
        """`batch` as lists, without numpy: for a few short texts (a section's sentences)."""
        codes, runs = self._codes, self._runs
        out = []
        for text in texts:
            words = text.encode().translate(_FOLD).split()
            try:
                ids = [code for code in map(codes.__getitem__, words) if code != _STOP]
            except KeyError:
                self._learn(dict.fromkeys(word for word in words if word not in codes))
                ids = [code for code in map(codes.__getitem__, words) if code != _STOP]
            if ids and min(ids) < 0:  # runs of several words
                ids = [i for code in ids for i in ((code,) if code >= 0 else runs[-3 - code])]
            out.append(ids)
        return out

    def _expand(self, ids: np.ndarray) -> np.ndarray:
        at = np.flatnonzero(ids <= -3)
        runs = [self._runs[-3 - int(code)] for code in ids[at]]
        sizes = np.ones(len(ids), dtype=np.int64)
        sizes[at] = [len(run) for run in runs]
        out = np.repeat(ids, sizes)
        starts = np.cumsum(sizes) - sizes
        for start, run in zip(starts[at].tolist(), runs, strict=True):
            out[start : start + len(run)] = run
        return out

    def _learn(self, new) -> None:
        r"""Ids for new words: lower-case ASCII words in bulk; a word with other characters is
        lower-cased and split by `\w+` first (one id, or a run of several, or a stop word)."""
        plain = [word for word in new if word.isascii()]
        self._add_words(plain)
        codes = self._codes
        for word in new:
            if word.isascii():
                continue
            run = []
            for part in _WORD.findall(word.decode("utf-8", "replace").lower()):
                if part in STOP_WORDS:
                    continue
                key = part.encode()
                if key not in codes:
                    self._add_words([key])
                run.append(codes[key])
            if len(run) == 1:
                codes[word] = run[0]
            elif not run:
                codes[word] = _STOP
            else:
                codes[word] = -3 - len(self._runs)
                self._runs.append(tuple(run))

    def _add_words(self, words: list[bytes]) -> None:
        if not words:
            return
        first = self._num_words
        self._codes.update(zip(words, range(first, first + len(words)), strict=True))
        self._num_words += len(words)
        self._words += words


def analyse_many(texts: list[str]) -> list[list[str]]:
    """The terms of each text, by a fresh analyzer (the attribute lexicon's analysis)."""
    analyzer = Analyzer()
    return [analyzer.terms(text) for text in texts]
