"""What a question asks for and what a candidate sentence states: the answer evidence the
ranker weighs beside BM25. Pure code (answer.py, attributes.py).

A question asks for a kind of value (its wh-word and head noun: answer.py) and names the
attributes it is about (attributes.py: "set ... back" is a cost); a sentence holds values of
some kinds and states attributes beyond the question's own words. `held` and `agreement` say
how far one candidate sentence answers what `Asked` describes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import answer, attributes, glosses
from .analyzer import Analyzer, analyse_many
from .answer import AnswerType

# answer types that are not measurable attributes (a person, a place, a date)
_NOT_ATTRIBUTES = (AnswerType.PERSON, AnswerType.PLACE, AnswerType.YEAR)
_CAPITALIZED = re.compile(r"(?<!^)(?<![.!?] )\b[A-Z]\w*")
_WORD = re.compile(r"\w+")


def common_words(text: str) -> str:
    """`text` without its capitalized words (names), except a sentence's first word."""
    return _CAPITALIZED.sub(" ", text.strip())


@dataclass(frozen=True, slots=True)
class Asked:
    """What a question asks for."""

    wanted: AnswerType | None  # the kind of value
    attributes: dict[str, float] = field(default_factory=dict)  # attribute -> evidence
    words: frozenset[str] = frozenset()  # its lower-cased words (a held value is not one)
    terms: frozenset[str] = frozenset()  # its stems
    persons: bool | None = None  # a count of people (True), of other things named (False)


def asked(question: str, analyzer: Analyzer, params, subject_terms=frozenset()) -> Asked:
    """What `question` asks for: the kind of value its wh-phrase names, and, unless that is
    a person, a place or a date, the attributes its common words other than `subject_terms`
    (stems that name what it is about) name. A question without a wh-type takes its answer
    type from the strongest attribute of its head noun ("the capacity of the envelope": a
    volume, not the envelope's distance), else from its strongest attribute, else, naming a
    group, asks for the group's size."""
    wanted = answer.question_type(question)
    named: dict[str, float] = {}
    if params.attribute_weight and wanted not in _NOT_ATTRIBUTES:
        lexicon = attributes.lexicon(analyse_many, params.units, params.glossed)
        common = analyzer.terms(common_words(question))
        named = lexicon.attributes(term for term in common if term not in subject_terms)
        if wanted is None:
            head = answer.head_noun(question)
            headed = lexicon.attributes(analyzer.terms(head)) if head else {}
            wanted = attributes.answer_type(headed or named)
    if wanted is None and answer.asks_group_size(question):
        wanted = AnswerType.TALLY
    persons = answer.counts_persons(question) if wanted is AnswerType.TALLY else None
    if persons:
        named = {}  # the size of a group is the count of its members, not a measure
    return Asked(
        wanted,
        named,
        frozenset(_WORD.findall(question.lower())),
        frozenset(analyzer.terms(question)),
        persons,
    )


def held(sentence: str, question: Asked, tally: bool = True) -> float:
    """1.0 when `sentence` holds a value of the kind the question wants, else 0.0. A quantity
    ("how much land") is a measure in units or a count (a mass noun is also counted: "how
    much traffic", "40,000 vehicles a day"), never money or a year."""
    wanted = question.wanted
    if wanted is None or not sentence:
        return 0.0
    if wanted is AnswerType.AMOUNT:
        return float(attributes.holds_amount(sentence) or attributes.holds_tally(sentence))
    if wanted is AnswerType.TALLY and tally:
        if question.persons is None:
            return float(attributes.holds_tally(sentence))
        # a count of people where things are asked, or of things where people are, is weaker
        if attributes.holds_tally(sentence, of_persons=question.persons):
            return 1.0
        return 0.5 * attributes.holds_tally(sentence)
    if wanted is AnswerType.DURATION:
        return float(attributes.holds_measure(sentence, "duration"))
    if wanted is AnswerType.LONG and attributes.holds_measure(sentence, "duration"):
        return 1.0
    return float(answer.holds(sentence, wanted, set(question.words)))


def agreement(sentence: str, question: Asked, analyzer: Analyzer, params) -> float:
    """How far the attributes `sentence` states beyond the question's own words agree with
    those the question names (0..1)."""
    if not question.attributes or not sentence:
        return 0.0
    lexicon = attributes.lexicon(analyse_many, params.units, params.glossed)
    stated_terms = set(analyzer.terms(common_words(sentence))).difference(question.terms)
    stated = lexicon.attributes(stated_terms)
    if params.units:  # what its numbers' units measure, read as a unit ("kilometres per hour")
        for attribute, weight in attributes.measured(sentence).items():
            stated[attribute] = max(stated.get(attribute, 0.0), weight)
    if attributes.holds_tally(sentence):  # a count states a number ("139,000 bottles")
        stated["number"] = 1.0
    return attributes.agreement(question.attributes, stated)


def gloss_overlap(question_terms, sentences_terms: list[frozenset[str]]) -> list[float]:
    """For each of the subject's candidate sentences (their stems): how far the words only
    it has, not the others, and the question's words (`question_terms`: those not every
    candidate holds) overlap once expanded by their definitions (glosses.py), by the IDF
    of the shared definition words; 0..1, the best candidate 1."""
    table = glosses.glosses()
    asked = table.expand(question_terms, asked=True)
    scores = []
    for index, own in enumerate(sentences_terms):
        others = frozenset().union(*(t for j, t in enumerate(sentences_terms) if j != index))
        shared = asked & table.expand(own - others)
        scores.append(sum(map(table.idf, shared)))
    top = max(scores, default=0.0)
    return [score / top if top else 0.0 for score in scores]
