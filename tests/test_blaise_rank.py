"""Blaise's ranking: BM25 over stemmed terms, best-sentence fusion, expected answer types."""

from __future__ import annotations

import pytest

from hicache_galahad.blaise.analyzer import Analyzer
from hicache_galahad.blaise.answer import AnswerType, holds, question_type
from hicache_galahad.blaise.attributes import holds_tally
from hicache_galahad.blaise.rank import Ranker, RankParams

FILLER = (
    "The old town lies on a river. Its market sells fish, bread and wool. The council meets in "
    "the hall every week, and the bridge was repaired after the flood. "
)


def test_analyzer_stems_and_drops_stop_words():
    assert Analyzer().terms("Who established the Institutes, and when?") == [
        "establish",
        "institut",
    ]


def test_stemming_matches_inflections():
    ranker = Ranker()
    ranker.add(0, FILLER * 3 + "The Velnorath Institute was founded by traders.")
    ranker.add(1, FILLER * 3)
    assert ranker.search("Who founds institutes like Velnorath?", 1)[0][0] == 0


def test_best_sentence_prefers_words_that_meet_in_one_sentence():
    scattered = "Velnorath is a word. " + FILLER * 2 + "A harbour exists somewhere far away."
    together = FILLER * 2 + "The Velnorath harbour closes in winter."
    ranker = Ranker(RankParams(answer_weight=0.0))
    ranker.add(0, scattered)
    ranker.add(1, together)
    assert ranker.search("When does the Velnorath harbour close?", 1)[0][0] == 1
    plain = Ranker(RankParams(sentence_weight=0.0, answer_weight=0.0))
    plain.add(0, scattered)
    plain.add(1, together)
    scores = dict(plain.search("Velnorath harbour", 2))
    assert scores[0] == pytest.approx(scores[1], rel=0.2)  # BM25 alone barely tells them apart


def test_answer_type_separates_two_facts_about_one_name():
    ranker = Ranker()
    ranker.add(0, FILLER + "The Quorvane Society is led by Athhav Duspraquen. " + FILLER)
    ranker.add(1, FILLER + "The Quorvane Society was founded in 1873. " + FILLER)
    ranker.add(2, FILLER + "The Quorvane Society has 4,120 members. " + FILLER)
    assert ranker.search("When was the Quorvane Society created?", 1)[0][0] == 1
    assert ranker.search("Who directs the Quorvane Society?", 1)[0][0] == 0
    assert ranker.search("How many people belong to the Quorvane Society?", 1)[0][0] == 2


def test_headings_count_with_their_weight():
    ranker = Ranker(RankParams(heading_weight=3.0))
    ranker.add(0, FILLER, ("Economy", "Fisheries"))
    ranker.add(1, FILLER, ("History",))
    assert ranker.search("fisheries", 1)[0][0] == 0


def test_add_remove_and_ties():
    ranker = Ranker()
    ranker.add(3, FILLER)
    ranker.add(1, FILLER)
    assert [section for section, _ in ranker.search("market fish", 2)] == [1, 3]  # tie: lower id
    with pytest.raises(KeyError):
        ranker.add(1, FILLER)
    ranker.remove(1)
    ranker.remove(1)  # absent: nothing happens
    assert ranker.search("market fish", 5) == [(3, ranker.search("market fish", 1)[0][1])]
    assert 1 not in ranker and len(ranker) == 1
    assert ranker.search("the of and", 1) == [] and ranker.search("zebra", 1) == []
    ranker.remove(3)
    assert ranker.search("market", 1) == []


@pytest.mark.parametrize(
    "question,kind",
    [
        ("Who designed the engine?", AnswerType.PERSON),
        ("To whom is the orchid attributed?", AnswerType.PERSON),
        ("Where is the tower situated?", AnswerType.PLACE),
        ("In which valley is the village?", AnswerType.PLACE),
        ("When was the guild formed?", AnswerType.YEAR),
        ("In what year did it open?", AnswerType.YEAR),
        ("How expensive was the bridge?", AnswerType.MONEY),
        ("What sum was paid for the lamp?", AnswerType.MONEY),
        ("How high is the lighthouse?", AnswerType.LENGTH),
        ("What is the length of the canal?", AnswerType.LENGTH),
        ("How many residents does the town have?", AnswerType.TALLY),
        ("What is the number of members of the guild?", AnswerType.TALLY),  # a group
        ("What is the admission fee of the fair?", AnswerType.MONEY),  # WordNet: under cost
        ("For what period was the expedition out?", AnswerType.DURATION),  # time period
        ("What locality hosts the fair?", AnswerType.PLACE),  # noun.location
        ("What is the area of the park?", None),  # a location noun, but an attribute's word
        ("What was the top speed of the ship?", None),  # "was" is no noun (WordNet: "wa")
        ("In what year did it open?", AnswerType.YEAR),  # the cue before the head noun
        ("How crowded is the town?", AnswerType.COUNT),
        ("How do ferries cross the estuary?", None),
        ("Why did the council meet?", None),
    ],
)
def test_question_types(question, kind):
    assert question_type(question) is kind


def test_sentences_holding_a_value():
    asked = {"the", "quorvane", "bridge"}
    assert holds("It was founded in 1873, by traders.", AnswerType.YEAR, asked)
    assert not holds("It is 1,873 metres long.", AnswerType.YEAR, asked)
    assert not holds("It is 2000 metres tall.", AnswerType.YEAR, asked)
    assert holds("It is 2000 metres tall.", AnswerType.LENGTH, asked)
    assert holds("It counts 4,120 members.", AnswerType.COUNT, asked)
    assert not holds("It was built in 1873.", AnswerType.COUNT, asked)
    assert holds("It cost 3,064,097 crowns.", AnswerType.MONEY, asked)
    assert holds("It cost $4 million.", AnswerType.MONEY, asked)
    assert not holds("It cost a fortune.", AnswerType.MONEY, asked)
    assert holds("The Quorvane Bridge lies in the Pelaro Valley.", AnswerType.PLACE, asked)
    assert not holds("The Quorvane Bridge was built in 1873.", AnswerType.PLACE, asked)
    assert holds("The Quorvane Bridge was designed by Athhav Duspraquen.", AnswerType.PERSON, asked)
    assert not holds("The Quorvane Bridge is long.", AnswerType.PERSON, asked)
    assert not holds("It stands near the Pelaro Valley.", AnswerType.PERSON, asked)


# ------------------------------------------------------------------------------ analysis

MIXED = (
    "The Ärzte of Zürich met in 1939–1945 at the café. A naïve “quote” — and an em dash; "
    "snake_case words, CamelCase, HTML&CSS, 3.14 and 1,000,000. Ελληνικά ΛΈΞΕΙΣ too. "
    "Running runners ran; happily happier happiness. Don’t stop: it’s fine."
)


def test_batch_gives_the_words_of_a_regex_split_and_their_stems():
    import re

    import Stemmer

    from hicache_galahad.blaise.analyzer import STOP_WORDS

    analyzer = Analyzer()
    texts = [MIXED, MIXED.upper(), "", "   ", "só ÉLAN élan"]
    stemmer = Stemmer.Stemmer("english")
    for text, ids in zip(texts, analyzer.batch(texts), strict=True):
        words = [w for w in re.findall(r"\w+", text.lower()) if w not in STOP_WORDS]
        got = [analyzer._words[i].decode() for i in ids.tolist()]
        assert stemmer.stemWords(got) == stemmer.stemWords(words)
        assert analyzer.terms(text) == stemmer.stemWords(words)
    # the lists of a candidate's sentences are the same ids
    assert [a.tolist() for a in analyzer.batch(texts)] == analyzer.lists(texts)


INFLECTED = (
    "stability stable stabilise run runs running runner ran happy happiness happier "
    "happily generously generous generate generation general skies sky dying die "
    "organization organize organs organ relational relate relation national nation "
    "possibly possible probability probable ability able ugly early only news"
)


def test_a_family_is_every_word_with_the_stem():
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    from hicache_galahad.blaise.analyzer import STOP_WORDS

    words = [w for w in INFLECTED.split() if w not in STOP_WORDS]
    analyzer = Analyzer()
    analyzer.batch([" ".join(words)])
    for word in words:
        stem = stemmer.stemWord(word)
        expected = {w for w in words if stemmer.stemWord(w) == stem}
        assert {analyzer._words[i].decode() for i in analyzer.family(stem)} == expected
    analyzer.batch(["stabilities"])  # a word added later joins its family
    assert b"stabilities" in {analyzer._words[i] for i in analyzer.family("stabil")}


def test_add_many_ranks_like_add():
    texts = [FILLER + f"The Velnorath pier number {i} opened in {1800 + i}." for i in range(6)]
    one, many = Ranker(), Ranker()
    for i, text in enumerate(texts):
        one.add(i, text, ("Harbour", f"Pier {i}"))
    many.add_many([(i, text, ("Harbour", f"Pier {i}")) for i, text in enumerate(texts)])
    for question in ("When did pier 3 open?", "Velnorath harbour", "market fish"):
        assert one.search(question, 6) == many.search(question, 6)
    with pytest.raises(KeyError):
        many.add_many([(7, FILLER, ()), (7, FILLER, ())])


# ------------------------------------------------------------------------------ attributes


def test_an_idiom_for_cost_finds_the_cost():
    ranker = Ranker()
    ranker.add(0, FILLER + "The Quorvane Bridge spans 3 kilometres of marsh. " + FILLER)
    ranker.add(1, FILLER + "The Quorvane Bridge was designed by Athhav Duspraquen. " + FILLER)
    ranker.add(2, FILLER + "Building the Quorvane Bridge took 90,000 florins. " + FILLER)
    assert ranker.search("What did the Quorvane Bridge set the council back?", 1)[0][0] == 2
    plain = Ranker(RankParams(attribute_weight=0.0))
    for section in range(3):
        plain.add(section, ranker._sections[section].text)
    # without the lexicon the question has no answer type and no word in common with the fact
    assert plain.search("What did the Quorvane Bridge set the council back?", 1)[0][0] != 2


def test_attribute_words_separate_two_lengths():
    ranker = Ranker()
    ranker.add(0, FILLER + "The Quorvane Mast is 40 kilometres long. " + FILLER)
    ranker.add(1, FILLER + "The Quorvane Mast is 300 metres tall. " + FILLER)
    assert ranker.search("How big is the Quorvane Mast from its base to the top?", 1)[0][0] == 1
    assert ranker.search("How big is the Quorvane Mast from end to end?", 1)[0][0] == 0


def test_the_lexicon_is_wordnet_derived_and_names_do_not_count():
    from hicache_galahad.blaise import attributes
    from hicache_galahad.blaise.analyzer import analyse_many
    from hicache_galahad.blaise.evidence import common_words

    lexicon = attributes.lexicon(analyse_many)
    asked = lexicon.attributes(Analyzer().terms(common_words("What did it set us back?")))
    assert max(asked, key=asked.get) == "money"
    assert attributes.answer_type(asked) is AnswerType.MONEY
    # "Tower" in a name is not the verb "tower" (a value of height)
    assert "height" not in lexicon.attributes(
        Analyzer().terms(common_words("Where is the Quorvane Tower?"))
    )


def test_the_subject_stage_keeps_sections_that_name_what_the_question_asks_about():
    """A question that shares no word with its fact but the name ("first take to the water"
    for "launched") lost to sections holding its other words: a near name stated in the
    question's own words, and common words in long sections (issue 22: 31 of 100 on the
    second generator's hard test). Candidates now hold the most (by IDF) of the question's
    capitalised words that the corpus has."""
    sections = [
        FILLER * 4 + "The Kunpain was launched in 1781. " + FILLER,
        FILLER + "The Kunpaen first took to the water in 1802, watched by the town.",
        "Ships first take to the water on a high tide; the water was calm. " * 3,
    ]
    question = "In what year did the Kunpain first take to the water?"
    for subject in (True, False):
        ranker = Ranker(RankParams(subject=subject))
        for number, text in enumerate(sections):
            ranker.add(number, text)
        assert (ranker.search(question, 1)[0][0] == 0) is subject
    ranker = Ranker()
    for number, text in enumerate(sections):
        ranker.add(number, text)
    # a question whose names are not in the corpus, or without names, is not filtered
    assert ranker.search("When did the Zzyzx first take to the water?", 1)[0][0] in (1, 2)
    assert ranker.search("when did ships first take to the water", 1)[0][0] in (1, 2)


def test_a_unit_states_the_attribute_it_measures():
    """WordNet's units of measurement (attributes_data.UNITS, derived by make_attributes.py):
    "3,686 kilograms" states a weight though no attribute word is in the sentence, so a
    question about weight prefers it to another number about the same bell."""
    from hicache_galahad.blaise.attributes_data import UNITS

    assert UNITS["kilogram"] == ["weight"] and "area" in UNITS["hectare"]
    assert UNITS["degree_celsius"] == ["temperature"]
    assert UNITS["cubic_metre"] == ["volume"]  # blaise-4: volume is the fifteenth attribute
    from hicache_galahad.blaise.attributes import ANSWER_TYPES, measured
    from hicache_galahad.blaise.attributes_data import ATTRIBUTES

    assert set(ATTRIBUTES) == set(ANSWER_TYPES) and "capacity" in ATTRIBUTES["volume"]
    # a dimension's unit states a size as well, sharing its weight
    assert measured("The dial is 68 inches across.") == dict.fromkeys(
        ("age", "area", "length", "size"), 0.25
    )
    weight = "The Vupim bell comes to 3,686 kilograms of bronze."
    count = "The Vupim bell rang 1,741 times."
    question = "How heavy is the Vupim bell?"
    for units in (True, False):
        ranker = Ranker(RankParams(units=units))
        ranker.add(0, weight)
        ranker.add(1, count)
        for number in range(2, 12):  # other text: the name's IDF is that of a rare word
            ranker.add(number, FILLER)
        assert (ranker.search(question, 1)[0][0] == 0) is units


@pytest.mark.parametrize(
    ("sentence", "tally"),
    [
        ("The Dralklardo Hall has 8,555 seats.", True),
        ("At its peak the mine had 17,561 men underground.", True),
        ("The main shaft is 1,479 metres deep.", False),  # a length (UNITS: metre)
        ("The bell weighs 3,686 kilograms.", False),
        ("Building the hall cost £80.5 million.", False),
        ("It cost 400 dollars.", False),
        ("The mine closed in 1902.", False),  # a year
        ("The hall covers 30,703 square metres and seats 900.", True),
    ],
)
def test_a_tally_is_a_number_that_is_not_a_measure(sentence, tally):
    assert holds_tally(sentence) is tally


def test_how_many_prefers_a_count_to_a_measure():
    """ "How many workers did the X mine have?" asked for a count; a same-name sentence with
    "1,479 metres" held a number too and took the answer-type bonus (second generator, train
    split). (Without the definitions' tie-break, round 10, which also finds it: "workers"
    and "men" meet in their definitions.)"""
    count = "At its peak the Theamrurk mine had 17,561 men underground, in three shifts a day."
    measure = "The main shaft of the Theamrurk mine is 1,479 metres deep."
    question = "How many workers did the Theamrurk mine have?"
    for tally in (True, False):
        ranker = Ranker(RankParams(tally=tally, glosses=False))
        ranker.add(0, count)
        ranker.add(1, measure)
        for number in range(2, 12):
            ranker.add(number, FILLER)
        assert (ranker.search(question, 1)[0][0] == 0) is tally


def test_a_word_whose_first_sense_names_an_attribute_asks_for_it():
    """GLOSSED (make_attributes.py): "weigh" is in no attribute's synset, but its first sense
    is "have a certain weight", so "What did X weigh?" asks for a weight and prefers the
    sentence whose unit measures one."""
    from hicache_galahad.blaise.attributes_data import GLOSSED

    assert GLOSSED["weigh"] == {"weight": 0.5} and "weight" in GLOSSED["load"]
    weight = "The Zundbork displaced 2,780 tonnes at the quay."
    speed = "On trials the Zundbork reached 14 knots."
    question = "What did the Zundbork weigh?"
    for glossed in (True, False):
        ranker = Ranker(RankParams(glossed=glossed))
        ranker.add(0, weight)
        ranker.add(1, speed)
        for number in range(2, 12):
            ranker.add(number, FILLER)
        assert (ranker.search(question, 1)[0][0] == 0) is glossed


def test_among_sections_naming_the_subject_what_they_state_decides():
    """Once every candidate names the question's subject, a long section that holds the
    asked kind of value lost to a short one about the same name that does not (the same
    entity with another attribute: the dominant miss of issue 22's independent test)."""
    fact = FILLER * 6 + "At its peak the Theamrurk mine had 17,561 men underground. " + FILLER * 6
    decoy = "The Theamrurk mine was abandoned in 1902."
    question = "How many workers did the Theamrurk mine have?"
    for decisive in (True, False):
        ranker = Ranker(RankParams(decisive=decisive))
        ranker.add(0, fact)
        ranker.add(1, decoy)
        for number in range(2, 12):
            ranker.add(number, FILLER)
        assert (ranker.search(question, 1)[0][0] == 0) is decisive
    # without a name in the question, the lexical fusion orders as before
    ranker = Ranker()
    ranker.add(0, fact)
    ranker.add(1, decoy)
    assert ranker.search("how many men were underground at the mine", 1)[0][0] in (0, 1)


# ---------------------------------------------------------------- issue 33: answer types


@pytest.mark.parametrize(
    "question, kind",
    [
        ("Which craftsman created the Brainsis bell?", AnswerType.PERSON),  # PERSON_NOUNS
        ("How large was the staff of the Pruto mine?", AnswerType.TALLY),  # GROUP_NOUNS
        ("How big an audience fits inside the hall?", AnswerType.TALLY),
        ("How much did the hall set its owners back?", AnswerType.COUNT),  # "set": a verb here
        ("How long did the Faspos Accord survive?", AnswerType.LONG),
        ("How long is the canal?", AnswerType.LONG),
        ("How much land does the hall take up?", AnswerType.AMOUNT),  # round 2
        ("How much water can the tank hold?", AnswerType.AMOUNT),
        ("How much money was spent on the hall?", AnswerType.MONEY),
        ("How much does the bell weigh?", AnswerType.COUNT),  # a verb follows: the lexicon's
        ("How much of the land is forest?", AnswerType.COUNT),
    ],
)
def test_question_types_from_wordnet_noun_files(question, kind):
    assert question_type(question) is kind


def test_a_quantity_is_a_measure_or_a_count_never_money():
    from hicache_galahad.blaise.attributes import holds_amount

    assert holds_amount("The hall covers 5,446 square metres.")
    assert holds_amount("The tank holds 40 litres.")
    assert not holds_amount("The hall cost £16.1 million to build.")
    assert not holds_amount("The hall cost 16,000 dollars.")
    assert not holds_amount("The hall seats 3,998 spectators.")  # a count: the ranker takes it


def test_units_of_time_and_of_two_words():
    """WordNet files time apart from its units of measurement: '34 years' stated nothing,
    and '929 square metres' was read as a tally (its first word alone is no unit)."""
    from hicache_galahad.blaise.attributes import holds_measure
    from hicache_galahad.blaise.attributes_data import GLOSSED, UNITS

    assert UNITS["year"] == ["duration"] and UNITS["hour"] == ["duration"]
    assert "frame" not in UNITS  # a unit of time, but not its first sense
    assert GLOSSED["pay"] == {"money": 0.25}  # "give money ...": monetary_value pertains to it
    assert holds_measure("The accord remained in force for 34 years.", "duration")
    assert not holds_measure("The shaft is 1,479 metres deep.", "duration")
    assert holds_tally("The floor of the hall spans 929 square metres.") is False
    assert holds("It lasted 6 years.", AnswerType.LONG, set()) is False  # the ranker adds it


@pytest.mark.parametrize(
    "question, fact, decoy",
    [
        (
            "What did the city pay for the Paindgrum Hall?",
            "The Paindgrum Hall cost £61.5 million to build.",
            "The floor of the Paindgrum Hall spans 935 square metres.",
        ),
        (
            "Which craftsman created the Pearkmouthsteth bell?",
            "Vealzath Zordrunsouth cast the Pearkmouthsteth bell.",
            "The Pearkmouthsteth bell was cast in 1957.",
        ),
        (
            "How large was the staff of the Pruto mine?",
            "The Pruto mine employed 39,924 miners.",
            "The main shaft of the Pruto mine is 1,031 metres deep.",
        ),
        (
            "How long did the Faspos Accord survive?",
            "The Faspos Accord remained in force for 6 years.",
            "The Faspos Accord was signed at Grealgosnoth.",
        ),
        (  # round 2: "how much <noun>" asks for a quantity, never for money
            "How much land does the Proumgrain Hall take up?",
            "The Proumgrain Hall covers 5,446 square metres.",
            "The Proumgrain Hall cost £16.1 million to build.",
        ),
        (
            "How much land does the Vusra Hall take up?",
            "The floor of the Vusra Hall spans 34,475 square metres.",
            "Building the Vusra Hall cost £96.4 million.",
        ),
        (
            "How many people can the Nummes Hall accommodate?",
            "The Nummes Hall seats 28,887 spectators.",
            "The floor of the Nummes Hall spans 929 square metres.",
        ),
        (  # round 3 (gen3, gen4): "clock" names the subject, not the attribute asked
            "What is the weight of the Paisdrirk clock?",
            "The iron works of the Paisdrirk clock come to 4,200 pounds.",
            "The Paisdrirk clock was made by Sarkstir Braindsaith.",
        ),
        (  # a noun.person noun of WordNet's, however rare, asks for a person
            "Which warden was in charge of the Densou Light?",
            "The keeper of the Densou Light was Pimmol Stairsul.",
            "The Densou Light stands 147 feet tall.",
        ),
        (  # a count of people: a number of monks, not of volumes
            "How many brothers lived at Vondhi Abbey?",
            "At its height Vondhi Abbey housed 12 monks.",
            "The library of Vondhi Abbey held 3,400 volumes.",
        ),
        (
            "How large was the community of Kuthean Abbey?",
            "Kuthean Abbey was home to 271 monks.",
            "Kuthean Abbey kept 5,200 volumes on its shelves.",
        ),
        (  # "what is the <group noun>" asks for the size of the group
            "What is the turnout at the Gousdal Festival?",
            "Some 198,000 visitors come to the Gousdal Festival.",
            "The Gousdal Festival charges €131 at the gate.",
        ),
        (  # round 4 (gen4): a unit of distance per unit of time is a speed
            "How fast was the airship Praistousbe?",
            "The airship Praistousbe cruised at 102 kilometres per hour.",
            "The hull of the airship Praistousbe was 226 yards long.",
        ),
        (  # round 6 (gen4): a group whose members are things counts things, not people
            "How big was the collection of manuscripts at Stilgeal Abbey?",
            "Stilgeal Abbey kept 5,200 volumes on its shelves.",
            "At its height Stilgeal Abbey housed 144 monks.",
        ),
        (  # round 5 (gen3): the head noun's first sense: a period is a time period
            "For what period was the Prathklolgrer expedition out?",
            "The members of the Prathklolgrer expedition spent 120 days away.",
            "The roll of the Prathklolgrer expedition listed 120 members.",
        ),
        (  # a harbour is a location
            "From what harbour did the Grithstes expedition leave?",
            "The Grithstes expedition started its march at Sarklos.",
            "The Grithstes expedition was out for 231 days.",
        ),
        (  # "the number of <things>" asks for a count of them, not a measure
            "What number of gates lift craft on the Nobramtan Canal?",
            "Boats on the Nobramtan Canal pass 76 locks on the way.",
            "The Nobramtan Canal winds through the country for 40 miles.",
        ),
        (  # blaise-4 (gen4): a unit of length states a size (a speed does not)
            "How big was the airship Zinnathtou lengthwise?",
            "The airship Zinnathtou measured 231 yards from nose to tail.",
            "The gas cells of the airship Zinnathtou held 154,000 cubic metres of hydrogen.",
        ),
        (
            "What was the size of the airship Feamkais fore to aft?",
            "The airship Feamkais measured 254 yards from nose to tail.",
            "The airship Feamkais cruised at 88 kilometres per hour.",
        ),
        (  # a count states a number; the agreement is a share of what is asked, not capped
            "How much wine does the Zaitor estate make each season?",
            "The Zaitor estate sells 139,000 bottles annually.",
            "The vineyards of the Zaitor estate extend across 6 hectares.",
        ),
        (
            "What is the weight of the Mourkga clock?",
            "Hoisting the Mourkga clock meant lifting 5,200 pounds.",
            "The dial of the Mourkga clock is 68 inches across.",
        ),
        (  # volume (WordNet's noun.quantity synset) is an attribute; the head noun of "the
            # capacity of the envelope" names the answer type, not the envelope (a distance)
            "What was the capacity of the envelope of the airship Grearkel?",
            "The gas cells of the airship Grearkel held 163,000 cubic metres of hydrogen.",
            "The airship Grearkel cruised at 128 kilometres per hour.",
        ),
        (
            "How much time did the Dimgumrol expedition take?",
            "The members of the Dimgumrol expedition spent 228 days away.",
            "The roll of the Dimgumrol expedition listed 56 members.",
        ),
    ],
)
def test_the_same_entitys_other_attribute_loses(question, fact, decoy):
    """Issue 33: the misses of gen2's train split, each the same entity with another
    attribute; the decoy first, so that a tie goes to it."""
    ranker = Ranker()
    ranker.add(0, decoy)
    ranker.add(1, fact)
    for number in range(2, 12):
        ranker.add(number, FILLER)
    assert ranker.search(question, 1)[0][0] == 1


def test_a_sentence_about_a_near_name_lends_nothing_to_the_subject():
    """Round 2: a section naming the subject (its cost) beside a near name's sentence that
    shares the question's other words took the near name's statement as the subject's; the
    best sentence is now one that names the subject's rarest term, when one does."""
    ranker = Ranker()
    ranker.add(
        0,
        "The Fundaithfu Hall has 11,744 seats. "
        "The footprint of the Fundaiehfu Hall is big, at 2,536 square metres.",
    )
    ranker.add(1, "The floor of the Fundaithfu Hall spans 40,522 square metres.")
    for number in range(2, 12):
        ranker.add(number, FILLER)
    assert ranker.search("How big is the footprint of the Fundaithfu Hall?", 1)[0][0] == 1


DEFINED_APART = [
    (
        "How much lifting medium did the airship Mipeth contain?",
        "The gas cells of the airship Mipeth held 169,000 cubic metres of hydrogen.",
        "The hull of the airship Mipeth was 225 yards long.",
    ),
    (
        "How much lifting medium did the airship Drulgrulgor contain?",
        "The gas cells of the airship Drulgrulgor held 123,000 cubic metres of hydrogen.",
        "The airship Drulgrulgor could make 108 kilometres per hour in still air.",
    ),
]


@pytest.mark.parametrize(("question", "fact", "decoy"), DEFINED_APART)
def test_definitions_of_the_words_only_one_sentence_has_break_the_tie(question, fact, decoy):
    """Round 10 (gen4's misses): both sentences hold a quantity and state what the question's
    words name equally, so the lexical score (a shorter section) chose; now the words only one
    of the subject's sentences has are compared with the question's through their WordNet
    definitions (medium: "... a substance ..."; hydrogen, gas: "... a gas ...")."""
    for params, expected in ((RankParams(glosses=False), 0), (RankParams(), 1)):
        ranker = Ranker(params)
        ranker.add(0, decoy)
        ranker.add(1, fact)
        for number in range(2, 12):
            ranker.add(number, FILLER)
        assert ranker.search(question, 1)[0][0] == expected, params


def test_gloss_overlap_counts_only_what_one_sentence_has():
    """The words every candidate sentence has say nothing about which answers; a word and
    one in its definition meet ("peal" is defined by "bell")."""
    from hicache_galahad.blaise import evidence, glosses

    table = glosses.glosses()
    assert {"bell", "ring"} <= table.expand(["peal"])
    assert table.idf("bell") > 0 and table.idf("unit") == 0.0  # too common to keep
    tower = frozenset({"tower", "hous", "bell"})
    doors = frozenset({"tower", "door"})
    assert evidence.gloss_overlap({"peal"}, [tower, doors]) == [1.0, 0.0]
    assert evidence.gloss_overlap({"tower"}, [tower, doors]) == [0.0, 0.0]
