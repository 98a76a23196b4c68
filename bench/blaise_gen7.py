"""A seventh generator of Blaise recall tests, written apart before the last round of issue 33
(blaise-4), committed before its first run, run only to report, never to tune.

Its entities, families, wordings and value formats are its own (none is gen2's to gen6's:
tested), written as a new user would ask, with no look at which words the lexicon knows; its
hard version has gen2's four decoys.

* four kinds of entity (a viaduct, a brewery, a glacier, a schooner), 16 families, two fact
  and two question templates each; a question shares no content word (Snowball stem, stop
  words aside) with a fact template of its family beyond the kind noun;
* value formats: arches, guineas, barrels, hands on the payroll, miles, metres a year,
  metres of ice, tons, sailors, knots;
* seeds 7000..; one split (all of it held out).

    python bench/blaise_gen7.py [--seeds 5] [--version easy|hard] [--no-baseline]
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

FIRST_SEED = 7000


def _year(rng, _names) -> str:
    return str(rng.randint(1700, 1935))


def _arches(rng, _names) -> str:
    return f"{rng.randint(9, 48)} arches"


def _rail_height(rng, _names) -> str:
    return f"{rng.randint(18, 110)} metres"


def _guineas(rng, _names) -> str:
    return f"{rng.randint(20, 900) * 100:,} guineas"


def _barrels(rng, _names) -> str:
    return f"{rng.randint(5, 400) * 100:,} barrels"


def _workers(rng, _names) -> str:
    return f"{rng.randint(12, 600)} workers"


def _miles(rng, _names) -> str:
    return f"{rng.randint(3, 40)} miles"


def _retreat(rng, _names) -> str:
    return f"{rng.randint(4, 60)} metres per year"


def _ice_depth(rng, _names) -> str:
    return f"{rng.randint(120, 900)} metres"


def _tons(rng, _names) -> str:
    return f"{rng.randint(60, 700)} tons"


def _sailors(rng, _names) -> str:
    return f"{rng.randint(6, 40)} sailors"


def _knots(rng, _names) -> str:
    return f"{rng.randint(7, 16)} knots"


def _person(rng, names) -> str:
    return f"{names.fresh(rng, 2)} {names.fresh(rng, 2)}"


ENTITY_FORMS = {
    "viaduct": "the {N} Viaduct",
    "brewery": "the {N} brewery",
    "glacier": "the {N} Glacier",
    "schooner": "the schooner {N}",
}
KIND_WORDS = {"viaduct", "breweri", "glacier", "schooner"}  # stems

# fmt: off
FAMILIES = (
    Family(
        "viaduct_arches", "viaduct", _arches,
        ("{E} strides across the gorge on {V}.", "Masons raised {V} to carry {E}."),
        (
            ("How many spans does {E} have?", "{E} has {V} spans."),
            ("What number of openings pierce {E}?", "{V} openings pierce {E}."),
        ),
        "Masons raised the piers first and turned the vaults between them one by one.",
    ),
    Family(
        "viaduct_height", "viaduct", _rail_height,
        ("The deck of {E} sits {V} above the river.", "{E} towers {V} over the water."),
        (
            ("How high is {E}?", "{E} is {V} high."),
            ("What is the elevation of the track bed of {E}?", "The track bed of {E} has an elevation of {V}."),
        ),
        "The deck sits far above the river where the gorge is narrowest.",
    ),
    Family(
        "viaduct_cost", "viaduct", _guineas,
        ("Building {E} swallowed {V}.", "The contractors were paid {V} for {E}."),
        (
            ("What did {E} cost to put up?", "{E} cost {V} to put up."),
            ("How expensive was the construction of {E}?", "The construction of {E} was {V}."),
        ),
        "The contractors were paid in instalments as each pier was finished.",
    ),
    Family(
        "viaduct_opened", "viaduct", _year,
        ("Trains first crossed {E} in {V}.", "{E} carried its first load in {V}."),
        (
            ("When was work on {E} finished?", "Work on {E} was finished in {V}."),
            ("In what year did {E} enter use?", "{E} entered use in {V}."),
        ),
        "Trains first crossed the valley on a bright morning with the band playing.",
    ),
    Family(
        "brewery_output", "brewery", _barrels,
        ("{E} turns out {V} of ale a year.", "Each season {V} leave the cellars of {E}."),
        (
            ("How much beer does {E} make annually?", "{E} makes {V} of beer annually."),
            ("What is the output of {E}?", "The output of {E} is {V}."),
        ),
        "Ale leaves the cellars in casks stacked on drays.",
    ),
    Family(
        "brewery_founder", "brewery", _person,
        ("{E} was started by {V}.", "{V} set up {E} with a loan from a cousin."),
        (
            ("Who was the founder of {E}?", "{V} was the founder of {E}."),
            ("Which brewer founded {E}?", "The brewer {V} founded {E}."),
        ),
        "A loan from a cousin set up many a family business in the town.",
    ),
    Family(
        "brewery_staff", "brewery", _workers,
        ("{E} employs {V}.", "{V} tend the mash tuns at {E}."),
        (
            ("How many people are on the payroll of {E}?", "{V} people are on the payroll of {E}."),
            ("What is the size of the workforce at {E}?", "The workforce at {E} is {V}."),
        ),
        "Men tend the mash tuns from before dawn.",
    ),
    Family(
        "brewery_opened", "brewery", _year,
        ("{E} brewed its first batch in {V}.", "The first casks left {E} in {V}."),
        (
            ("When did {E} begin trading?", "{E} began trading in {V}."),
            ("Since what year has {E} existed?", "{E} has existed since {V}."),
        ),
        "The first casks were brewed with water from the town well.",
    ),
    Family(
        "glacier_length", "glacier", _miles,
        ("{E} stretches {V} from its head to its snout.", "{E} flows for {V} down the valley."),
        (
            ("How long is {E} from end to end?", "{E} is {V} long from end to end."),
            ("How far does {E} run?", "{E} runs {V}."),
        ),
        "Ice flows slowly down the valley from the head to the snout.",
    ),
    Family(
        "glacier_retreat", "glacier", _retreat,
        ("{E} withdraws {V}.", "Surveys show {E} pulling back {V}."),
        (
            ("At what rate is {E} retreating?", "{E} is retreating at {V}."),
            ("How quickly does {E} recede?", "{E} recedes {V}."),
        ),
        "Surveys show the ice pulling back up the valley.",
    ),
    Family(
        "glacier_thickness", "glacier", _ice_depth,
        ("{E} lies {V} deep over the bedrock.", "Soundings put the ice of {E} at {V}."),
        (
            ("What is the thickness of {E}?", "The thickness of {E} is {V}."),
            ("How far down must one drill to reach stone beneath {E}?", "One must drill {V} down to reach stone beneath {E}."),
        ),
        "Soundings of the ice were taken along a line across the bedrock.",
    ),
    Family(
        "glacier_mapped", "glacier", _year,
        ("{E} was first mapped in {V}.", "Surveyors charted {E} in {V}."),
        (
            ("When was {E} put on record?", "{E} was put on record in {V}."),
            ("In which year did explorers describe {E}?", "Explorers described {E} in {V}."),
        ),
        "Surveyors charted the ice with chains and a theodolite.",
    ),
    Family(
        "schooner_tonnage", "schooner", _tons,
        ("{E} displaced {V}.", "Fully laden, {E} weighed {V}."),
        (
            ("How heavy was {E} when loaded?", "{E} was {V} heavy when loaded."),
            ("What was the burden of {E}?", "The burden of {E} was {V}."),
        ),
        "Fully laden, a coasting vessel sat low in the water.",
    ),
    Family(
        "schooner_crew", "schooner", _sailors,
        ("{E} sailed with {V} aboard.", "{V} manned {E}."),
        (
            ("How many hands served on {E}?", "{V} hands served on {E}."),
            ("How large was the complement of {E}?", "The complement of {E} was {V}."),
        ),
        "The men aboard slept in hammocks slung in the forecastle.",
    ),
    Family(
        "schooner_speed", "schooner", _knots,
        ("{E} could make {V} in a fair wind.", "{E} logged {V} on her best day."),
        (
            ("How fast could {E} sail?", "{E} could sail as fast as {V}."),
            ("What top speed did {E} reach?", "{E} reached a top speed of {V}."),
        ),
        "A fair wind on the quarter gave the best day's run of the voyage.",
    ),
    Family(
        "schooner_builder", "schooner", _person,
        ("{E} came off the slipway of {V}.", "{V} laid down {E}."),
        (
            ("Who built {E}?", "{V} built {E}."),
            ("Which shipwright was responsible for {E}?", "The shipwright {V} was responsible for {E}."),
        ),
        "The slipway stood at the head of the creek.",
    ),
)
# fmt: on

BY_KIND = runs.by_kind(FAMILIES)


def check_templates() -> list[str]:
    return runs.check_templates(sys.modules[__name__])


def build_case(articles, seed: int, hard: bool):
    rng = random.Random(f"gen7/{seed}")
    facts = runs.make_facts(sys.modules[__name__], rng, gen2.corpus_names(articles), hard)
    return gen2.place(articles, facts, rng)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runs.add_arguments(parser, seeds=5)
    args = parser.parse_args(argv)
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    return runs.report("gen7", build_case, seeds, args, problems=check_templates())


if __name__ == "__main__":
    sys.exit(main())
