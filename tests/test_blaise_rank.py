"""Blaise's ranking: BM25 over stemmed terms, best-sentence fusion, expected answer types."""

from __future__ import annotations

import pytest

from hicache_galahad.blaise.answer import AnswerType, holds, question_type
from hicache_galahad.blaise.rank import Analyzer, Ranker, RankParams

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
        ("How many residents does the town have?", AnswerType.COUNT),
        ("What is the number of members of the guild?", AnswerType.COUNT),
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
