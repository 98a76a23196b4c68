"""A fifth generator of Blaise recall tests, written apart (issue 33, round 3).

Round 3's ranking changes were chosen on the hard misses of gen3 and gen4, so neither is held
out any more; this one was written after those changes were committed, before its first run,
and is run only to report, never to tune. Its entities, families, wordings and value formats
are its own (none is gen2's, gen3's or gen4's: tested), and so is its hardest decoy:

* four kinds of entity (a windmill, a ferry, a museum, a reservoir), 16 families, two fact
  and two question templates each; a question shares no content word (Snowball stem, stop
  words aside) with a fact template of its family beyond the kind noun;
* value formats none of the others uses: sacks, passengers, paintings, minutes, guilders,
  acres, litres, square kilometres, metres of sail;
* hard version: gen2's four decoys, plus a second decoy about the same entity with a third
  attribute of its kind (`same_entity_2`), so two of the entity's other statements compete;
* seeds 5000..; one split (all of it held out).

    python bench/blaise_gen5.py [--seeds 5] [--version easy|hard] [--no-baseline]
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

FIRST_SEED = 5000


def _year(rng, _names) -> str:
    return str(rng.randint(1611, 1931))


def _sacks(rng, _names) -> str:
    return f"{rng.randint(40, 900)} sacks"


def _sail_metres(rng, _names) -> str:
    return f"{rng.randint(9, 29)} metres"


def _passengers(rng, _names) -> str:
    return f"{rng.randint(30, 1400):,} passengers"


def _minutes(rng, _names) -> str:
    return f"{rng.randint(12, 95)} minutes"


def _guilders(rng, _names) -> str:
    return f"{rng.randint(2, 90)} guilders"


def _paintings(rng, _names) -> str:
    return f"{rng.randint(150, 9000):,} paintings"


def _acres(rng, _names) -> str:
    return f"{rng.randint(2, 40)} acres"


def _litres(rng, _names) -> str:
    return f"{rng.randint(3, 900) * 1_000_000:,} litres"


def _square_km(rng, _names) -> str:
    return f"{rng.randint(2, 60)} square kilometres"


def _depth_metres(rng, _names) -> str:
    return f"{rng.randint(8, 120)} metres"


def _person(rng, names) -> str:
    return f"{names.fresh(rng, 2)} {names.fresh(rng, 2)}"


ENTITY_FORMS = {
    "windmill": "the {N} windmill",
    "ferry": "the {N} ferry",
    "museum": "the {N} Museum",
    "reservoir": "the {N} reservoir",
}
KIND_WORDS = {"windmil", "ferri", "museum", "reservoir"}  # stems

# fmt: off
FAMILIES = (
    Family(
        "windmill_raised", "windmill", _year,
        ("Millwrights raised {E} in {V}.", "{E} has stood on its mound since {V}."),
        (
            ("When was {E} constructed?", "{E} was constructed in {V}."),
            ("In what year did builders erect {E}?", "Builders erected {E} in {V}."),
        ),
        "Millwrights raised many a post mill on its mound in those days.",
    ),
    Family(
        "windmill_sails", "windmill", _sail_metres,
        ("Each sail of {E} reaches {V}.", "The sweeps of {E} turn a circle of {V}."),
        (
            ("How long are the arms of {E}?", "The arms of {E} are {V} long."),
            ("What span do the blades of {E} have?", "The blades of {E} span {V}."),
        ),
        "Each sail of a mill reaches out, and the sweeps turn a wide circle.",
    ),
    Family(
        "windmill_output", "windmill", _sacks,
        ("{E} ground {V} of flour a week.", "Every seven days {E} filled {V} of meal."),
        (
            ("What quantity of grain did {E} process?", "{E} processed {V} of grain."),
            ("How much corn went through {E}?", "{V} of corn went through {E}."),
        ),
        "A mill ground flour every week and filled its meal bins.",
    ),
    Family(
        "windmill_miller", "windmill", _person,
        ("{V} ran {E} for forty years.", "{E} was worked by the miller {V}."),
        (
            ("Who operated {E}?", "{V} operated {E}."),
            ("Which tradesman kept {E} turning?", "The tradesman {V} kept {E} turning."),
        ),
        "The miller ran the mill for forty years and worked it alone.",
    ),
    Family(
        "ferry_crossing", "ferry", _minutes,
        ("The crossing on {E} lasts {V}.", "{E} reaches the far shore after {V}."),
        (
            ("How long does a journey aboard {E} take?", "A journey aboard {E} takes {V}."),
            ("What is the travel time of {E}?", "The travel time of {E} is {V}."),
        ),
        "The crossing lasts a while before a boat reaches the far shore.",
    ),
    Family(
        "ferry_capacity", "ferry", _passengers,
        ("{E} carries up to {V}.", "There is room for {V} on {E}."),
        (
            ("How many travellers fit on {E}?", "{V} fit on {E}."),
            ("What number of people can board {E}?", "{V} can board {E}."),
        ),
        "A boat carries only so many, and there is room for few in winter.",
    ),
    Family(
        "ferry_fare", "ferry", _guilders,
        ("A ticket for {E} costs {V}.", "Riding {E} costs {V} each way."),
        (
            ("What is the fare on {E}?", "The fare on {E} is {V}."),
            ("How much must a rider pay to use {E}?", "A rider must pay {V} to use {E}."),
        ),
        "A ticket costs a little each way, whatever the weather.",
    ),
    Family(
        "ferry_service", "ferry", _year,
        ("{E} entered service in {V}.", "{E} made its maiden voyage in {V}."),
        (
            ("When did {E} start sailing?", "{E} started sailing in {V}."),
            ("In which year was {E} first in operation?", "{E} was first in operation in {V}."),
        ),
        "A new boat entered service once its maiden voyage was behind it.",
    ),
    Family(
        "museum_paintings", "museum", _paintings,
        ("{E} displays {V}.", "The collection of {E} numbers {V}."),
        (
            ("How many canvases hang in {E}?", "{V} hang in {E}."),
            ("How large is the art holding of {E}?", "The art holding of {E} is {V}."),
        ),
        "A gallery displays its collection, which numbers many works.",
    ),
    Family(
        "museum_founder", "museum", _person,
        ("{E} was endowed by {V}.", "{V} gave the money that began {E}."),
        (
            ("Who established {E}?", "{V} established {E}."),
            ("Which benefactor created {E}?", "The benefactor {V} created {E}."),
        ),
        "A wealthy patron endowed the gallery and gave money to begin it.",
    ),
    Family(
        "museum_grounds", "museum", _acres,
        ("The galleries of {E} cover {V}.", "{E} sprawls over {V}."),
        (
            ("How much floor space does {E} have?", "{E} has {V} of floor space."),
            ("What is the extent of {E}?", "The extent of {E} is {V}."),
        ),
        "The galleries cover a great deal and sprawl over the old palace.",
    ),
    Family(
        "museum_opened", "museum", _year,
        ("{E} first admitted the public in {V}.", "Visitors were let into {E} from {V}."),
        (
            ("When did {E} open its doors?", "{E} opened its doors in {V}."),
            ("In what year was {E} inaugurated?", "{E} was inaugurated in {V}."),
        ),
        "The public was first admitted once the visitors' entrance was let in.",
    ),
    Family(
        "reservoir_volume", "reservoir", _litres,
        ("{E} holds {V} of water.", "When full, {E} contains {V}."),
        (
            ("What volume can {E} store?", "{E} can store a volume of {V}."),
            ("How much liquid is kept in {E}?", "{V} of liquid is kept in {E}."),
        ),
        "A lake held by a dam contains water when full.",
    ),
    Family(
        "reservoir_depth", "reservoir", _depth_metres,
        ("{E} is {V} deep at the dam.", "Divers measured {E} at {V} to the bottom."),
        (
            ("How far below the surface does {E} reach?", "{E} reaches {V} below the surface."),
            ("What is the profundity of {E}?", "The profundity of {E} is {V}."),
        ),
        "Divers measured the lake down to the bottom near the dam.",
    ),
    Family(
        "reservoir_surface", "reservoir", _square_km,
        ("{E} covers {V} of the valley.", "The waters of {E} spread across {V}."),
        (
            ("How much ground lies under {E}?", "{V} of ground lies under {E}."),
            ("What expanse does {E} flood?", "{E} floods an expanse of {V}."),
        ),
        "The waters spread across the valley and covered the farms.",
    ),
    Family(
        "reservoir_filled", "reservoir", _year,
        ("{E} was filled for the first time in {V}.", "Water first rose behind {E}'s dam in {V}."),
        (
            ("When was {E} finished?", "{E} was finished in {V}."),
            ("In which year did {E} come into use?", "{E} came into use in {V}."),
        ),
        "The valley was filled for the first time when water rose behind a dam.",
    ),
)
# fmt: on

BY_KIND = runs.by_kind(FAMILIES)


def check_templates() -> list[str]:
    return runs.check_templates(sys.modules[__name__])


def build_case(articles, seed: int, hard: bool):
    rng = random.Random(f"gen5/{seed}")
    module = sys.modules[__name__]
    facts = runs.make_facts(module, rng, gen2.corpus_names(articles), hard, same_entity=2)
    return gen2.place(articles, facts, rng)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runs.add_arguments(parser, seeds=5)
    args = parser.parse_args(argv)
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    return runs.report("gen5", build_case, seeds, args, problems=check_templates())


if __name__ == "__main__":
    sys.exit(main())
