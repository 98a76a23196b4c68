"""Section ranking on the CPU: BM25 over sections and over their sentences, fused.

Pure code (no I/O). Terms are lower-cased `\\w+` words stemmed with the Snowball English
stemmer (PyStemmer, a C extension), English stop words and question words removed (analyzer.py). Each
section is scored by

    score = BM25(section body + heading path x heading_weight)
          + sentence_weight * max over its sentences of BM25(sentence) (of those that name
            the question's subject, when it names one and one does)
          + answer_weight * total IDF * [that best sentence holds the kind of value asked for]
          + attribute_weight * IDF in the best sentence * agreement of the attributes the
            question names and those the best sentence names (evidence.py)

When the question names a subject, the sections naming it are ordered by their best
sentence's evidence (answer type held, attribute agreement) first, ties broken by how far the
words only that sentence has, not the subject's other sentences, meet the question's words in
their WordNet definitions (evidence.gloss_overlap), then by the score.

The sentence term rewards sections where the question's words meet in one sentence (a fact is
one sentence; a decoy that shares a name but sits in another context scatters them). The
answer term is the classic question-answering cue: "when", "what year", "how many" ... ask for
a number, so a best sentence with none is less likely to hold the answer. The attribute term
reads what a question asks about in its other words ("set ... back": a cost). Nothing is
precomputed but each section's word ids, so sections can be added and removed at any time.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from . import evidence
from .analyzer import Analyzer

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
    glosses: bool = True  # evidence ties broken by the definitions of unique words (Lesk)


_NAMED = re.compile(r"(?<!^)(?<![.!?] )(?<![.!?])\b[A-Z][\w'-]*")  # a name in a question


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
        best = [
            self._best_sentence(self._sections[section], stem_of, idf, subject)
            for section, _ in candidates
        ]
        # the question's words that every candidate's sentence holds name its subject ("the X
        # clock"), not what it asks about: they say nothing of the attribute asked
        stated = [terms for _, sentence, terms in best if sentence]
        shared = frozenset.intersection(*stated) if subject and len(stated) > 1 else frozenset()
        question_asks = evidence.asked(question, self.analyzer, params, shared)
        total_idf = sum(idf.values())
        # among the subject's sentences, what only one of them says: by the definitions of
        # its words and of the question's (breaks ties of the evidence below)
        glossed = [0.0] * len(best)
        if subject is not None and params.decisive and params.glosses and len(best) > 1:
            glossed = evidence.gloss_overlap(
                question_asks.terms - shared,
                [
                    frozenset(self.analyzer.terms(evidence.common_words(sentence or "")))
                    for _, sentence, _ in best
                ],
            )
        fused = []
        evident: dict[int, float] = {}  # answer type held + attribute agreement
        defined: dict[int, float] = {}  # the definition overlap
        for (section, score), (sentence_score, sentence, sentence_terms), gloss in zip(
            candidates, best, glossed, strict=True
        ):
            held = evidence.held(sentence, question_asks, params.tally)
            agree = evidence.agreement(sentence, question_asks, self.analyzer, params)
            # the attribute counts where the sentence is about the question's subject: scaled
            # by the share of the question's IDF the sentence holds
            covered = sum(idf[term] for term in sentence_terms)
            total = score + params.sentence_weight * sentence_score
            total += params.answer_weight * total_idf * held
            total += params.attribute_weight * covered * agree
            evident[section] = round(held + agree, 9)
            defined[section] = gloss
            fused.append((section, total))
        if subject is not None and params.decisive:
            # every candidate names the question's subject: what each states decides
            fused.sort(key=lambda kv: (-evident[kv[0]], -defined[kv[0]], -kv[1], kv[0]))
        else:
            fused.sort(key=lambda kv: (-kv[1], kv[0]))
        return fused[:k]

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
