"""An eighth generator of Blaise recall tests, written apart before round 10 (blaise-5),
committed before its first run, run only to report (once on round 9's code, once at the
end), never to tune.

Its entities, families, wordings and value formats are its own (none is gen2's to gen7's:
tested), written as a new user would ask, with no look at which words the lexicon knows; its
hard version has gen2's four decoys.

* four kinds of entity (a dam, a cathedral, a locomotive, an island), 16 families, two fact
  and two question templates each; a question shares no content word (Snowball stem, stop
  words aside) with a fact template of its family beyond the kind noun;
* value formats: megawatts, million francs, bells, miles per hour, tonnes, miles run,
  square kilometres, inhabitants, kilometres offshore;
* seeds 8000..; one split (all of it held out).

    python bench/blaise_gen8.py [--seeds 5] [--version easy|hard] [--no-baseline]
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

FIRST_SEED = 8000


def _year(rng, _names) -> str:
    return str(rng.randint(1650, 1960))


def _dam_height(rng, _names) -> str:
    return f"{rng.randint(25, 240)} metres"


def _megawatts(rng, _names) -> str:
    return f"{rng.randint(15, 2400):,} megawatts"


def _francs(rng, _names) -> str:
    return f"{rng.randint(3, 480)} million francs"


def _spire(rng, _names) -> str:
    return f"{rng.randint(40, 160)} metres"


def _bells(rng, _names) -> str:
    return f"{rng.randint(5, 16)} bells"


def _mph(rng, _names) -> str:
    return f"{rng.randint(45, 126)} miles per hour"


def _tonnes(rng, _names) -> str:
    return f"{rng.randint(40, 240)} tonnes"


def _mileage(rng, _names) -> str:
    return f"{rng.randint(80, 2400) * 1000:,} miles"


def _island_area(rng, _names) -> str:
    return f"{rng.randint(2, 900)} square kilometres"


def _inhabitants(rng, _names) -> str:
    return f"{rng.randint(30, 9000):,} inhabitants"


def _offshore(rng, _names) -> str:
    return f"{rng.randint(2, 120)} kilometres"


def _person(rng, names) -> str:
    return f"{names.fresh(rng, 2)} {names.fresh(rng, 2)}"


ENTITY_FORMS = {
    "dam": "the {N} Dam",
    "cathedral": "{N} Cathedral",
    "locomotive": "the locomotive {N}",
    "island": "the island of {N}",
}
KIND_WORDS = {"dam", "cathedr", "locomot", "island"}  # stems

# fmt: off
FAMILIES = (
    Family(
        "dam_height", "dam", _dam_height,
        ("{E} rises {V} from its foundations.", "The crest of {E} stands {V} above the riverbed."),
        (
            ("How tall is {E}?", "{E} is {V} tall."),
            ("What is the height of the wall of {E}?", "The wall of {E} has a height of {V}."),
        ),
        "The crest stands above the riverbed, with a road running along it.",
    ),
    Family(
        "dam_power", "dam", _megawatts,
        ("{E} generates {V}.", "The turbines of {E} deliver {V}."),
        (
            ("How much electricity can {E} produce?", "{E} can produce {V} of electricity."),
            ("What is the output of the power station at {E}?", "The power station at {E} has an output of {V}."),
        ),
        "Turbines deliver current to the towns down the valley.",
    ),
    Family(
        "dam_cost", "dam", _francs,
        ("{E} was built for {V}.", "The bill for {E} came to {V}."),
        (
            ("What was the price tag of {E}?", "The price tag of {E} was {V}."),
            ("How much money went into {E}?", "{V} went into {E}."),
        ),
        "The bill was shared between the canton and the railway company.",
    ),
    Family(
        "dam_completed", "dam", _year,
        ("{E} was sealed in {V}.", "Water first backed up behind {E} in {V}."),
        (
            ("In which year was {E} completed?", "{E} was completed in {V}."),
            ("When did {E} go into service?", "{E} went into service in {V}."),
        ),
        "Water first backed up behind the wall during a wet spring.",
    ),
    Family(
        "cathedral_spire", "cathedral", _spire,
        ("The spire of {E} soars to {V}.", "{E} reaches {V} at the tip of its steeple."),
        (
            ("How high does {E} rise?", "{E} rises {V} high."),
            ("What is the altitude of the summit of {E}?", "The summit of {E} has an altitude of {V}."),
        ),
        "The spire soars above the roofs of the old town.",
    ),
    Family(
        "cathedral_bells", "cathedral", _bells,
        ("{E} has a ring of {V}.", "The tower of {E} houses {V}."),
        (
            ("How many are in the peal of {E}?", "{V} are in the peal of {E}."),
            ("What number of chimes can be rung at {E}?", "{V} can be rung at {E}."),
        ),
        "The tower houses a ring cast by a foundry in the capital.",
    ),
    Family(
        "cathedral_consecrated", "cathedral", _year,
        ("{E} was consecrated in {V}.", "The bishop blessed {E} in {V}."),
        (
            ("When was {E} dedicated?", "{E} was dedicated in {V}."),
            ("In what year was {E} hallowed?", "{E} was hallowed in {V}."),
        ),
        "The bishop blessed the nave before the transepts were roofed.",
    ),
    Family(
        "cathedral_architect", "cathedral", _person,
        ("{E} was raised to the designs of {V}.", "The plans for {E} were drawn by {V}."),
        (
            ("Who was the architect of {E}?", "{V} was the architect of {E}."),
            ("Which master mason laid out {E}?", "The master mason {V} laid out {E}."),
        ),
        "Plans for a church were drawn on parchment and kept in the chapter house.",
    ),
    Family(
        "locomotive_speed", "locomotive", _mph,
        ("{E} hauled expresses at up to {V}.", "On a test run {E} touched {V}."),
        (
            ("What was the fastest that {E} ever went?", "The fastest that {E} ever went was {V}."),
            ("How quick was {E} at its best?", "{E} was {V} quick at its best."),
        ),
        "A test run on the main line drew crowds to every bridge.",
    ),
    Family(
        "locomotive_weight", "locomotive", _tonnes,
        ("{E} tipped the scales at {V}.", "In working order {E} came to {V}."),
        (
            ("How heavy was {E} with a full tender?", "{E} was {V} heavy with a full tender."),
            ("What was the mass of {E}?", "The mass of {E} was {V}."),
        ),
        "In working order an engine carried its coal and water with it.",
    ),
    Family(
        "locomotive_mileage", "locomotive", _mileage,
        ("{E} covered {V} before it was withdrawn.", "Over its career {E} ran up {V}."),
        (
            ("How far did {E} travel in service?", "{E} travelled {V} in service."),
            ("What total distance did {E} log?", "{E} logged a total distance of {V}."),
        ),
        "Engines were withdrawn when their boilers wore out.",
    ),
    Family(
        "locomotive_designer", "locomotive", _person,
        ("{E} was the work of {V}.", "{V} drafted the plans for {E}."),
        (
            ("Who was the designer of {E}?", "{V} was the designer of {E}."),
            ("Which engineer was behind {E}?", "The engineer {V} was behind {E}."),
        ),
        "The drawing office drew up plans for a new class of engine every few years.",
    ),
    Family(
        "island_area", "island", _island_area,
        ("{E} covers {V} in all.", "{E} spreads over {V} of moor and bog."),
        (
            ("How big is {E}?", "{E} is {V} big."),
            ("What is the land area of {E}?", "The land area of {E} is {V}."),
        ),
        "Moor and bog cover most of the interior.",
    ),
    Family(
        "island_population", "island", _inhabitants,
        ("{E} is home to {V}.", "{V} live on {E} all year."),
        (
            ("How many people reside on {E}?", "{V} people reside on {E}."),
            ("What is the population of {E}?", "The population of {E} is {V}."),
        ),
        "Few people live there all year; the summer brings walkers and birders.",
    ),
    Family(
        "island_offshore", "island", _offshore,
        ("{E} lies {V} off the mainland.", "The ferry crossing to {E} is {V}."),
        (
            ("How far from the coast is {E}?", "{E} is {V} from the coast."),
            ("What distance separates {E} from shore?", "A distance of {V} separates {E} from shore."),
        ),
        "The ferry crossing is rough in winter.",
    ),
    Family(
        "island_settled", "island", _year,
        ("Monks first landed on {E} in {V}.", "{E} was settled in {V}."),
        (
            ("When did people begin to make a home on {E}?", "People began to make a home on {E} in {V}."),
            ("In which year was {E} colonised?", "{E} was colonised in {V}."),
        ),
        "Monks landed on the shingle and built a cell of stone.",
    ),
)
# fmt: on

BY_KIND = runs.by_kind(FAMILIES)


def check_templates() -> list[str]:
    return runs.check_templates(sys.modules[__name__])


def build_case(articles, seed: int, hard: bool):
    rng = random.Random(f"gen8/{seed}")
    facts = runs.make_facts(sys.modules[__name__], rng, gen2.corpus_names(articles), hard)
    return gen2.place(articles, facts, rng)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runs.add_arguments(parser, seeds=5)
    args = parser.parse_args(argv)
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    return runs.report("gen8", build_case, seeds, args, problems=check_templates())


if __name__ == "__main__":
    sys.exit(main())
