"""A fourth, small generator of Blaise recall tests, written apart (issue 33, round 2).

Written after round 2's ranking changes were chosen on bench/blaise_gen2.py's train split,
committed before its first run, and run only to report, never to tune. Its entities,
families, wordings and value formats are its own (none is gen2's or gen3's); gen2's
machinery is reused (invented names, placement of facts and decoys in the corpus, the run
and the BM25 baseline), as gen3 does.

* four kinds of entity (a canal, an abbey, an airship, a clock), 16 attribute families, two
  fact templates and two question templates each; a question shares no content word
  (Snowball stem, stop words aside) with a fact template of its family beyond the kind noun
  (`check_templates`);
* value formats neither gen2 nor gen3 uses: miles, yards, inches, pounds as a weight,
  cubic metres, kilometres per hour, locks, monks, volumes, crew;
* hard version: gen2's four decoys (the same entity with another attribute of its kind, a
  near name in the question's own words, the same value for another entity, the family's
  words without name or value);
* seeds 4000..; one split (all of it held out).

    python bench/blaise_gen4.py [--seeds 5] [--version easy|hard] [--no-baseline]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from collections import Counter
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import blaise_gen2 as gen2  # noqa: E402
from bench_blaise import CORPORA, TekkenTokenizer, machine_header, percentile, run_baseline  # noqa: E402

FIRST_SEED = 4000


def _year(rng, _names) -> str:
    return str(rng.randint(1602, 1938))


def _miles(rng, _names) -> str:
    return f"{rng.randint(9, 140)} miles"


def _yards(rng, _names) -> str:
    return f"{rng.randint(120, 260)} yards"


def _inches(rng, _names) -> str:
    return f"{rng.randint(30, 190)} inches"


def _pounds_weight(rng, _names) -> str:
    return f"{rng.randint(2, 60) * 100:,} pounds"


def _cubic_metres(rng, _names) -> str:
    return f"{rng.randint(20, 200) * 1000:,} cubic metres"


def _kmh(rng, _names) -> str:
    return f"{rng.randint(60, 140)} kilometres per hour"


def _locks(rng, _names) -> str:
    return f"{rng.randint(3, 91)} locks"


def _monks(rng, _names) -> str:
    return f"{rng.randint(12, 340)} monks"


def _volumes(rng, _names) -> str:
    return f"{rng.randint(800, 40000):,} volumes"


def _crew(rng, _names) -> str:
    return f"{rng.randint(9, 61)} airmen"


def _person(rng, names) -> str:
    return f"{names.fresh(rng, 2)} {names.fresh(rng, 2)}"


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    value: object
    facts: tuple[str, ...]  # {E} the entity, {V} the value
    questions: tuple[tuple[str, str], ...]  # (question, its statement in its own words)
    echo: str


ENTITY_FORMS = {
    "canal": "the {N} Canal",
    "abbey": "{N} Abbey",
    "airship": "the airship {N}",
    "clock": "the {N} clock",
}
KIND_WORDS = {"canal", "abbey", "airship", "clock"}  # stems

# fmt: off
FAMILIES = (
    Family(
        "canal_opened", "canal", _year,
        ("{E} was completed in {V}.", "Barges first passed along {E} in {V}."),
        (
            ("When did {E} open to traffic?", "{E} opened to traffic in {V}."),
            ("In which year was {E} finished?", "{E} was finished in {V}."),
        ),
        "Barges passed along the new cut once it was completed, and traffic grew each year.",
    ),
    Family(
        "canal_length", "canal", _miles,
        ("{E} winds through the country for {V}.", "The course of {E} stretches {V} from end to end."),
        (
            ("What is the length of {E}?", "The length of {E} is {V}."),
            ("What distance does {E} cover?", "{E} covers a distance of {V}."),
        ),
        "A waterway that winds through the country stretches far from end to end.",
    ),
    Family(
        "canal_engineer", "canal", _person,
        ("{E} was laid out by {V}.", "{V} surveyed and built {E}."),
        (
            ("Who designed {E}?", "{V} designed {E}."),
            ("Which engineer planned {E}?", "The engineer {V} planned {E}."),
        ),
        "Each cut was laid out by a surveyor who built it with gangs of navvies.",
    ),
    Family(
        "canal_locks", "canal", _locks,
        ("{E} climbs the hills through {V}.", "Boats on {E} pass {V} on the way."),
        (
            ("How many chambers raise vessels along {E}?", "Along {E}, {V} raise vessels."),
            ("What number of gates lift craft on {E}?", "{V} lift craft on {E}."),
        ),
        "Boats climb through flights of chambers on the way over the hills.",
    ),
    Family(
        "abbey_founded", "abbey", _year,
        ("{E} was established in {V}.", "Monks settled at {E} in {V}."),
        (
            ("When was {E} founded?", "{E} was founded in {V}."),
            ("In what year did religious life begin at {E}?", "Religious life began at {E} in {V}."),
        ),
        "Monks settled in the valley, and a house was established wherever a patron gave land.",
    ),
    Family(
        "abbey_monks", "abbey", _monks,
        ("At its height {E} housed {V}.", "{E} was home to {V}."),
        (
            ("How large was the community of {E}?", "The community of {E} was large: {V}."),
            ("How many brothers lived at {E}?", "{V} lived at {E}."),
        ),
        "At its height a house was home to many men, and some housed more than others.",
    ),
    Family(
        "abbey_abbot", "abbey", _person,
        ("{E} was ruled by {V}.", "{V} governed {E} for thirty years."),
        (
            ("Who led {E}?", "{V} led {E}."),
            ("Which abbot headed {E}?", "The abbot {V} headed {E}."),
        ),
        "Each house was ruled by a superior who governed it for many years.",
    ),
    Family(
        "abbey_library", "abbey", _volumes,
        ("The library of {E} held {V}.", "{E} kept {V} on its shelves."),
        (
            ("How many books did {E} own?", "{E} owned {V} in books."),
            ("How big was the collection of manuscripts at {E}?", "The manuscripts at {E} numbered {V}."),
        ),
        "A library held manuscripts on its shelves, and the richest kept thousands.",
    ),
    Family(
        "airship_first_flight", "airship", _year,
        ("{E} first flew in {V}.", "{E} took to the air in {V}."),
        (
            ("When was the maiden voyage of {E}?", "The maiden voyage of {E} was in {V}."),
            ("In what year did {E} leave the ground?", "{E} left the ground in {V}."),
        ),
        "Every new craft took to the air after months of trials, and flew only in calm weather.",
    ),
    Family(
        "airship_length", "airship", _yards,
        ("{E} measured {V} from nose to tail.", "The hull of {E} was {V} long."),
        (
            ("How big was {E} lengthwise?", "Lengthwise, {E} was {V}."),
            ("What was the size of {E} fore to aft?", "Fore to aft, {E} was {V}."),
        ),
        "A hull was measured from nose to tail, and the longest were the largest built.",
    ),
    Family(
        "airship_speed", "airship", _kmh,
        ("{E} cruised at {V}.", "{E} could make {V} in still air."),
        (
            ("How fast was {E}?", "{E} was fast: {V}."),
            ("What velocity did {E} reach?", "{E} reached a velocity of {V}."),
        ),
        "In still air a craft cruised steadily, and some could make good time.",
    ),
    Family(
        "airship_volume", "airship", _cubic_metres,
        ("The gas cells of {E} held {V} of hydrogen.", "{E} was filled with {V} of gas."),
        (
            ("How much lifting medium did {E} contain?", "{E} contained {V} of lifting medium."),
            ("What was the capacity of the envelope of {E}?", "The envelope of {E} had a capacity of {V}."),
        ),
        "Gas cells were filled with hydrogen, and larger cells held more of it.",
    ),
    Family(
        "clock_maker", "clock", _person,
        ("{E} was made by {V}.", "{V} built the movement of {E}."),
        (
            ("Who constructed {E}?", "{V} constructed {E}."),
            ("Which craftsman produced {E}?", "The craftsman {V} produced {E}."),
        ),
        "A movement was made by hand, and the best were built by a master.",
    ),
    Family(
        "clock_installed", "clock", _year,
        ("{E} was installed in {V}.", "{E} first struck the hour in {V}."),
        (
            ("When was {E} put in place?", "{E} was put in place in {V}."),
            ("In which year did {E} begin to keep time?", "{E} began to keep time in {V}."),
        ),
        "Once installed, a mechanism first struck the hour at noon.",
    ),
    Family(
        "clock_weight", "clock", _pounds_weight,
        ("The iron works of {E} come to {V}.", "Hoisting {E} meant lifting {V}."),
        (
            ("What is the weight of {E}?", "The weight of {E} is {V}."),
            ("How heavy is the mechanism of {E}?", "The mechanism of {E} is heavy: {V}."),
        ),
        "Iron works come to a great deal, and hoisting them means lifting with a crane.",
    ),
    Family(
        "clock_dial", "clock", _inches,
        ("The dial of {E} is {V} across.", "The face of {E} spans {V}."),
        (
            ("How wide is {E}?", "{E} is {V} wide."),
            ("What diameter does {E} have?", "{E} has a diameter of {V}."),
        ),
        "A face spans the front of a tower, and a dial is read from across the square.",
    ),
)
# fmt: on

BY_KIND: dict[str, list[Family]] = {}
for _family in FAMILIES:
    BY_KIND.setdefault(_family.kind, []).append(_family)


def check_templates() -> list[str]:
    """Every (question, fact template) pair of a family that shares a content word beyond
    the kind noun: none is allowed."""
    problems = []
    for family in FAMILIES:
        for question, _ in family.questions:
            asked = gen2.content_stems(question) - KIND_WORDS
            for fact in family.facts:
                shared = asked & gen2.content_stems(fact)
                if shared:
                    problems.append(f"{family.name}: {question!r} / {fact!r} share {shared}")
    return problems


def make_facts(rng, names: gen2.Names, hard: bool, count: int = gen2.NUM_FACTS):
    facts = []
    for index in range(count):
        family = FAMILIES[index % len(FAMILIES)]
        name = names.fresh(rng, rng.choice((2, 3)))
        entity = ENTITY_FORMS[family.kind].replace("{N}", name)
        value = family.value(rng, names)
        sentence = gen2.render(rng.choice(family.facts), entity, value)
        question, statement = rng.choice(family.questions)
        decoys = {}
        if hard:
            other = rng.choice([f for f in BY_KIND[family.kind] if f is not family])
            decoys["same_entity"] = gen2.render(
                rng.choice(other.facts), entity, other.value(rng, names)
            )
            near = ENTITY_FORMS[family.kind].replace("{N}", names.near(rng, name))
            decoys["near_name"] = gen2.render(statement, near, family.value(rng, names))
            someone = ENTITY_FORMS[family.kind].replace("{N}", names.fresh(rng, 2))
            decoys["same_value"] = gen2.render(rng.choice(family.facts), someone, value)
            decoys["echo"] = family.echo
        facts.append(gen2.Fact(family.name, sentence, gen2.render(question, entity, ""), decoys))
    return facts


def build_case(articles, seed: int, hard: bool):
    rng = random.Random(f"gen4/{seed}")
    facts = make_facts(rng, gen2.corpus_names(articles), hard)
    return gen2.place(articles, facts, rng)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--version", choices=("easy", "hard"), default="hard")
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="wiki")
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args(argv)
    problems = check_templates()
    if problems:
        raise SystemExit("templates share content words:\n" + "\n".join(problems))
    for line in machine_header():
        print(line)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    articles = CORPORA[args.corpus]()
    tokenizer = TekkenTokenizer()
    hits, base_hits, tokens, latencies, misses = [], [], [], [], Counter()
    for seed in range(FIRST_SEED, FIRST_SEED + args.seeds):
        docs, facts = build_case(articles, seed, args.version == "hard")
        result = gen2.run_blaise(docs, facts, tokenizer)
        base = None if args.no_baseline else run_baseline(docs, facts, tokenizer)
        hits.append(result.hits)
        base_hits.append(base.hits if base else -1)
        tokens += result.tokens
        latencies += result.latencies_ms
        misses.update(result.misses)
        print(
            f"gen4 {args.version} seed {seed}: Blaise {result.hits}/{len(facts)}"
            + (f", BM25 baseline {base.hits}/{len(facts)}" if base else "")
            + f"; misses {dict(result.misses)}",
            flush=True,
        )
    print(
        f"summary gen4 {args.version}: Blaise {hits} (min {min(hits)}, median "
        f"{statistics.median(hits)}), baseline {base_hits}; misses {dict(misses)}; tokens/q "
        f"median {statistics.median(tokens):.0f} (p95 {percentile(tokens, 0.95):.0f}); select "
        f"p95 {percentile(latencies, 0.95):.2f} ms; load {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
