"""Which measurable attribute a question asks about, and which ones a sentence states, from
an attribute lexicon derived from WordNet 3.0 (attributes_data.py, made by
make_attributes.py; nothing hand-written). Pure code.

A question that names no answer type through its wh-word ("What did the bridge set its owners
back?") or a generic one ("How big is the tower from bottom to top?") often names the attribute
with other words: "set back" is a troponym of "cost", "top" is in WordNet's definition of
height. The ranker adds a bonus to a candidate whose best sentence states an attribute the
question asks about, and when the wh-word gives no type it takes the attribute's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from . import answer
from .answer import AnswerType
from .attributes_data import ATTRIBUTES, GLOSSED, UNITS

# the value kind of each attribute, for a question whose wh-word says nothing
ANSWER_TYPES = {
    "number": AnswerType.COUNT,
    "money": AnswerType.MONEY,
    "distance": AnswerType.LENGTH,
    "length": AnswerType.LENGTH,
    "height": AnswerType.LENGTH,
    "width": AnswerType.LENGTH,
    "depth": AnswerType.LENGTH,
    "area": AnswerType.COUNT,
    "size": AnswerType.COUNT,
    "weight": AnswerType.COUNT,
    "speed": AnswerType.COUNT,
    "temperature": AnswerType.COUNT,
    "age": AnswerType.YEAR,
    "duration": AnswerType.DURATION,
    "volume": AnswerType.COUNT,
}


class Lexicon:
    """The attribute lexicon over stems (the ranker's analysis)."""

    def __init__(
        self,
        analyse: Callable[[list[str]], list[list[str]]],
        units: bool = True,
        glossed: bool = True,
    ):
        """`analyse`: texts -> the terms of each (stems, stop words out); `units`: with
        WordNet's units of measurement (UNITS); `glossed`: with the words whose first
        sense's definition names an attribute (GLOSSED)."""
        items = [(a, w, weight) for a, words in ATTRIBUTES.items() for w, weight in words.items()]
        if units:  # a unit states what it measures: "4,381 kilograms" is a weight
            items += [(a, unit, 1.0) for unit, measured in UNITS.items() for a in measured]
        if glossed:  # weigh: "have a certain weight"
            items += [(a, w, weight) for w, found in GLOSSED.items() for a, weight in found.items()]
        analysed = analyse([word.replace("_", " ").replace("-", " ") for _, word, _ in items])
        entries: dict[tuple[str, ...], dict[str, float]] = {}
        for (attribute, _, weight), terms_of in zip(items, analysed, strict=True):
            terms = tuple(sorted(set(terms_of)))
            if terms:
                slot = entries.setdefault(terms, {})
                slot[attribute] = max(slot.get(attribute, 0.0), weight)
        # a word of several attributes says less about each: its weight is shared among them
        self.single: dict[str, dict[str, float]] = {}
        self.multi: dict[str, list[tuple[frozenset[str], dict[str, float]]]] = {}  # by 1st term
        for terms, found in entries.items():
            shared = {attribute: weight / len(found) for attribute, weight in found.items()}
            if len(terms) == 1:
                self.single[terms[0]] = shared
            else:
                self.multi.setdefault(terms[0], []).append((frozenset(terms), shared))

    def attributes(self, terms: Iterable[str]) -> dict[str, float]:
        """attribute -> evidence (the sum of its words' weights) for a set of terms."""
        present = set(terms)
        found: dict[str, float] = {}
        single, multi = self.single, self.multi
        for term in present:
            shares = [single[term]] if term in single else []
            shares += [shared for parts, shared in multi.get(term, ()) if parts <= present]
            for shared in shares:
                for attribute, weight in shared.items():
                    found[attribute] = found.get(attribute, 0.0) + weight
        return found


_LEXICONS: dict[tuple[bool, bool], Lexicon] = {}


def lexicon(
    analyse: Callable[[list[str]], list[list[str]]], units: bool = True, glossed: bool = True
) -> Lexicon:
    """The process's lexicon, built on first use (a few milliseconds; it does not depend on
    the corpus). `analyse` must be the analysis every ranker uses."""
    found = _LEXICONS.get((units, glossed))
    if found is None:
        found = _LEXICONS[(units, glossed)] = Lexicon(analyse, units, glossed)
    return found


_TALLIED = re.compile(r"(?<![\w.,$€£¥])(\d+(?:,\d{3})*(?:\.\d+)?)(?:\s+([A-Za-z]+))?")


def holds_tally(sentence: str, of_persons: bool | None = None) -> bool:
    """Whether `sentence` holds a count of things ("how many"): a number that is not a year,
    not an amount of money and not followed by a unit of measurement that does not measure
    a number (UNITS: "8,555 seats" and "17,561 men" are counts, "1,479 metres" and "£80.5
    million" are not). `of_persons` True: a count of people, the number followed by a noun
    of a person or a group ("251 monks", not "251 volumes"); False: a count of other things."""
    for match in _TALLIED.finditer(sentence):
        if answer.holds(match.group(), AnswerType.YEAR, set()) and "," not in match.group(1):
            continue
        after = (match.group(2) or "").lower()
        if after in ("million", "billion", "thousand") or _MONEY_AT.match(sentence, match.end()):
            continue
        measured = _unit_at(sentence, match)
        if measured and "number" not in measured:
            continue
        if of_persons is not None and of_persons != answer.is_person_noun(after):
            continue
        return True
    return False


def holds_measure(sentence: str, attribute: str) -> bool:
    """Whether `sentence` holds a number followed by a unit that measures `attribute`
    ("34 years": a duration; "5,446 square metres": an area)."""
    return any(attribute in _unit_at(sentence, m) for m in _TALLIED.finditer(sentence))


def measured(sentence: str) -> dict[str, float]:
    """attribute -> evidence for what the units after the numbers of `sentence` measure (a
    unit of several attributes shares its weight among them: "4,200 pounds" is money or
    weight; "102 kilometres per hour" is a speed). A unit of a dimension (DIMENSIONS) states
    a size as well, sharing the weight: "173 yards" answers "how big ... lengthwise"."""
    found: dict[str, float] = {}
    for match in _TALLIED.finditer(sentence):
        units = _unit_at(sentence, match)
        if DIMENSIONS.intersection(units) and "size" not in units:
            units = [*units, "size"]
        for attribute in units:
            found[attribute] = max(found.get(attribute, 0.0), 1.0 / len(units))
    return found


# the dimensions of a thing's size (Li and Roth's *size* class; WordNet's dimensions)
DIMENSIONS = frozenset(("length", "height", "width", "depth", "area", "distance"))


def holds_amount(sentence: str) -> bool:
    """Whether `sentence` holds a quantity in units of measurement ("how much land": "spans
    929 square metres", "holds 40 litres"): a number followed by a unit (UNITS) that measures
    something other than money ("£80 million" and "8,555 seats" are not)."""
    return any(
        set(_unit_at(sentence, m)).difference(("money",)) for m in _TALLIED.finditer(sentence)
    )


_NEXT_WORD = re.compile(r"\s+([A-Za-z]+)")


def _unit_at(sentence: str, match: re.Match) -> list[str]:
    """What the unit after a number measures (UNITS; a plural's -s or -es off, and a unit of
    two words, "square metres", before one of one word); [] when no unit follows. A unit of
    distance per unit of time ("kilometres per hour", "miles an hour") measures speed."""
    first = (match.group(2) or "").lower()
    if not first:
        return []
    following = _NEXT_WORD.match(sentence, match.end())
    if following:
        pair = f"{first}_{following.group(1).lower()}"
        found = _unit(pair)
        if found:
            return found
    found = _unit(first)
    if following and {"distance", "length"} & set(found):
        rate = _PER_UNIT.match(sentence, following.start())
        if rate and "duration" in _unit(rate.group(1).lower()):
            return ["speed"]
    return found


_PER_UNIT = re.compile(r"\s+(?:per|an|a|each|every)\s+([A-Za-z]+)", re.I)


def _unit(word: str) -> list[str]:
    return UNITS.get(word) or UNITS.get(word[:-1]) or UNITS.get(word[:-2]) or []


_MONEY_AT = re.compile(r"\s*(dollars?|euros?|pounds?|francs?|marks?|crowns?|yen)\b", re.I)


def agreement(asked: dict[str, float], stated: dict[str, float]) -> float:
    """How far a sentence states what a question asks (0..1): the asked attributes' weights
    (each at most 1) that the sentence states, over their sum when that is more than 1 (a
    sentence stating one of two attributes asked is not as good as one stating both)."""
    total = sum(min(1.0, w) * min(1.0, stated.get(a, 0.0)) for a, w in asked.items())
    return total / max(1.0, sum(min(1.0, w) for w in asked.values()))


def answer_type(asked: dict[str, float]) -> AnswerType | None:
    """The value kind of the attribute with the most evidence (None when none has any)."""
    if not asked:
        return None
    best = max(sorted(asked), key=asked.__getitem__)
    return ANSWER_TYPES[best]
