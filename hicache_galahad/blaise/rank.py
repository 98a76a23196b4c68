"""Section ranking on the CPU: BM25 over sections and over their sentences, fused.

Pure code (no I/O). Terms are lower-cased `\\w+` words stemmed with the Snowball English
stemmer (PyStemmer, a C extension), English stop words and question words removed. Each
section is scored by

    score = BM25(section body + heading path x heading_weight)
          + sentence_weight * max over its sentences of BM25(sentence) (of those that name
            the question's subject, when it names one and one does)
          + answer_weight * total IDF * [that best sentence holds the kind of value asked for]
          + attribute_weight * IDF in the best sentence * agreement of the attributes the
            question names and those the best sentence names (attributes.py)

The sentence term rewards sections where the question's words meet in one sentence (a fact is
one sentence; a decoy that shares a name but sits in another context scatters them). The
answer term is the classic question-answering cue: "when", "what year", "how many" ... ask for
a number, so a best sentence with none is less likely to hold the answer. The attribute term
reads what a question asks about in its other words ("set ... back": a cost). Nothing is
precomputed but each section's word ids, so sections can be added and removed at any time.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import Stemmer

from . import answer, attributes

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
_SENTENCE = re.compile(r"[.!?]\s+|\n\s*\n|\n(?=[*#|])")
_SENTENCE_ENDS = (". ", ".\n", "? ", "! ", "\n\n")


@dataclass(frozen=True, slots=True)
class RankParams:
    k1: float = 1.2
    b: float = 0.75
    heading_weight: float = 2.0
    sentence_weight: float = 1.0
    answer_weight: float = 0.5  # times the question's total IDF
    attribute_weight: float = 0.5  # times the IDF of the question terms in the best sentence
    candidates: int = 12  # sections whose sentences are scored
    subject: bool = True  # candidates hold the most of the question's names (see search)
    units: bool = True  # the attribute lexicon includes WordNet's units of measurement
    glossed: bool = True  # ... and the words whose first sense's definition names one
    decisive: bool = True  # among sections naming the subject, answer evidence decides
    tally: bool = True  # "how many" asks for a count: a number with a unit is a measure


_KEEP = frozenset(b"0123456789_abcdefghijklmnopqrstuvwxyz") | frozenset(range(128, 256))
# One pass per text (bytes.translate, at C speed): ASCII letters lower-cased, other ASCII marks
# to spaces, non-ASCII bytes kept, so `split` gives runs of word bytes. A run with a non-ASCII
# mark in it ("1939–1945") is split by `\w+` when the analyzer first sees it, so the terms
# are exactly those of `\w+` over the lower-cased text.
_FOLD = bytes((c + 32 if 65 <= c <= 90 else c if c in _KEEP else 32) for c in range(256))
_SEPARATOR = b"\xff"  # never in UTF-8: between the texts of one batch
_STOP, _CUT, _NEW = -1, -2, -(2**31)  # codes besides word ids; <= -3: a run of several words


# answer types that are not measurable attributes (a person, a place, a date)
_NOT_ATTRIBUTES = (answer.AnswerType.PERSON, answer.AnswerType.PLACE, answer.AnswerType.YEAR)
_CAPITALIZED = re.compile(r"(?<!^)(?<![.!?] )\b[A-Z]\w*")
_NAMED = re.compile(r"(?<!^)(?<![.!?] )(?<![.!?])\b[A-Z][\w'-]*")  # a name in a question


def _common_words(text: str) -> str:
    """`text` without its capitalized words (names), except a sentence's first word."""
    return _CAPITALIZED.sub(" ", text.strip())


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


def _analyse_many(texts: list[str]) -> list[list[str]]:
    analyzer = Analyzer()
    return [analyzer.terms(text) for text in texts]


@dataclass(slots=True)
class _Indexed:
    text: str
    body: np.ndarray  # the body's word ids, in order
    heading: np.ndarray | None  # the heading path's word ids (weight: heading_weight)
    length: float  # body terms + heading_weight x heading terms
    num_sentences: int  # an estimate made at indexing (for the average sentence length)
    # (word ids, their set, text) of each sentence, once the section is first a candidate
    sentences: list[tuple[list[int], frozenset[int], str]] | None = None


@dataclass(slots=True)
class _Corpus:
    """Every indexed section's terms in one array, for a question's single scan."""

    ids: np.ndarray  # section ids, in index order
    term_ids: np.ndarray
    owner: np.ndarray  # index (into ids) of the section each term belongs to
    weights: np.ndarray | None
    lengths: np.ndarray


class Ranker:
    """Sections (integer ids) indexed for `search`; add and remove at any time.

    Indexing keeps each section's word ids (one int32 per word, see Analyzer); a question maps
    the ids of its terms' words to columns and scans all the sections' ids at once (numpy), so
    there are no postings to build or maintain: the index is the analysed text. The scan is
    linear in the corpus (75,000 words here: well under a millisecond; a corpus of millions of
    words would want postings)."""

    def __init__(self, params: RankParams | None = None, analyzer: Analyzer | None = None):
        self.params = params or RankParams()
        self.analyzer = analyzer or Analyzer()
        self._sections: dict[int, _Indexed] = {}
        self._corpus: _Corpus | None = None  # joined by prepare() (or the first search)
        self._num_sentences = 0
        self._sentence_terms = 0

    def __len__(self) -> int:
        return len(self._sections)

    def __contains__(self, section: int) -> bool:
        return section in self._sections

    def add(self, section: int, text: str, headings: tuple[str, ...] = ()) -> None:
        """Indexes a section's terms (see `add_many`)."""
        self.add_many([(section, text, headings)])

    def add_many(self, sections) -> None:
        """Indexes sections given as (id, text, heading path), analysed in one batch. Their
        sentences are analysed when a question first makes a section a candidate (most never
        are), which keeps indexing to one pass over the text."""
        sections = list(sections)
        seen = set()
        for section, _, _ in sections:
            if section in self._sections or section in seen:
                raise KeyError(f"section {section} is already indexed")
            seen.add(section)
        if not sections:
            return
        heading_weight = self.params.heading_weight
        texts = [text for _, text, _ in sections]
        headed = [i for i, (_, _, h) in enumerate(sections) if h and heading_weight]
        analysed = self.analyzer.batch(texts + [" ".join(sections[i][2]) for i in headed])
        headings: list[np.ndarray | None] = [None] * len(sections)
        for index, heading in zip(headed, analysed[len(texts) :], strict=True):
            headings[index] = heading
        counts = [sum(map(text.count, _SENTENCE_ENDS)) for text in texts]
        store = self._sections
        for (section, text, _), body, heading, count in zip(
            sections, analysed, headings, counts, strict=False
        ):
            num_terms = len(body)
            length = float(num_terms)
            if heading is not None:
                length += heading_weight * len(heading)
            store[section] = _Indexed(text, body, heading, length, 1 + count)
            self._sentence_terms += num_terms
        self._num_sentences += len(sections) + sum(counts)
        self._corpus = None

    def remove(self, section: int) -> None:
        indexed = self._sections.pop(section, None)
        if indexed is None:
            return
        self._num_sentences -= indexed.num_sentences
        self._sentence_terms -= len(indexed.body)
        self._corpus = None

    def prepare(self) -> None:
        """Joins the sections' terms for searching (done by the first search otherwise)."""
        if self._corpus is not None or not self._sections:
            return
        items = list(self._sections.values())
        parts, sizes, weights = [], [], []
        heading_weight = self.params.heading_weight
        for indexed in items:
            parts.append(indexed.body)
            sizes.append(len(indexed.body))
            weights.append(1.0)
            if indexed.heading is not None:
                parts.append(indexed.heading)
                sizes[-1] += len(indexed.heading)
                weights.append(heading_weight)
        part_sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        self._corpus = _Corpus(
            ids=np.fromiter(self._sections, dtype=np.int64, count=len(items)),
            term_ids=np.concatenate(parts),
            owner=np.repeat(np.arange(len(items), dtype=np.int64), sizes),
            weights=np.repeat(np.array(weights, dtype=np.float32), part_sizes)
            if len(weights) > len(items)
            else None,
            lengths=np.fromiter((ix.length for ix in items), dtype=np.float64, count=len(items)),
        )

    def _sentences_of(self, indexed: _Indexed) -> list[tuple[list[int], frozenset[int], str]]:
        if indexed.sentences is None:
            parts = _SENTENCE.split(indexed.text)
            terms_of = self.analyzer.lists(parts)
            indexed.sentences = [
                (t, frozenset(t), p) for t, p in zip(terms_of, parts, strict=True) if t
            ]
        return indexed.sentences

    def _term_frequencies(self, families: list[list[int]]) -> tuple[_Corpus, np.ndarray]:
        """(corpus, tf): tf[i, j] is the weighted count of the words of families[j] (the word
        ids of one stem) in section ids[i]."""
        self.prepare()
        corpus = self._corpus
        assert corpus is not None
        column = np.full(self.analyzer.num_words, -1, dtype=np.int32)
        for index, family in enumerate(families):
            column[family] = index
        hits = column[corpus.term_ids]
        where = np.flatnonzero(hits >= 0)
        cells = corpus.owner[where] * len(families) + hits[where]
        weights = None if corpus.weights is None else corpus.weights[where]
        tf = np.bincount(cells, weights=weights, minlength=len(corpus.ids) * len(families))
        return corpus, tf.reshape(len(corpus.ids), len(families))

    def idf(self, term: str) -> float:
        """The IDF of a term (a stem)."""
        if not self._sections:
            return 0.0
        _, tf = self._term_frequencies([self.analyzer.family(term)])
        return self._idf(float(np.count_nonzero(tf[:, 0])))

    def _idf(self, df: float) -> float:
        if not df:
            return 0.0
        return math.log(1.0 + (len(self._sections) - df + 0.5) / (df + 0.5))

    def search(self, question: str, k: int = 1) -> list[tuple[int, float]]:
        """The k best sections as (id, score), best first; ties go to the lower id."""
        terms = list(dict.fromkeys(self.analyzer.terms(question)))
        if not terms or k < 1 or not self._sections:
            return []
        families = [self.analyzer.family(term) for term in terms]
        corpus, tf = self._term_frequencies(families)
        df = np.count_nonzero(tf, axis=0)
        idf = {term: self._idf(float(d)) for term, d in zip(terms, df, strict=True)}
        stem_of = {
            word: term for term, family in zip(terms, families, strict=True) for word in family
        }
        params = self.params
        k1, b = params.k1, params.b
        average = float(corpus.lengths.sum()) / len(corpus.ids) or 1.0
        norm = k1 * (1.0 - b + b * corpus.lengths / average)
        weights = np.array([idf[term] for term in terms])
        scores = (tf * (k1 + 1.0) / (tf + norm[:, None])) @ weights
        hit = np.flatnonzero(tf.any(axis=1))
        if not len(hit):
            return []
        subject = None
        if params.subject:
            hit, subject = self._about_subject(question, terms, tf, idf, hit)
        ranked = sorted(
            zip(corpus.ids[hit].tolist(), scores[hit].tolist(), strict=True),
            key=lambda kv: (-kv[1], kv[0]),
        )
        candidates = ranked[: max(params.candidates, k)]
        wanted = answer.question_type(question)
        asked: dict[str, float] = {}
        if params.attribute_weight and wanted not in _NOT_ATTRIBUTES:
            lexicon = attributes.lexicon(_analyse_many, params.units, params.glossed)
            asked = lexicon.attributes(self.analyzer.terms(_common_words(question)))
            wanted = wanted or attributes.answer_type(asked)
        question_words = set(_WORD.findall(question.lower()))
        total_idf = sum(idf.values())
        fused = []
        evidence: dict[int, float] = {}  # answer type held + attribute agreement
        for section, score in candidates:
            sentence_score, sentence, sentence_terms = self._best_sentence(
                self._sections[section], stem_of, idf, subject
            )
            total = score + params.sentence_weight * sentence_score
            evidence[section] = 0.0
            held = self._holds(sentence, wanted, question_words) if wanted and sentence else 0
            total += params.answer_weight * total_idf * held
            evidence[section] += held
            if asked and sentence:
                # what the sentence states beyond the question's own words
                stated_terms = set(self.analyzer.terms(_common_words(sentence)))
                stated = lexicon.attributes(stated_terms.difference(terms))
                # scaled by the share of the question's IDF the sentence holds: the attribute
                # counts where the sentence is about the question's subject
                covered = sum(idf[term] for term in sentence_terms)
                agree = attributes.agreement(asked, stated)
                total += params.attribute_weight * covered * agree
                evidence[section] += agree
            fused.append((section, total))
        if subject is not None and params.decisive:
            # every candidate names the question's subject: what each states decides
            fused.sort(key=lambda kv: (-evidence[kv[0]], -kv[1], kv[0]))
        else:
            fused.sort(key=lambda kv: (-kv[1], kv[0]))
        return fused[:k]

    def _holds(self, sentence: str, wanted, question_words) -> float:
        """1.0 when `sentence` holds a value of the kind `wanted`, else 0.0. A quantity ("how
        much land") is a measure in units or a count (a mass noun is also counted: "how much
        traffic", "40,000 vehicles a day"), never money or a year."""
        if wanted is answer.AnswerType.AMOUNT:
            held = attributes.holds_amount(sentence) or attributes.holds_tally(sentence)
            return float(held)
        if wanted is answer.AnswerType.TALLY and self.params.tally:
            return float(attributes.holds_tally(sentence))
        durations = (answer.AnswerType.DURATION, answer.AnswerType.LONG)
        if wanted in durations and attributes.holds_measure(sentence, "duration"):
            return 1.0
        return float(answer.holds(sentence, wanted, question_words))

    def _about_subject(self, question, terms, tf, idf, hit) -> tuple[np.ndarray, str | None]:
        """The sections of `hit` that hold the most (by IDF) of the question's subject: its
        capitalised words after the first (names: "the Quorvane Bridge", "Lake Ennis"), those
        the corpus has. A question names what it asks about; a section without that name (a
        near name, another entity with the same value, the question's words elsewhere) is
        not about it, however many of the other words it shares. Also returns the subject's
        rarest term (None when the question names nothing the corpus has)."""
        named = set(self.analyzer.terms(" ".join(_NAMED.findall(question))))
        columns = [j for j, term in enumerate(terms) if term in named and idf[term] > 0]
        if not columns:
            return hit, None
        weights = np.array([idf[terms[j]] for j in columns])
        coverage = (tf[hit][:, columns] > 0) @ weights
        rarest = terms[columns[int(np.argmax(weights))]]
        return hit[coverage >= coverage.max() - 1e-9], rarest

    def _best_sentence(self, indexed: _Indexed, stem_of, idf, subject: str | None = None):
        """BM25 of the section's best sentence for the question (`stem_of`: the question's
        word ids -> its terms), that sentence's text and the question terms it holds. When
        the question names a subject, the best of the sentences that name it (its rarest
        term) if any does: a sentence about a near name beside it states nothing about the
        subject."""
        k1, b = self.params.k1, self.params.b
        average = self._sentence_terms / max(1, self._num_sentences) or 1.0
        best, best_raw, best_terms = 0.0, None, frozenset()
        named = (0.0, None, frozenset())  # the best sentence naming the subject
        for words, distinct, raw in self._sentences_of(indexed):
            if distinct.isdisjoint(stem_of):
                continue
            matched = [stem_of[word] for word in words if word in stem_of]
            norm = k1 * (1.0 - b + b * len(words) / average)
            counts = Counter(matched)
            score = sum(idf[term] * tf * (k1 + 1.0) / (tf + norm) for term, tf in counts.items())
            if score > best:
                best, best_raw, best_terms = score, raw, frozenset(matched)
            if subject in counts and score > named[0]:
                named = (score, raw, frozenset(matched))
        return named if named[1] is not None else (best, best_raw, best_terms)
