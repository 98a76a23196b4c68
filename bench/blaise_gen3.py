"""A third generator of Blaise recall tests, written apart from the tuning seeds (issue 33).

Written after the ranking changes of issue 33 were chosen on bench/blaise_gen2.py's train
split, and run only to report, never to tune: its entities, attribute families, fact and
question wordings and value formats are its own (none is gen2's or bench_blaise.py's).
Only gen2's machinery is reused: the invented names, the placement of facts and decoys in
the corpus (gen2.place: each decoy at least DECOY_DISTANCE bytes from its fact), the run
and the BM25 baseline.

* six kinds of entity (a lighthouse, a railway, an estate, an expedition, a festival, a
  telescope), 24 attribute families, three fact templates and three question templates
  each; a question shares no content word (Snowball stem, stop words aside) with a fact
  template of its family beyond the entity's name and kind noun (`check_templates`);
* value formats gen2 does not use: feet, nautical miles, kilometres, millimetres, hectares,
  centimetres, days and months, dollars and euros, bottles and visitors;
* hard version: the same four decoys as gen2 (the same entity with another attribute of
  its kind, a near name in the question's own words, the same value for another entity,
  the family's words without name or value);
* seeds 2000..; one split (all of it is held out).

    python bench/blaise_gen3.py [--seeds 5] [--version easy|hard] [--corpus wiki|pydoc]
                                [--show-misses] [--no-baseline]
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

FIRST_SEED = 2000


def _year(rng, _names) -> str:
    return str(rng.randint(1701, 1979))


def _feet(rng, _names) -> str:
    return f"{rng.randint(40, 390)} feet"


def _nautical_miles(rng, _names) -> str:
    return f"{rng.randint(8, 34)} nautical miles"


def _kilometres(rng, _names) -> str:
    return f"{rng.randint(12, 2400):,} kilometres"


def _millimetres(rng, _names) -> str:
    return f"{rng.choice((600, 762, 914, 1000, 1067, 1435, 1520, 1668))} millimetres"


def _dollars(rng, _names) -> str:
    return f"${rng.randint(11, 940) / 10:.1f} million"


def _euros(rng, _names) -> str:
    return f"€{rng.randint(9, 240)}"


def _hectares(rng, _names) -> str:
    return f"{rng.randint(6, 900)} hectares"


def _bottles(rng, _names) -> str:
    return f"{rng.randint(2, 900) * 1000:,} bottles"


def _days(rng, _names) -> str:
    return f"{rng.randint(40, 700)} days"


def _members(rng, _names) -> str:
    return f"{rng.randint(5, 240)} members"


def _visitors(rng, _names) -> str:
    return f"{rng.randint(3, 400) * 1000:,} visitors"


def _centimetres(rng, _names) -> str:
    return f"{rng.randint(20, 1040)} centimetres"


def _tonnes(rng, _names) -> str:
    return f"{rng.randint(4, 700)} tonnes"


def _person(rng, names) -> str:
    return f"{names.fresh(rng, 2)} {names.fresh(rng, 2)}"


def _place(rng, names) -> str:
    return names.fresh(rng, 2)


ENTITY_FORMS = {
    "lighthouse": "the {N} Light",
    "railway": "the {N} Railway",
    "estate": "the {N} estate",
    "expedition": "the {N} expedition",
    "festival": "the {N} Festival",
    "telescope": "the {N} telescope",
}
KIND_WORDS = {"light", "railway", "estat", "expedit", "festiv", "telescop"}  # stems

FAMILIES = (
    Family(
        "first_lit", "lighthouse", _year,
        (
            "{E} was first lit in {V}.",
            "The lamp of {E} was kindled for the first time in {V}.",
            "{E} began its service in {V}.",
        ),
        (
            ("Since when has {E} guided sailors?", "{E} has guided sailors since {V}."),
            ("In which year did {E} start warning ships?", "{E} started warning ships in {V}."),
            ("When did the beam of {E} start to shine?", "The beam of {E} started to shine in {V}."),
        ),
        "A lamp was first lit on the headland in the spring, and the service began once "
        "the keepers had kindled it.",
    ),
    Family(
        "tower_height", "lighthouse", _feet,
        (
            "The tower of {E} rises {V}.",
            "{E} stands {V} tall.",
            "{E} is {V} from foot to lantern.",
        ),
        (
            ("How lofty is {E}?", "{E} is lofty, at {V}."),
            ("What is the elevation of the top of {E} above its base?", "The top of {E} sits {V} above its base."),
            ("How far up does {E} reach?", "{E} reaches {V} up."),
        ),
        "The tower rises from a rock, stands tall above the foot of the cliff and carries a "
        "lantern.",
    ),
    Family(
        "light_range", "lighthouse", _nautical_miles,
        (
            "The light of {E} can be seen from {V} away.",
            "{E} is visible at a range of {V}.",
            "Mariners sight {E} from {V} out.",
        ),
        (
            ("How distant can a ship be and still notice {E}?", "A ship can be {V} distant and still notice {E}."),
            ("Over what distance does {E} carry?", "{E} carries over a distance of {V}."),
            ("From how far off is {E} spotted?", "{E} is spotted from {V} off."),
        ),
        "On a clear night a light can be seen far away, and mariners sight it at a range "
        "that depends on the weather.",
    ),
    Family(
        "keeper", "lighthouse", _person,
        (
            "{E} was tended for decades by {V}.",
            "The keeper of {E} was {V}.",
            "{V} looked after {E}.",
        ),
        (
            ("Who minded {E}?", "{V} minded {E}."),
            ("Which warden was in charge of {E}?", "The warden {V} was in charge of {E}."),
            ("Whose job was it to care for {E}?", "It was the job of {V} to care for {E}."),
        ),
        "Each station was tended by a keeper who looked after the lamp for decades.",
    ),
    Family(
        "railway_opened", "railway", _year,
        (
            "{E} opened in {V}.",
            "The first train ran on {E} in {V}.",
            "{E} was inaugurated in {V}.",
        ),
        (
            ("When did {E} begin carrying passengers?", "{E} began carrying passengers in {V}."),
            ("In what year did {E} enter service?", "{E} entered service in {V}."),
            ("Since which year has {E} been in use?", "{E} has been in use since {V}."),
        ),
        "Most lines opened late, and the first train ran only after a minister inaugurated "
        "the station.",
    ),
    Family(
        "route_length", "railway", _kilometres,
        (
            "{E} runs for {V}.",
            "The line of {E} stretches {V}.",
            "{E} covers {V} of track.",
        ),
        (
            ("How long is {E}?", "{E} is long, at {V}."),
            ("What distance does {E} span from end to end?", "{E} spans a distance of {V} from end to end."),
            ("How far does a journey along all of {E} take you?", "A journey along all of {E} takes you {V}."),
        ),
        "A branch line runs through the hills, stretches to the coast and covers much track "
        "for its size.",
    ),
    Family(
        "gauge", "railway", _millimetres,
        (
            "{E} was laid to a gauge of {V}.",
            "The rails of {E} sit {V} apart.",
            "{E} uses track {V} wide.",
        ),
        (
            ("How broad is {E} between its two lines of steel?", "{E} is broad, at {V} between its two lines of steel."),
            ("What separation do the two iron strips of {E} have?", "The two iron strips of {E} have a separation of {V}."),
            ("What width was chosen for {E}?", "A width of {V} was chosen for {E}."),
        ),
        "The rails were laid on sleepers and sit apart at a gauge that the engineers fixed; "
        "the track uses the same on every bridge.",
    ),
    Family(
        "railway_engineer", "railway", _person,
        (
            "{E} was surveyed and engineered by {V}.",
            "{V} laid out the route of {E}.",
            "The chief engineer of {E} was {V}.",
        ),
        (
            ("Who planned {E}?", "{V} planned {E}."),
            ("Which designer drew the course of {E}?", "The designer {V} drew the course of {E}."),
            ("Under whose direction was {E} built?", "{E} was built under the direction of {V}."),
        ),
        "A chief engineer surveyed the valley and laid out the route before anything was "
        "engineered.",
    ),
    Family(
        "railway_cost", "railway", _dollars,
        (
            "{E} cost {V}.",
            "Construction of {E} came to {V}.",
            "{E} was built at a price of {V}.",
        ),
        (
            ("How much did the investors spend on {E}?", "The investors spent {V} on {E}."),
            ("What was the outlay for {E}?", "The outlay for {E} was {V}."),
            ("How expensive was {E}?", "{E} was expensive, at {V}."),
        ),
        "Construction cost more than planned, and the price came out of bonds that were "
        "built into the contract.",
    ),
    Family(
        "estate_area", "estate", _hectares,
        (
            "{E} has {V} of vines.",
            "The vineyards of {E} extend across {V}.",
            "{E} is planted on {V}.",
        ),
        (
            ("How much ground does {E} cultivate?", "{E} cultivates {V} of ground."),
            ("How big are the plots of {E}?", "The plots of {E} are big, at {V}."),
            ("What acreage does {E} farm?", "{E} farms an acreage of {V}."),
        ),
        "The vines extend across the slopes, and most vineyards are planted in rows along "
        "the river.",
    ),
    Family(
        "estate_output", "estate", _bottles,
        (
            "{E} produces {V} a year.",
            "Each vintage, {E} fills {V}.",
            "{E} sells {V} annually.",
        ),
        (
            ("How much wine does {E} make each season?", "{E} makes {V} of wine each season."),
            ("What is the output of {E} in a twelvemonth?", "The output of {E} in a twelvemonth is {V}."),
            ("How many does {E} bottle per harvest?", "{E} bottles {V} per harvest."),
        ),
        "A good vintage fills cellars, and what an estate produces a year it mostly sells "
        "annually to merchants.",
    ),
    Family(
        "estate_founder", "estate", _person,
        (
            "{E} was founded by {V}.",
            "{V} established {E}.",
            "{E} owes its origin to {V}.",
        ),
        (
            ("Who started {E}?", "{V} started {E}."),
            ("Which settler set up {E}?", "The settler {V} set up {E}."),
            ("By whom was {E} begun?", "{E} was begun by {V}."),
        ),
        "Many estates were founded by families who established them on cheap land; each owes "
        "its origin to a will.",
    ),
    Family(
        "estate_year", "estate", _year,
        (
            "{E} dates back to {V}.",
            "The first vines of {E} went in in {V}.",
            "{E} has been worked since {V}.",
        ),
        (
            ("When did {E} come into existence?", "{E} came into existence in {V}."),
            ("In which year was {E} begun?", "{E} was begun in {V}."),
            ("How old is {E}?", "{E} is old, from {V}."),
        ),
        "Some cellars date back centuries; the first vines went in when monks worked the "
        "slopes.",
    ),
    Family(
        "expedition_duration", "expedition", _days,
        (
            "{E} endured for {V}.",
            "{E} was in the field for {V}.",
            "The members of {E} spent {V} away.",
        ),
        (
            ("How long did {E} go on?", "{E} went on for {V}."),
            ("For what period was {E} out?", "{E} was out for a period of {V}."),
            ("How much time did {E} take?", "{E} took {V} of time."),
        ),
        "Such a party spent months in the field, and most lasted until the food ran out and "
        "the members turned back.",
    ),
    Family(
        "expedition_members", "expedition", _members,
        (
            "{E} numbered {V}.",
            "{E} set out with {V}.",
            "The roll of {E} listed {V}.",
        ),
        (
            ("How many people took part in {E}?", "{V} people took part in {E}."),
            ("How large was the party of {E}?", "The party of {E} was large, at {V}."),
            ("How many joined {E}?", "{V} joined {E}."),
        ),
        "A roll listed every member who set out, and the number that came back was often "
        "smaller.",
    ),
    Family(
        "expedition_leader", "expedition", _person,
        (
            "{E} was led by {V}.",
            "{V} commanded {E}.",
            "At the head of {E} was {V}.",
        ),
        (
            ("Who directed {E}?", "{V} directed {E}."),
            ("Which explorer was in charge of {E}?", "The explorer {V} was in charge of {E}."),
            ("Under whose orders did {E} travel?", "{E} travelled under the orders of {V}."),
        ),
        "Every party was led by an officer, who commanded the porters and marched at the head "
        "of the column.",
    ),
    Family(
        "expedition_start", "expedition", _place,
        (
            "{E} set off from {V}.",
            "{E} departed from the port of {V}.",
            "{E} started its march at {V}.",
        ),
        (
            ("Where did {E} begin?", "{E} began at {V}."),
            ("From what harbour did {E} leave?", "{E} left from the harbour of {V}."),
            ("At which town did {E} assemble before going?", "{E} assembled at the town of {V} before going."),
        ),
        "Most parties set off from a port in the south, departed at dawn and started the march "
        "inland.",
    ),
    Family(
        "festival_attendance", "festival", _visitors,
        (
            "{E} draws {V} each summer.",
            "{E} welcomed {V} last year.",
            "Some {V} come to {E}.",
        ),
        (
            ("How big a crowd does {E} attract?", "{E} attracts a crowd of {V}."),
            ("How many guests attend {E}?", "{V} guests attend {E}."),
            ("What is the turnout at {E}?", "The turnout at {E} is {V}."),
        ),
        "The summer fair draws people from the coast; last year it welcomed more than ever, "
        "and many come back.",
    ),
    Family(
        "festival_first", "festival", _year,
        (
            "{E} was first held in {V}.",
            "{E} began in {V}.",
            "The opening edition of {E} took place in {V}.",
        ),
        (
            ("When was {E} inaugurated?", "{E} was inaugurated in {V}."),
            ("In what year did {E} debut?", "{E} debuted in {V}."),
            ("Since which year has {E} run?", "{E} has run since {V}."),
        ),
        "Fairs of this kind were first held after the war; the opening edition took place "
        "in a barn and began small.",
    ),
    Family(
        "festival_town", "festival", _place,
        (
            "{E} is held in {V}.",
            "{E} takes place every year in {V}.",
            "The home of {E} is {V}.",
        ),
        (
            ("Where does {E} happen?", "{E} happens in {V}."),
            ("In which town is {E} staged?", "{E} is staged in the town of {V}."),
            ("What locality hosts {E}?", "The locality {V} hosts {E}."),
        ),
        "Each fair is held in a market square, takes place every year and gives the town its "
        "home crowd.",
    ),
    Family(
        "festival_price", "festival", _euros,
        (
            "A ticket to {E} costs {V}.",
            "Entry to {E} is {V}.",
            "{E} charges {V} at the gate.",
        ),
        (
            ("How much must a visitor pay to get into {E}?", "A visitor must pay {V} to get into {E}."),
            ("What is the admission fee of {E}?", "The admission fee of {E} is {V}."),
            ("How dear is a pass for {E}?", "A pass for {E} is dear, at {V}."),
        ),
        "A ticket costs little at the gate, and entry charges go to the church roof.",
    ),
    Family(
        "aperture", "telescope", _centimetres,
        (
            "{E} has a mirror {V} across.",
            "The aperture of {E} is {V}.",
            "The main lens of {E} measures {V}.",
        ),
        (
            ("How wide is the glass of {E}?", "The glass of {E} is wide, at {V}."),
            ("What diameter does the optic of {E} have?", "The optic of {E} has a diameter of {V}."),
            ("How large is the opening of {E}?", "The opening of {E} is large, at {V}."),
        ),
        "A mirror or lens across the tube sets the aperture, and astronomers measure a "
        "telescope by it.",
    ),
    Family(
        "telescope_maker", "telescope", _person,
        (
            "{E} was ground and mounted by {V}.",
            "{V} built {E}.",
            "{E} came from the workshop of {V}.",
        ),
        (
            ("Who made {E}?", "{V} made {E}."),
            ("Which optician produced {E}?", "The optician {V} produced {E}."),
            ("Whose hands fashioned {E}?", "The hands of {V} fashioned {E}."),
        ),
        "Mirrors were ground in a workshop and mounted by a craftsman, who built the tube "
        "as well.",
    ),
    Family(
        "telescope_mass", "telescope", _tonnes,
        (
            "With its mount, {E} weighs {V}.",
            "The moving parts of {E} come to {V}.",
            "{E} tops out at {V}.",
        ),
        (
            ("How massive is {E}?", "{E} is massive, at {V}."),
            ("What burden does the pier under {E} bear?", "The pier under {E} bears a burden of {V}."),
            ("What would {E} register on a weighbridge?", "{E} would register {V} on a weighbridge."),
        ),
        "The moving parts of a large instrument come to a great mass, and the dome weighs more "
        "still.",
    ),
)  # fmt: skip

BY_KIND = runs.by_kind(FAMILIES)


def check_templates() -> list[str]:
    return runs.check_templates(sys.modules[__name__])


def build_case(articles, seed: int, hard: bool):
    rng = random.Random(f"gen3/{seed}")
    facts = runs.make_facts(sys.modules[__name__], rng, gen2.corpus_names(articles), hard)
    return gen2.place(articles, facts, rng)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runs.add_arguments(parser, seeds=5)
    args = parser.parse_args(argv)
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    return runs.report("gen3", build_case, seeds, args, problems=check_templates())


if __name__ == "__main__":
    sys.exit(main())
