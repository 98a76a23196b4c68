"""A second, independent generator of Blaise recall tests, with a train / held-out split.

Written without reading bench_blaise.py's templates (only its corpus loaders, tokenizer and
baseline are reused), so that a ranking tuned on that bench can be checked on wording it has
never seen (issue 22):

* six kinds of invented entity (a ship, a hall, a lake, a bell, a mine, an accord), each with
  two to four attribute families (19 in all: launch year, displacement, top speed, builder,
  cost, architect, seats, floor area, depth, water temperature, outflow, weight, caster,
  casting year, closing year, workforce, shaft depth, duration, place of signing);
* every family has four fact templates and four or five question templates; a question shares
  no content word (Snowball stem, stop words aside) with any fact template of its family,
  beyond the entity's own name and kind noun: "first took to the water" for "launched", "set
  its owners back" for "cost" (checked for every pair by `check_templates`, and by a test);
* a split: `train` uses the first two fact templates, the first question templates and seeds
  0..; `heldout` the other fact templates, the other question templates and seeds 1000..;
  no weight, lexicon or rule may be chosen on held-out runs;
* hard version: per fact four decoys, each at least 25 KB of corpus away from the fact:
  the same entity with another attribute of its kind (`same_entity`), a near-name entity
  (one or two letters changed) stated in the question's own words (`near_name`), the same
  value for another entity of the kind (`same_value`), and the fact's own words in an
  unrelated place, without its name or value (`echo`);
* the metric: the selected section holds the whole fact sentence; a miss is classified by
  which decoy (or none) the selected section holds.

    python bench/blaise_gen2.py [--split train|heldout] [--seeds 3] [--version easy|hard]
                                [--corpus wiki|pydoc] [--show-misses] [--no-baseline]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_blaise import (  # noqa: E402
    PAGE_SIZE,
)

from hicache_galahad.blaise import Blaise  # noqa: E402
from hicache_galahad.blaise.analyzer import STOP_WORDS  # noqa: E402
from hicache_galahad.blaise.rank import RankParams  # noqa: E402

NUM_FACTS = 100
DECOY_DISTANCE = 25_000  # bytes of corpus between a fact and each of its decoys
SPLIT_SEEDS = {"train": 0, "heldout": 1000}


# ------------------------------------------------------------------------------ values


def _syllable_name(rng: random.Random, parts: int) -> str:
    onsets = [
        "b",
        "br",
        "d",
        "dr",
        "f",
        "g",
        "gr",
        "h",
        "k",
        "kl",
        "l",
        "m",
        "n",
        "p",
        "pr",
        "r",
        "s",
        "st",
        "t",
        "th",
        "v",
        "w",
        "z",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "r", "l", "s", "th", "m", "nd", "rk"]
    word = "".join(
        rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(parts)
    )
    return word.capitalize()


def _year(rng, _names) -> str:
    return str(rng.randint(1712, 1988))


def _money(rng, _names) -> str:
    return f"£{rng.randint(12, 987) / 10:.1f} million"


def _tonnes(rng, _names) -> str:
    return f"{rng.randint(1200, 48000):,} tonnes"


def _knots(rng, _names) -> str:
    return f"{rng.randint(9, 38)} knots"


def _metres(rng, _names) -> str:
    return f"{rng.randint(14, 1900):,} metres"


def _celsius(rng, _names) -> str:
    return f"{rng.randint(4, 96)} degrees Celsius"


def _square_metres(rng, _names) -> str:
    return f"{rng.randint(800, 64000):,} square metres"


def _count(rng, _names) -> str:
    return f"{rng.randint(140, 48000):,}"


def _kilograms(rng, _names) -> str:
    return f"{rng.randint(90, 21000):,} kilograms"


def _years(rng, _names) -> str:
    return f"{rng.randint(3, 140)} years"


def _person(rng, names) -> str:
    return f"{names.fresh(rng, 2)} {names.fresh(rng, 3)}"


def _place(rng, names) -> str:
    return names.fresh(rng, 3)


# ------------------------------------------------------------------------------ families


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # the entity kind (ENTITY_FORMS)
    value: object  # (rng, names) -> a value string
    facts: tuple[str, ...]  # {E} the entity, {V} the value; first two: train
    questions: tuple[tuple[str, str], ...]  # (question, its statement in its own words)
    heldout_from: int  # questions[heldout_from:] are held out
    echo: str  # the family's fact words, without a name or a value


ENTITY_FORMS = {
    "ship": "the {N}",
    "hall": "the {N} Hall",
    "lake": "Lake {N}",
    "bell": "the {N} bell",
    "mine": "the {N} mine",
    "accord": "the {N} Accord",
}

FAMILIES = (
    Family(
        "launch_year", "ship", _year,
        (
            "{E} was launched in {V}.",
            "Shipwrights launched {E} in {V}.",
            "{E} slid down the slipway in {V}.",
            "The hull of {E} left the stocks in {V}.",
        ),
        (
            ("In what year did {E} first take to the water?", "{E} first took to the water in {V}."),
            ("When was {E} set afloat for the first time?", "{E} was set afloat for the first time in {V}."),
            ("When did {E} first touch the sea?", "{E} first touched the sea in {V}."),
            ("In which year did {E} get wet for the first time?", "{E} got wet for the first time in {V}."),
        ),
        2,
        "Large ships were launched here and slid down a slipway with the whole town watching, "
        "once the hull left the stocks.",
    ),
    Family(
        "displacement", "ship", _tonnes,
        (
            "{E} displaced {V} when fully loaded.",
            "{E} had a displacement of {V}.",
            "Fully laden, {E} displaced {V}.",
            "{E} came in at {V} of displacement.",
        ),
        (
            ("How heavy was {E}?", "{E} was heavy, at {V}."),
            ("What did {E} weigh?", "{E} weighed {V}."),
            ("What mass did {E} amount to?", "{E} amounted to a mass of {V}."),
            ("What was the heft of {E}?", "The heft of {E} was {V}."),
        ),
        2,
        "Harbour dues depended on how much a ship displaced when fully loaded, and displacement "
        "came in tonnes.",
    ),
    Family(
        "top_speed", "ship", _knots,
        (
            "{E} could make {V} in calm weather.",
            "On trials {E} reached {V}.",
            "{E} logged {V} on her trials.",
            "{E} managed a best of {V}.",
        ),
        (
            ("How fast could {E} go?", "{E} could go fast, up to {V}."),
            ("What was the top speed of {E}?", "The top speed of {E} was {V}."),
            ("How quickly did {E} move through the waves?", "{E} moved quickly through the waves, at {V}."),
            ("At what pace could {E} sail?", "{E} could sail at a pace of {V}."),
        ),
        2,
        "In calm weather a ship could make good headway, and trials were logged to see what "
        "she reached at best.",
    ),
    Family(
        "builder", "ship", _person,
        (
            "{E} was built by {V}.",
            "{V} built {E} at a yard on the river.",
            "{E} came from the yard of {V}.",
            "The shipwright {V} constructed {E}.",
        ),
        (
            ("Who put {E} together?", "{V} put {E} together."),
            ("Whose workshop produced {E}?", "The workshop of {V} produced {E}."),
            ("Who was responsible for making {E}?", "{V} was responsible for making {E}."),
            ("By whose hands was {E} assembled?", "{E} was assembled by the hands of {V}."),
        ),
        2,
        "Most ships on the river were built at a yard that came to a single shipwright, who "
        "constructed them in turn.",
    ),
    Family(
        "cost", "hall", _money,
        (
            "{E} cost {V} to build.",
            "Building {E} cost {V}.",
            "The price of {E} came to {V}.",
            "{E} was completed for {V}.",
        ),
        (
            ("How much did {E} set its owners back?", "{E} set its owners back {V}."),
            ("What did the city pay for {E}?", "The city paid {V} for {E}."),
            ("What sum went into erecting {E}?", "{V} went into erecting {E}."),
            ("How much money was spent on {E}?", "{V} of money was spent on {E}."),
        ),
        2,
        "What it cost to build a hall was rarely written down, and the price of building came "
        "out of local taxes once it was completed.",
    ),
    Family(
        "architect", "hall", _person,
        (
            "{E} was designed by {V}.",
            "The architect of {E} was {V}.",
            "{V} drew up the plans for {E}.",
            "{E} follows a design by {V}.",
        ),
        (
            ("Whose vision shaped {E}?", "The vision of {V} shaped {E}."),
            ("Who conceived the look of {E}?", "{V} conceived the look of {E}."),
            ("Who came up with the layout of {E}?", "{V} came up with the layout of {E}."),
            ("Which person sketched {E} before it was raised?", "The person {V} sketched {E} before it was raised."),
        ),
        2,
        "Each public building in the district was designed by an architect, who drew up plans "
        "that the masons would follow.",
    ),
    Family(
        "seats", "hall", _count,
        (
            "{E} has {V} seats.",
            "{E} seats {V} spectators.",
            "There are {V} chairs in {E}.",
            "{E} offers room for {V} spectators.",
        ),
        (
            ("How many people can {E} accommodate?", "{E} can accommodate {V} people."),
            ("What is the capacity of {E}?", "The capacity of {E} is {V}."),
            ("How big an audience fits inside {E}?", "An audience of {V} fits inside {E}."),
            ("How many visitors can {E} take at once?", "{E} can take {V} visitors at once."),
        ),
        2,
        "Older theatres had few seats, and chairs for spectators were often hired, which offers "
        "room only at the front.",
    ),
    Family(
        "floor_area", "hall", _square_metres,
        (
            "{E} covers {V}.",
            "The floor of {E} spans {V}.",
            "{E} occupies {V} of ground.",
            "{E} has {V} of floor space.",
        ),
        (
            ("How big is the footprint of {E}?", "The footprint of {E} is big, at {V}."),
            ("How much land does {E} take up?", "{E} takes up {V} of land."),
            ("What surface does {E} extend over?", "{E} extends over a surface of {V}."),
            ("How large is {E} in area?", "{E} is {V} in area."),
        ),
        2,
        "A building whose floor spans several plots occupies much ground, and its space is "
        "counted in square metres; nobody covers that cheaply.",
    ),
    Family(
        "depth", "lake", _metres,
        (
            "{E} is {V} deep.",
            "{E} reaches a depth of {V}.",
            "Soundings of {E} found {V} of water.",
            "The bed of {E} lies {V} below its surface.",
        ),
        (
            ("How far down does {E} go?", "{E} goes {V} down."),
            ("How far is it to the bottom of {E}?", "It is {V} to the bottom of {E}."),
            ("What is the distance from the top of {E} to its floor?", "The distance from the top of {E} to its floor is {V}."),
            ("How profound is {E}?", "{E} is profound, at {V}."),
        ),
        2,
        "Soundings found the bed deep below the surface in most places, and the water reaches "
        "each recorded depth slowly.",
    ),
    Family(
        "water_temperature", "lake", _celsius,
        (
            "The water of {E} stays at {V} through the summer.",
            "{E} has a temperature of {V}.",
            "Bathers in {E} find it at {V}.",
            "Thermometers dipped in {E} read {V}.",
        ),
        (
            ("How warm does {E} get?", "{E} gets warm, up to {V}."),
            ("How hot or cold is {E}?", "{E} is hot or cold at {V}."),
            ("How much heat does {E} hold?", "{E} holds heat of {V}."),
            ("What warmth would a swimmer feel in {E}?", "A swimmer would feel a warmth of {V} in {E}."),
        ),
        2,
        "Bathers find the water stays mild through the summer, and thermometers dipped in it "
        "read the temperature daily.",
    ),
    Family(
        "outflow", "lake", _place,
        (
            "{E} drains into the estuary at {V}.",
            "The outlet of {E} runs to {V}.",
            "{E} empties at {V}.",
            "{E} spills over toward {V}.",
        ),
        (
            ("Where does the overflow from {E} end up?", "The overflow from {E} ends up at {V}."),
            ("To what place does {E} send its surplus?", "{E} sends its surplus to {V}."),
            ("Where do the waters leaving {E} go?", "The waters leaving {E} go to {V}."),
            ("What destination does {E} discharge into?", "{E} discharges into {V}."),
        ),
        2,
        "The outlet runs through marsh, drains the lower fields, empties into a creek and spills "
        "over into the estuary in spring.",
    ),
    Family(
        "bell_weight", "bell", _kilograms,
        (
            "{E} weighs {V}.",
            "{E} has a mass of {V}.",
            "{E} tips the scales at {V}.",
            "In bronze, {E} comes to {V}.",
        ),
        (
            ("How heavy is {E}?", "{E} is heavy, at {V}."),
            ("What load does {E} put on its frame?", "{E} puts a load of {V} on its frame."),
            ("How much would {E} register on a balance?", "{E} would register {V} on a balance."),
            ("What is the heft of {E}?", "The heft of {E} is {V}."),
        ),
        2,
        "A bell that weighs much needs a strong tower; the mass of bronze tips the scales for "
        "any founder and comes to a fortune.",
    ),
    Family(
        "caster", "bell", _person,
        (
            "{E} was cast by {V}.",
            "{V} cast {E}.",
            "{E} was poured at the foundry of {V}.",
            "The founder {V} made {E}.",
        ),
        (
            ("Who produced {E}?", "{V} produced {E}."),
            ("Which craftsman created {E}?", "The craftsman {V} created {E}."),
            ("Who gave {E} its shape in metal?", "{V} gave {E} its shape in metal."),
            ("Whose workshop turned out {E}?", "The workshop of {V} turned out {E}."),
        ),
        2,
        "Bells here were cast by a founder, poured at a foundry outside the walls and made to "
        "order.",
    ),
    Family(
        "cast_year", "bell", _year,
        (
            "{E} was cast in {V}.",
            "{E} dates from {V}.",
            "{E} first rang in {V}.",
            "{E} was hung in the tower in {V}.",
        ),
        (
            ("In what year was {E} made?", "{E} was made in the year {V}."),
            ("When did {E} come into being?", "{E} came into being in {V}."),
            ("Since which year has {E} existed?", "{E} has existed since {V}."),
            ("When was {E} created?", "{E} was created in {V}."),
        ),
        2,
        "Bells were usually hung in the tower soon after they were cast, and first rang at a "
        "feast; most dates are lost.",
    ),
    Family(
        "closing_year", "mine", _year,
        (
            "{E} closed in {V}.",
            "{E} shut down in {V}.",
            "Work at {E} stopped for good in {V}.",
            "{E} was abandoned in {V}.",
        ),
        (
            ("When did {E} cease operations?", "{E} ceased operations in {V}."),
            ("In what year did {E} go out of business?", "{E} went out of business in {V}."),
            ("When did the last shift leave {E}?", "The last shift left {E} in {V}."),
            ("In which year did {E} end production?", "{E} ended production in {V}."),
        ),
        2,
        "Many pits closed and shut down for good when work stopped, and the shafts were "
        "abandoned to the water.",
    ),
    Family(
        "workforce", "mine", _count,
        (
            "{E} employed {V} miners.",
            "At its peak {E} had {V} men underground.",
            "{E} gave work to {V} people.",
            "The payroll of {E} listed {V} names.",
        ),
        (
            ("How many workers did {E} have?", "{E} had {V} workers."),
            ("How large was the staff of {E}?", "The staff of {E} was large, at {V}."),
            ("How many hands laboured at {E}?", "{V} hands laboured at {E}."),
            ("What was the headcount of {E}?", "The headcount of {E} was {V}."),
        ),
        2,
        "The company employed miners and men underground at its peak, gave work to people from "
        "three parishes and listed their names on a payroll.",
    ),
    Family(
        "shaft_depth", "mine", _metres,
        (
            "The main shaft of {E} is {V} deep.",
            "{E} was sunk to {V}.",
            "The lowest gallery of {E} lies {V} beneath the surface.",
            "{E} descends {V}.",
        ),
        (
            ("How far down does {E} go?", "{E} goes {V} down."),
            ("How far under the ground do the workings of {E} reach?", "The workings of {E} reach {V} under the ground."),
            ("What is the distance to the bottom of {E}?", "The distance to the bottom of {E} is {V}."),
            ("How profound are the tunnels of {E}?", "The tunnels of {E} are profound, at {V}."),
        ),
        2,
        "A main shaft was sunk deep beneath the surface, and each gallery descends in steps to "
        "the lowest level.",
    ),
    Family(
        "duration", "accord", _years,
        (
            "{E} remained in force for {V}.",
            "{E} lasted {V}.",
            "{E} held for {V} before it lapsed.",
            "{E} was observed for {V}.",
        ),
        (
            ("How long did {E} survive?", "{E} survived for a long {V}."),
            ("For what span of time was {E} valid?", "{E} was valid for a span of {V}."),
            ("How long was {E} honoured?", "{E} was honoured for {V}."),
            ("What was the lifetime of {E}?", "The lifetime of {E} was {V}."),
        ),
        2,
        "Such treaties remained in force only while they were observed; most lapsed, and none "
        "lasted or held through a war.",
    ),
    Family(
        "signing_place", "accord", _place,
        (
            "{E} was signed at {V}.",
            "Envoys put their names to {E} in {V}.",
            "{E} was concluded in the town of {V}.",
            "The seals were set on {E} at {V}.",
        ),
        (
            ("Where was {E} agreed?", "{E} was agreed at {V}."),
            ("In what city was {E} ratified?", "{E} was ratified in the city of {V}."),
            ("Where did the parties come to terms on {E}?", "The parties came to terms on {E} at {V}."),
            ("At which place was {E} made official?", "{E} was made official at the place {V}."),
        ),
        2,
        "Envoys signed treaties in a market town, concluded them over dinner and set their seals "
        "beside their names.",
    ),
)  # fmt: skip

BY_KIND: dict[str, list[Family]] = {}
for _family in FAMILIES:
    BY_KIND.setdefault(_family.kind, []).append(_family)


def fact_templates(family: Family, split: str) -> tuple[str, ...]:
    return family.facts[:2] if split == "train" else family.facts[2:]


def question_templates(family: Family, split: str) -> tuple[tuple[str, str], ...]:
    at = family.heldout_from
    return family.questions[:at] if split == "train" else family.questions[at:]


# ------------------------------------------------------------------------------ checks

_WORD = re.compile(r"[A-Za-z]+")


def content_stems(text: str) -> set[str]:
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    words = [w.lower() for w in _WORD.findall(text.replace("{E}", " ").replace("{V}", " "))]
    return set(stemmer.stemWords([w for w in words if w not in STOP_WORDS]))


KIND_WORDS = {"hall", "lake", "bell", "mine", "accord"}  # the entity's own words


def check_templates() -> list[str]:
    """Every (question, fact template) pair of a family that shares a content word: none
    is allowed."""
    problems = []
    for family in FAMILIES:
        for question, _ in family.questions:
            asked = content_stems(question) - KIND_WORDS
            for fact in family.facts:
                shared = asked & content_stems(fact)
                if shared:
                    problems.append(f"{family.name}: {question!r} / {fact!r} share {shared}")
    return problems


# ------------------------------------------------------------------------------ cases


class Names:
    """Invented names absent from the corpus (and from each other)."""

    def __init__(self, corpus_words: set[str]):
        self.taken = set(corpus_words)

    def fresh(self, rng, parts: int = 2) -> str:
        while True:
            name = _syllable_name(rng, parts)
            if name.lower() not in self.taken and len(name) >= 5:
                self.taken.add(name.lower())
                return name

    def near(self, rng, name: str) -> str:
        """`name` with one or two letters changed: absent from the corpus and unused."""
        letters = "aeioubdfgklmnprstvz"
        while True:
            chars = list(name.lower())
            for _ in range(rng.choice((1, 2))):
                at = rng.randrange(1, len(chars))
                chars[at] = rng.choice([c for c in letters if c != chars[at]])
            near = "".join(chars).capitalize()
            if near.lower() not in self.taken:
                self.taken.add(near.lower())
                return near


def _cap(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:]


def render(template: str, entity: str, value: str) -> str:
    return _cap(template.replace("{E}", entity).replace("{V}", value))


@dataclass
class Fact:
    family: str
    sentence: str
    question: str
    decoys: dict  # kind -> sentence


def make_facts(rng, names: Names, split: str, hard: bool, count: int = NUM_FACTS) -> list[Fact]:
    facts = []
    for index in range(count):
        family = FAMILIES[index % len(FAMILIES)]
        name = names.fresh(rng, rng.choice((2, 3)))
        entity = ENTITY_FORMS[family.kind].replace("{N}", name)
        value = family.value(rng, names)
        sentence = render(rng.choice(fact_templates(family, split)), entity, value)
        question, statement = rng.choice(question_templates(family, split))
        decoys = {}
        if hard:
            other = rng.choice([f for f in BY_KIND[family.kind] if f is not family])
            decoys["same_entity"] = render(
                rng.choice(fact_templates(other, split)), entity, other.value(rng, names)
            )
            near = ENTITY_FORMS[family.kind].replace("{N}", names.near(rng, name))
            decoys["near_name"] = render(statement, near, family.value(rng, names))
            someone = ENTITY_FORMS[family.kind].replace("{N}", names.fresh(rng, 2))
            decoys["same_value"] = render(rng.choice(fact_templates(family, split)), someone, value)
            decoys["echo"] = family.echo
        facts.append(Fact(family.name, sentence, render(question, entity, ""), decoys))
    return facts


_STARTS = re.compile(rb"(?<=[.!?] )(?=[A-Z])|(?<=\n\n)(?=[A-Z])")


def build_case(articles, seed: int, split: str, hard: bool):
    """(docs, facts): the corpus with every fact at depth 1% + 98% i / 99 and its decoys
    at random sentence starts at least DECOY_DISTANCE bytes away."""
    rng = random.Random(f"gen2/{split}/{seed}")
    names = corpus_names(articles)
    facts = make_facts(rng, names, split, hard)
    return place(articles, facts, rng)


def corpus_names(articles) -> Names:
    """A name maker whose names are absent from the corpus' words."""
    words = {w.lower() for _, text in articles for w in re.findall(r"[A-Za-z]+", text)}
    return Names(words)


def place(articles, facts: list[Fact], rng):
    """(docs, facts): `facts` inserted as build_case says (also used by blaise_gen3.py)."""
    datas = [text.encode() for _, text in articles]
    starts = []  # (global offset, doc index, offset in doc)
    base = 0
    for number, data in enumerate(datas):
        starts += [(base + m.start(), number, m.start()) for m in _STARTS.finditer(data)]
        base += len(data)
    total = base
    positions = [s[0] for s in starts]
    inserts: dict[tuple[int, int], list[str]] = {}

    def at_or_after(offset: int):
        import bisect

        return starts[min(len(starts) - 1, bisect.bisect_left(positions, offset))]

    for index, fact in enumerate(facts):
        where = at_or_after(int(total * (0.01 + 0.98 * index / max(1, len(facts) - 1))))
        inserts.setdefault(where[1:], []).append(fact.sentence)
        for sentence in fact.decoys.values():
            while True:
                spot = at_or_after(rng.randrange(total))
                if abs(spot[0] - where[0]) >= DECOY_DISTANCE:
                    break
            inserts.setdefault(spot[1:], []).append(sentence)
    docs = []
    for number, ((title, _), data) in enumerate(zip(articles, datas, strict=True)):
        cuts = sorted(
            (off, sentences) for (doc, off), sentences in inserts.items() if doc == number
        )
        out, last = [], 0
        for offset, sentences in cuts:
            out.append(data[last:offset])
            out.append(" ".join(sentences).encode() + b" ")
            last = offset
        out.append(data[last:])
        docs.append((title, b"".join(out).decode()))
    return docs, facts


# ------------------------------------------------------------------------------ runs


@dataclass
class Result:
    hits: int
    misses: Counter
    tokens: list[int]
    latencies_ms: list[float]
    add_s: float
    missed: list[str]


def run_blaise(docs, facts, tokenizer, params: RankParams | None = None) -> Result:
    misses: Counter = Counter()
    tokens, latencies, missed = [], [], []
    hits = 0
    with tempfile.TemporaryDirectory(prefix="blaise-gen2-") as root:
        memory = Blaise(root, rank_params=params)
        started = time.perf_counter()
        for title, text in docs:
            memory.add(title, text)
        add_s = time.perf_counter() - started
        for fact in facts:
            started = time.perf_counter()
            found = memory.select(fact.question)
            latencies.append((time.perf_counter() - started) * 1000)
            text = found[0].text if found else ""
            if fact.sentence in text:
                hits += 1
            else:
                kind = next((k for k, s in fact.decoys.items() if s in text), "other")
                misses[kind] += 1
                missed.append(
                    f"[{kind}] {fact.question} -> {fact.sentence}"
                    + (f"  <= {fact.decoys.get(kind)}" if kind in fact.decoys else "")
                )
            if found and tokenizer is not None:
                prompt = memory.prompt(
                    fact.question, tokenizer, page_size=PAGE_SIZE, selection=found[0]
                )
                tokens.append(len(prompt.input_ids))
        memory.close()
    return Result(hits, misses, tokens, latencies, add_s, missed)


def main(argv: list[str] | None = None) -> int:
    import blaise_runs as runs  # (it imports this module)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=sorted(SPLIT_SEEDS), default="train")
    runs.add_arguments(parser, seeds=3)
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE",
        help="a RankParams field for Blaise (an ablation), e.g. units=0",
    )  # fmt: skip
    args = parser.parse_args(argv)
    fields: dict = {}
    params = RankParams()
    for item in args.set:
        name, _, value = item.partition("=")
        kind = type(getattr(params, name))
        fields[name] = kind(float(value)) if kind is not bool else value not in ("0", "false")
    first = SPLIT_SEEDS[args.split]

    def build(articles, seed, hard):
        return build_case(articles, seed, args.split, hard)

    seeds = range(first, first + args.seeds)
    return runs.report(
        args.split, build, seeds, args, RankParams(**fields), problems=check_templates()
    )


if __name__ == "__main__":
    sys.exit(main())
