"""Section ranking on the CPU: BM25 over sections and over their sentences, fused.

Pure code (no I/O). Terms are lower-cased words stemmed with the Snowball English stemmer
(PyStemmer, a C extension: stemming is most of the indexing cost), English stop words and
question words removed. Each section is scored by

    score = BM25(section body + heading path x heading_weight)
          + sentence_weight * max over its sentences of BM25(sentence)
          + answer_weight * [that best sentence holds the kind of value the question asks for]

The sentence term rewards sections where the question's words meet in one sentence (a fact is
one sentence; a decoy that shares a name but sits in another context scatters them). The
answer term is the classic question-answering cue: "when", "what year", "how many" ... ask for
a number, so a best sentence with none is less likely to hold the answer. Document frequencies
are kept live, so sections can be added and removed without a rebuild.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter, defaultdict
from collections.abc import KeysView
from dataclasses import dataclass
from itertools import chain

import Stemmer

from . import answer

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
    candidates: int = 12  # sections whose sentences are scored


class Analyzer:
    """Text to terms: lower case, words, stop words out, Snowball English stems. Stems are
    cached per word, so a corpus is stemmed once per distinct word."""

    def __init__(self) -> None:
        self._stemmer = Stemmer.Stemmer("english", 0)  # no cache of its own: ours is faster
        self._stems: dict[str, str] = {}  # word -> stem ("" for a stop word)

    def terms(self, text: str) -> list[str]:
        return self.sentence_terms([text])[0]

    def sentence_terms(self, texts: list[str]) -> list[list[str]]:
        """The terms of each text (one stemmer call for all their new words)."""
        word_lists = [_WORD.findall(text.lower()) for text in texts]
        stems = self._stems
        new = list(set(chain.from_iterable(word_lists)).difference(stems))
        if new:
            for word, stem in zip(new, self._stemmer.stemWords(new), strict=True):
                stems[word] = "" if word in STOP_WORDS else stem
        lookup = stems.__getitem__
        return [list(filter(None, map(lookup, words))) for words in word_lists]


@dataclass(slots=True)
class _Indexed:
    text: str
    terms: KeysView[str]  # distinct terms of the section, headings included
    num_terms: int  # terms of the body
    num_sentences: int  # an estimate made at indexing (for the average sentence length)
    sentences: list[tuple[list[str], str]] | None = None  # (terms, text) once first scored


class Ranker:
    """Sections (integer ids) indexed for `search`; add and remove at any time."""

    def __init__(self, params: RankParams | None = None, analyzer: Analyzer | None = None):
        self.params = params or RankParams()
        self.analyzer = analyzer or Analyzer()
        self._postings: defaultdict[str, dict[int, float]] = defaultdict(dict)  # term -> {id: tf}
        self._lengths: dict[int, float] = {}
        self._total_length = 0.0
        self._sections: dict[int, _Indexed] = {}
        self._num_sentences = 0
        self._sentence_terms = 0

    def __len__(self) -> int:
        return len(self._sections)

    def __contains__(self, section: int) -> bool:
        return section in self._sections

    def add(self, section: int, text: str, headings: tuple[str, ...] = ()) -> None:
        """Indexes a section's terms. Its sentences are analyzed when a question first makes
        it a candidate (most never are), which keeps indexing to one pass over the text."""
        if section in self._sections:
            raise KeyError(f"section {section} is already indexed")
        body = self.analyzer.terms(text)
        counts: Counter[str] = Counter(body)
        length = float(len(body))
        if headings:
            for term in self.analyzer.terms(" ".join(headings)):
                counts[term] += self.params.heading_weight  # type: ignore[assignment]
                length += self.params.heading_weight
        postings = self._postings
        for term, tf in counts.items():
            postings[term][section] = tf
        self._lengths[section] = length
        self._total_length += length
        num_sentences = 1 + sum(map(text.count, _SENTENCE_ENDS))
        self._sections[section] = _Indexed(text, counts.keys(), len(body), num_sentences)
        self._num_sentences += num_sentences
        self._sentence_terms += len(body)

    def remove(self, section: int) -> None:
        indexed = self._sections.pop(section, None)
        if indexed is None:
            return
        self._total_length -= self._lengths.pop(section)
        for term in indexed.terms:
            posting = self._postings[term]
            del posting[section]
            if not posting:
                del self._postings[term]
        self._num_sentences -= indexed.num_sentences
        self._sentence_terms -= indexed.num_terms

    def _sentences_of(self, indexed: _Indexed) -> list[tuple[list[str], str]]:
        if indexed.sentences is None:
            parts = _SENTENCE.split(indexed.text)
            terms_of = self.analyzer.sentence_terms(parts)
            indexed.sentences = [(t, p) for t, p in zip(terms_of, parts, strict=True) if t]
        return indexed.sentences

    def idf(self, term: str) -> float:
        df = len(self._postings.get(term, ()))
        if not df:
            return 0.0
        return math.log(1.0 + (len(self._sections) - df + 0.5) / (df + 0.5))

    def search(self, question: str, k: int = 1) -> list[tuple[int, float]]:
        """The k best sections as (id, score), best first; ties go to the lower id."""
        terms = list(dict.fromkeys(self.analyzer.terms(question)))
        if not terms or k < 1 or not self._sections:
            return []
        idf = {term: self.idf(term) for term in terms}
        scores = self._bm25(idf)
        if not scores:
            return []
        params = self.params
        candidates = heapq.nlargest(
            max(params.candidates, k), scores.items(), key=lambda kv: (kv[1], -kv[0])
        )
        wanted = answer.question_type(question)
        question_words = set(_WORD.findall(question.lower()))
        answer_bonus = params.answer_weight * sum(idf.values())
        fused = []
        for section, score in candidates:
            sentence_score, sentence = self._best_sentence(self._sections[section], idf)
            total = score + params.sentence_weight * sentence_score
            if wanted is not None and sentence and answer.holds(sentence, wanted, question_words):
                total += answer_bonus
            fused.append((section, total))
        fused.sort(key=lambda kv: (-kv[1], kv[0]))
        return fused[:k]

    def _bm25(self, idf: dict[str, float]) -> dict[int, float]:
        k1, b = self.params.k1, self.params.b
        average = self._total_length / len(self._sections) or 1.0
        lengths = self._lengths
        scores: dict[int, float] = {}
        for term, weight in idf.items():
            for section, tf in self._postings.get(term, {}).items():
                norm = k1 * (1.0 - b + b * lengths[section] / average)
                scores[section] = scores.get(section, 0.0) + weight * tf * (k1 + 1.0) / (tf + norm)
        return scores

    def _best_sentence(self, indexed: _Indexed, idf: dict[str, float]):
        """BM25 of the section's best sentence for the question, and that sentence's terms."""
        k1, b = self.params.k1, self.params.b
        average = self._sentence_terms / max(1, self._num_sentences) or 1.0
        best, best_raw = 0.0, None
        for terms, raw in self._sentences_of(indexed):
            matched = [term for term in terms if term in idf]
            if not matched:
                continue
            norm = k1 * (1.0 - b + b * len(terms) / average)
            score = sum(
                idf[term] * tf * (k1 + 1.0) / (tf + norm) for term, tf in Counter(matched).items()
            )
            if score > best:
                best, best_raw = score, raw
        return best, best_raw
