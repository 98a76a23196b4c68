"""Expected answer types: what kind of value a question asks for, and whether a sentence holds
one. Pure code: regular expressions, and WordNet's noun lists (attributes_data.py).

The classic cue of question answering systems (the TREC QA track's answer types): "who" asks
for a person, "where" for a place, "when" for a date, "how much money" for an amount, "how
high" for a length, "how many" for a count, "how much <noun>" for a quantity of it (a
measure or a count, not money); without a cue word, the head noun of "what/which <noun>"
says it from its WordNet first sense (a person, money, a time period, a place; a group asks
for a count of its members). A sentence that shares the question's rare words
(a name) but holds no value of the asked kind is less likely to answer it; this is what
separates the sentence about an entity's founding year from another about its leader when the
question words ("established", "created") appear in neither.
"""

from __future__ import annotations

import enum
import re

from .attributes_data import (
    ATTRIBUTES,
    DURATION_NOUNS,
    GROUP_NOUNS,
    MONEY_NOUNS,
    PERSON_NOUNS,
    PLACE_NOUNS,
)


class AnswerType(enum.Enum):
    PERSON = "person"
    PLACE = "place"
    YEAR = "year"
    MONEY = "money"
    LENGTH = "length"
    COUNT = "count"
    TALLY = "tally"  # how many: a count of things, not a measure (attributes.holds_tally)
    DURATION = "duration"  # a number of units of time (attributes.holds_measure)
    LONG = "long"  # how long: a length or a duration
    AMOUNT = "amount"  # how much <noun>: a quantity in units of measurement (attributes)


# words after "how much" that are no noun: "how much did it cost", "how much of the land"
_FUNCTION_WORDS = (
    r"do|does|did|is|are|was|were|be|been|has|have|had|can|could|will|would|shall|should|may|"
    r"might|must|it|its|they|their|this|that|these|those|he|she|we|you|i|of|more|less|in|on|"
    r"for|to|at|by|from|longer|further|farther|larger|higher|greater|later|earlier|older"
)

_QUESTION_RULES = (
    (
        AnswerType.PERSON,
        r"\bwho\b|\bwhom\b|\bwhose\b|\bwhich (person|man|woman|people|engineer|scientist|"
        r"naturalist|inventor|author|writer|architect|artist|king|queen|ruler|leader|founder)\b",
    ),
    (
        AnswerType.PLACE,
        r"\bwhere\b|\b(which|what) (valley|region|country|city|town|village|area|place|part|"
        r"province|state|county|district|continent|island)\b",
    ),
    (AnswerType.YEAR, r"\bwhen\b|\b(what|which) (year|century|decade)\b|\bhow old\b"),
    (
        AnswerType.MONEY,
        r"\bhow (much money|expensive|costly)\b|\b(cost|costs|price|sum|money|paid|spent|"
        r"expended|budget|worth)\b",
    ),
    # "how much <noun>" asks for a quantity of a mass noun ("how much land", "how much
    # water"): a measure, in units; not money (asked above), not a tally ("how many")
    (AnswerType.AMOUNT, rf"\bhow much (?!(?:{_FUNCTION_WORDS})\b)[a-z]+\b"),
    (AnswerType.LONG, r"\bhow long\b"),
    (
        AnswerType.LENGTH,
        r"\bhow (high|tall|far|deep|wide|thick)\b|\b(height|length|distance|elevation|"
        r"altitude|width|depth)\b",
    ),
    # "how many", "the number of <things>": a count of things
    (AnswerType.TALLY, r"\bhow many\b|\bnumber of\b"),
    (
        AnswerType.COUNT,
        r"\bhow (much|large|big)\b|\b(number|size|amount|quantity|count|population|"
        r"share|percentage|total) of\b|\b(what|which) (number|size|amount|quantity|count|"
        r"population|share|percentage|total)\b",
    ),
    # any other "how <adjective>" asks for a degree: a number of some kind
    (
        AnswerType.COUNT,
        r"\bhow (?!do\b|does\b|did\b|is\b|are\b|was\b|were\b|can\b|could\b|"
        r"should\b|would\b|will\b|to\b|come\b)[a-z]+\b",
    ),
)
_QUESTION = [(kind, re.compile(pattern, re.I)) for kind, pattern in _QUESTION_RULES]

_UNITS = (
    r"metres?|meters?|m|km|kilometres?|kilometers?|miles?|feet|foot|ft|yards?|inches|inch|cm|"
    r"centimetres?|centimeters?|mm|millimetres?|millimeters?|nautical miles?|leagues?"
)
_YEAR = re.compile(
    rf"(?<![\d,.])(1[0-9]{{3}}|20[0-9]{{2}})(?!\d|[,.]\d|\s*(%|percent|per\b|({_UNITS})\b))"
)
_NUMBER = re.compile(r"(?<![\w.,])\d+(,\d{3})*(\.\d+)?")
_CURRENCY = (
    r"dollars?|euros?|pounds?|francs?|marks?|crowns?|kronor|kronur|krona|yen|rupees?|pesos?|"
    r"shillings?|guilders?|ducats?|florins?|lire|lira|rubles?|roubles?|yuan|dinars?|rand|won"
)
# An amount: a run of digits, commas and full stops, then the unit. Such a match is tried only
# from the start of the run (the look-behind; leading marks skipped) and the run is taken
# whole (possessive: a unit never starts with a digit or a mark), so a 10 KB run
# "1990,1990,..." is read once: tried from every digit, as "\d[\d,.]*", it was quadratic (20 s
# for one question). A sentence holds a match exactly when the plain form would find one.
_AMOUNT = r"(?<![\d,.])[,.]*+\d[\d,.]*+"
_MONEY = re.compile(
    rf"[$€£¥₹]\s?\d|{_AMOUNT}\s*+(thousand\s+|million\s+|billion\s+)?({_CURRENCY})\b", re.I
)
_LENGTH = re.compile(rf"{_AMOUNT}\s*+(-\s*)?({_UNITS})\b", re.I)
_PLACE_WORDS = (
    r"Valley|River|Mountains?|Mount|Lake|Hills?|Coast|Province|Region|County|District|Island|"
    r"Islands|Bay|Plain|Plains|Forest|Desert|Sea|Ocean|Gulf|Peninsula|Basin|Highlands|Canyon|"
    r"Strait|City|Town|Village|State|Kingdom|Republic"
)
_PLACE = re.compile(
    rf"\b(in|at|near|from|of|to|across|along|beside) (the )?[A-Z][\w'-]+( [A-Z][\w'-]+)*"
    rf"( ({_PLACE_WORDS}))?\b"
)
_NAME_PAIR = re.compile(r"\b([A-Z][a-z'-]+(?: [A-Z][a-z'-]+)+)")
_NOT_A_PERSON = re.compile(
    rf"\b({_PLACE_WORDS}|Institute|Society|Guild|Academy|University|College|Company|Museum|"
    r"Church|Party|Council|Association|Foundation|Bridge|Tower|Dam|Lighthouse|Hall|Station|"
    r"Street|Road|Square|Park|Palace|Castle|Cathedral|Empire|War|Treaty|Act|Award|Prize)\b"
)


_ASKED_NOUN = re.compile(r"\b(?:which|what) ([a-z]+)\b", re.I)
# "what is the admission fee of ...": the last word before a preposition or the end
_ASKED_PHRASE = re.compile(
    r"\b(?:which|what) (?:is|was|are|were) (?:the|its|their) ((?:[a-z]+ ){0,3}?)([a-z]+)"
    r"(?= (?:of|for|at|on|in|to|charged|paid)\b|\?|$)",
    re.I,
)
_ATTRIBUTE_WORDS = frozenset(word for words in ATTRIBUTES.values() for word in words)
# what a head noun's first sense is (WordNet, attributes_data.py), in this order
_HEAD_NOUN_TYPES = (
    (PERSON_NOUNS, AnswerType.PERSON),
    (MONEY_NOUNS, AnswerType.MONEY),
    (DURATION_NOUNS, AnswerType.DURATION),
    (PLACE_NOUNS, AnswerType.PLACE),
)


def question_type(question: str) -> AnswerType | None:
    """The kind of value `question` asks for, or None when no cue says. Besides the cue
    words, the head noun of "which/what <noun>" or "what is the ... <noun> of" says it when
    its first sense in WordNet is a person ("which craftsman"), an amount of money ("the
    admission fee"), a time period ("for what period") or a place ("what locality"; not an
    attribute's own word, such as *area*), and a size or number asked of a group
    (GROUP_NOUNS: "how large was the staff") is a count of its members."""
    headed = _head_noun_type(question)
    if headed is AnswerType.PERSON:
        return headed
    for kind, pattern in _QUESTION:
        if pattern.search(question):
            if kind is AnswerType.COUNT and _names_a_group(question):
                return AnswerType.TALLY  # the size of a group: a count of its members
            return kind
    return headed  # the head noun's, when no cue word says


_NOT_NOUNS = frozenset(_FUNCTION_WORDS.split("|"))


def _head_noun_type(question: str) -> AnswerType | None:
    heads = [m.group(2) for m in _ASKED_PHRASE.finditer(question)]
    heads += [m.group(1) for m in _ASKED_NOUN.finditer(question)]
    for head in heads:
        if head.lower() in _NOT_NOUNS:
            continue  # "what was", "which did"
        noun = _singular(head.lower())
        for nouns, kind in _HEAD_NOUN_TYPES:
            if noun in nouns and (kind is AnswerType.PERSON or noun not in _ATTRIBUTE_WORDS):
                return kind
    return None


def head_noun(question: str) -> str | None:
    """The head noun of "what is the ... <noun> of" (None when the question has none)."""
    match = _ASKED_PHRASE.search(question)
    return match.group(2) if match else None


def asks_group_size(question: str) -> bool:
    """Whether a what/which question names a group ("What is the turnout at ...?"): without
    another cue, it asks for the group's size, a count of its members."""
    return bool(_WHAT.search(question)) and _names_a_group(question)


_WHAT = re.compile(r"\b(?:what|which)\b", re.I)
_COUNTED = re.compile(r"\bhow many ([a-z]+)\b", re.I)


def counts_persons(question: str) -> bool | None:
    """Whether `question` asks for a number of people: True for "how many <person noun>"
    ("how many brothers") or the size of a group it names ("the community", "the staff"),
    False when it names the things counted and they are not people ("how many locks", "the
    collection of manuscripts"), None when it names none."""
    counted = _COUNTED.search(question) or _MEMBERS.search(question)
    if counted:
        return is_person_noun(counted.group(1))
    return True if _names_a_group(question) else None


# the members of a group: "the collection of manuscripts"
_MEMBERS = re.compile(r"\b[a-z]+ of ([a-z]+s)\b(?<!ss)")


def is_person_noun(word: str) -> bool:
    """Whether `word` (a noun, maybe plural) names a person or a group of people."""
    noun = _singular(word.lower())
    return noun in PERSON_NOUNS or noun in GROUP_NOUNS


_DETERMINED = re.compile(r"\b(?:the|a|an|its|their|his|her|this|that) ([a-z]+)\b", re.I)


def _names_a_group(question: str) -> bool:
    """Whether `question` names, after a determiner (where a noun stands: "the staff", not
    "set ... back"), a noun whose first sense is a group (GROUP_NOUNS, from WordNet: staff,
    audience, crew)."""
    return any(_singular(m.group(1).lower()) in GROUP_NOUNS for m in _DETERMINED.finditer(question))


def _singular(noun: str) -> str:
    if noun in PERSON_NOUNS or noun in GROUP_NOUNS or not noun.endswith("s"):
        return noun
    return noun[:-2] if noun.endswith(("ches", "shes", "sses")) else noun[:-1]


def holds(sentence: str, kind: AnswerType, question_words: set[str]) -> bool:
    """Whether `sentence` holds a value of `kind` other than the question's own words
    (`question_words`: lower-cased words of the question)."""
    if kind is AnswerType.YEAR:
        return bool(_YEAR.search(sentence))
    if kind is AnswerType.MONEY:
        return bool(_MONEY.search(sentence))
    if kind is AnswerType.LENGTH or kind is AnswerType.LONG:  # (a duration: see rank.py)
        return bool(_LENGTH.search(sentence))
    if kind in (AnswerType.COUNT, AnswerType.TALLY, AnswerType.AMOUNT):  # (see attributes)
        return any(not _YEAR.match(sentence, m.start()) for m in _NUMBER.finditer(sentence))
    if kind is AnswerType.PLACE:
        return any(_is_new(m.group(), question_words) for m in _PLACE.finditer(sentence))
    if kind is not AnswerType.PERSON:
        return False  # a duration: in units of time (attributes.holds_measure)
    return any(
        _is_new(m.group(), question_words) and not _NOT_A_PERSON.search(m.group())
        for m in _NAME_PAIR.finditer(sentence)
    )


def _is_new(phrase: str, question_words: set[str]) -> bool:
    """Whether a phrase has a capitalized word that the question does not contain."""
    return any(
        word[0].isupper() and word.lower() not in question_words
        for word in re.findall(r"[\w'-]+", phrase)
    )
