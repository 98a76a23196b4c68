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
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import blaise_gen2 as gen2  # noqa: E402
import blaise_runs as runs  # noqa: E402
from blaise_runs import Family  # noqa: E402

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

BY_KIND = runs.by_kind(FAMILIES)


def check_templates() -> list[str]:
    return runs.check_templates(sys.modules[__name__])


def build_case(articles, seed: int, hard: bool):
    rng = random.Random(f"gen4/{seed}")
    facts = runs.make_facts(sys.modules[__name__], rng, gen2.corpus_names(articles), hard)
    return gen2.place(articles, facts, rng)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runs.add_arguments(parser, seeds=5)
    args = parser.parse_args(argv)
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    return runs.report("gen4", build_case, seeds, args, problems=check_templates())


if __name__ == "__main__":
    sys.exit(main())
