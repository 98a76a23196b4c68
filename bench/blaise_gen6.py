"""A sixth generator of Blaise recall tests, written apart after the last ranking change
(issue 33, round 6).

Rounds 4 to 6 were tuned on gen3's and gen4's hard misses after gen5 was written (gen5's
misses were never looked at, but its templates were known while tuning). This one was
written after round 6 was committed, committed before its first run, and is run only to
report, never to tune. Its entities, families, wordings and value formats are its own
(none is gen2's to gen5's: tested); its hard version has gen2's four decoys.

* four kinds of entity (a quarry, an orchard, a tramway, an organ), 16 families, two fact
  and two question templates each; a question shares no content word (Snowball stem, stop
  words aside) with a fact template of its family beyond the kind noun;
* value formats: fathoms, cubic yards, bushels, furlongs, shillings, riders a day, apple
  trees, pipes, feet of pipe;
* seeds 6000..; one split (all of it held out).

    python bench/blaise_gen6.py [--seeds 5] [--version easy|hard] [--no-baseline]
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

FIRST_SEED = 6000


def _year(rng, _names) -> str:
    return str(rng.randint(1640, 1925))


def _fathoms(rng, _names) -> str:
    return f"{rng.randint(6, 70)} fathoms"


def _cubic_yards(rng, _names) -> str:
    return f"{rng.randint(2, 90) * 1000:,} cubic yards"


def _bushels(rng, _names) -> str:
    return f"{rng.randint(300, 20000):,} bushels"


def _trees(rng, _names) -> str:
    return f"{rng.randint(200, 6000):,} apple trees"


def _hectares(rng, _names) -> str:
    return f"{rng.randint(3, 80)} hectares"


def _furlongs(rng, _names) -> str:
    return f"{rng.randint(8, 120)} furlongs"


def _shillings(rng, _names) -> str:
    return f"{rng.randint(1, 12)} shillings"


def _riders(rng, _names) -> str:
    return f"{rng.randint(500, 30000):,} riders"


def _pipes(rng, _names) -> str:
    return f"{rng.randint(400, 9000):,} pipes"


def _pipe_feet(rng, _names) -> str:
    return f"{rng.choice((8, 16, 32, 64))} feet"


def _person(rng, names) -> str:
    return f"{names.fresh(rng, 2)} {names.fresh(rng, 2)}"


ENTITY_FORMS = {
    "quarry": "the {N} quarry",
    "orchard": "the {N} orchard",
    "tramway": "the {N} tramway",
    "organ": "the {N} organ",
}
KIND_WORDS = {"quarri", "orchard", "tramway", "organ"}  # stems

# fmt: off
FAMILIES = (
    Family(
        "quarry_opened", "quarry", _year,
        ("Stone was first cut at {E} in {V}.", "Men have toiled in {E} since {V}."),
        (
            ("When did digging begin at {E}?", "Digging began at {E} in {V}."),
            ("In which year did {E} start producing?", "{E} started producing in {V}."),
        ),
        "Stone was first cut there long ago, and the pit has been worked ever since.",
    ),
    Family(
        "quarry_depth", "quarry", _fathoms,
        ("The floor of {E} lies {V} below the rim.", "{E} was sunk {V} into the hill."),
        (
            ("How deep is {E}?", "{E} is {V} deep."),
            ("How far down do the workings of {E} reach?", "The workings of {E} reach {V} down."),
        ),
        "The floor of a pit lies far below its rim once it is sunk into the hill.",
    ),
    Family(
        "quarry_output", "quarry", _cubic_yards,
        ("Each year {E} yields {V} of granite.", "Carts hauled {V} of rock out of {E} annually."),
        (
            ("How much material comes out of {E} in a twelvemonth?", "{V} of material comes out of {E} in a twelvemonth."),
            ("What volume of stone does {E} produce?", "{E} produces a volume of {V} of stone."),
        ),
        "Carts hauled granite out of the pit each year.",
    ),
    Family(
        "quarry_owner", "quarry", _person,
        ("{E} belonged to {V}.", "The lease of {E} was held by {V}."),
        (
            ("Who owned {E}?", "{V} owned {E}."),
            ("Which proprietor had {E}?", "The proprietor {V} had {E}."),
        ),
        "The lease of a pit belonged to a family of the valley.",
    ),
    Family(
        "orchard_trees", "orchard", _trees,
        ("{E} is planted with {V}.", "Rows of {V} fill {E}."),
        (
            ("How many fruit-bearing specimens grow in {E}?", "{V} grow in {E}."),
            ("What number of saplings were set out in {E}?", "{V} were set out in {E}."),
        ),
        "Rows of trees fill a walled garden once it is planted.",
    ),
    Family(
        "orchard_area", "orchard", _hectares,
        ("{E} extends over {V}.", "The walls of {E} enclose {V}."),
        (
            ("How much land does {E} occupy?", "{E} occupies {V} of land."),
            ("What acreage is under {E}?", "{V} of acreage is under {E}."),
        ),
        "The walls enclose a garden that extends over the slope.",
    ),
    Family(
        "orchard_harvest", "orchard", _bushels,
        ("Pickers gather {V} from {E} every autumn.", "{E} gives {V} of apples a year."),
        (
            ("What crop does {E} bring in?", "{E} brings in a crop of {V}."),
            ("How much fruit is picked in {E} each season?", "{V} of fruit is picked in {E} each season."),
        ),
        "Pickers gather apples every autumn.",
    ),
    Family(
        "orchard_planted", "orchard", _year,
        ("{E} was laid out in {V}.", "The first saplings went into {E} in {V}."),
        (
            ("When was {E} established?", "{E} was established in {V}."),
            ("In what year did planting of {E} take place?", "Planting of {E} took place in {V}."),
        ),
        "A garden is laid out long before the first apples are picked.",
    ),
    Family(
        "tramway_length", "tramway", _furlongs,
        ("The rails of {E} run {V}.", "{E} covers {V} from depot to terminus."),
        (
            ("How long is the line of {E}?", "The line of {E} is {V} long."),
            ("What distance does {E} travel?", "{E} travels a distance of {V}."),
        ),
        "The rails run from the depot to the terminus along the high street.",
    ),
    Family(
        "tramway_fare", "tramway", _shillings,
        ("A seat on {E} costs {V}.", "Riding {E} end to end is {V}."),
        (
            ("What is the price of a journey on {E}?", "The price of a journey on {E} is {V}."),
            ("How much must one pay for a trip on {E}?", "One must pay {V} for a trip on {E}."),
        ),
        "A seat on a car costs little when riding end to end.",
    ),
    Family(
        "tramway_riders", "tramway", _riders,
        ("{E} carries {V} daily.", "Every day {V} board {E}."),
        (
            ("How many passengers use {E}?", "{V} use {E}."),
            ("What is the ridership of {E}?", "The ridership of {E} is {V}."),
        ),
        "Every day the cars carry crowds to the market.",
    ),
    Family(
        "tramway_opened", "tramway", _year,
        ("The first car ran on {E} in {V}.", "{E} began service in {V}."),
        (
            ("When did {E} open?", "{E} opened in {V}."),
            ("In which year was {E} inaugurated?", "{E} was inaugurated in {V}."),
        ),
        "The first car ran to cheering crowds when the line began service.",
    ),
    Family(
        "organ_pipes", "organ", _pipes,
        ("{E} speaks through {V}.", "There are {V} in {E}."),
        (
            ("How many sounding tubes does {E} have?", "{E} has {V} sounding tubes."),
            ("What number of ranks and stops make up {E}?", "{V} make up {E}."),
        ),
        "A great instrument speaks through many ranks.",
    ),
    Family(
        "organ_builder", "organ", _person,
        ("The instrument maker {V} built {E}.", "{V} voiced and installed {E}."),
        (
            ("Who fashioned {E}?", "{V} fashioned {E}."),
            ("Which craftsman constructed {E}?", "The craftsman {V} constructed {E}."),
        ),
        "A master voiced and installed the instrument over two years.",
    ),
    Family(
        "organ_longest", "organ", _pipe_feet,
        ("The largest pipe of {E} is {V} long.", "The bass of {E} comes from a pipe {V} high."),
        (
            ("What is the height of the tallest tube in {E}?", "The tallest tube in {E} has a height of {V}."),
            ("How big is the biggest flue of {E}?", "The biggest flue of {E} is {V}."),
        ),
        "The bass comes from the largest pipe, which is very long.",
    ),
    Family(
        "organ_installed", "organ", _year,
        ("{E} was first played in {V}.", "{E} sounded for the first time in {V}."),
        (
            ("When was {E} completed?", "{E} was completed in {V}."),
            ("In what year was {E} dedicated?", "{E} was dedicated in {V}."),
        ),
        "The instrument sounded for the first time at a festival service.",
    ),
)
# fmt: on

BY_KIND = runs.by_kind(FAMILIES)


def check_templates() -> list[str]:
    return runs.check_templates(sys.modules[__name__])


def build_case(articles, seed: int, hard: bool):
    rng = random.Random(f"gen6/{seed}")
    facts = runs.make_facts(sys.modules[__name__], rng, gen2.corpus_names(articles), hard)
    return gen2.place(articles, facts, rng)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runs.add_arguments(parser, seeds=5)
    args = parser.parse_args(argv)
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    return runs.report("gen6", build_case, seeds, args, problems=check_templates())


if __name__ == "__main__":
    sys.exit(main())
