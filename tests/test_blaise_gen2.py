"""The second recall generator (bench/blaise_gen2.py): its questions share no content word
with their facts beyond the entity, its split keeps train and held-out templates and seeds
apart, and every decoy kind is placed at least DECOY_DISTANCE bytes from its fact."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))

gen2 = pytest.importorskip("blaise_gen2")

ARTICLES = [
    (
        f"Article {n}",
        "".join(
            f"# Part {n}.{p}\n\n"
            + " ".join(f"Sentence {n} {p} {i} tells of rivers and roads." for i in range(60))
            + "\n\n"
            for p in range(12)
        ),
    )
    for n in range(8)
]  # about 370 KB of plain text with headings (no package data needed)


def test_no_question_shares_a_content_word_with_a_fact_of_its_family():
    assert gen2.check_templates() == []
    assert len(gen2.FAMILIES) >= 15 and len(gen2.BY_KIND) >= 5
    assert all(len(gen2.BY_KIND[f.kind]) >= 2 for f in gen2.FAMILIES)  # a same-entity decoy


def test_train_and_heldout_templates_and_seeds_are_disjoint():
    for family in gen2.FAMILIES:
        train = set(gen2.fact_templates(family, "train"))
        held = set(gen2.fact_templates(family, "heldout"))
        assert train and held and not train & held
        train_q = set(gen2.question_templates(family, "train"))
        held_q = set(gen2.question_templates(family, "heldout"))
        assert train_q and held_q and not train_q & held_q
    assert gen2.SPLIT_SEEDS["heldout"] >= 1000 > gen2.SPLIT_SEEDS["train"]


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_cases_hold_every_fact_and_decoy_far_apart(split):
    docs, facts = gen2.build_case(ARTICLES, 0, split, hard=True)
    assert len(facts) == gen2.NUM_FACTS
    corpus = "".join(text for _, text in docs)
    for fact in facts:
        assert set(fact.decoys) == {"same_entity", "near_name", "same_value", "echo"}
        where = corpus.index(fact.sentence)
        for kind, sentence in fact.decoys.items():
            if kind == "echo":  # the family's words without a name: once per fact of it
                assert sentence in corpus
                continue
            assert corpus.count(sentence) == 1, (kind, sentence)
            assert abs(corpus.index(sentence) - where) >= gen2.DECOY_DISTANCE
        names = [w for w in fact.question.rstrip("?").split()[1:] if w[:1].isupper()]
        question, sentence = fact.question, fact.sentence
        for name in names:
            question, sentence = question.replace(name, " "), sentence.replace(name, " ")
        shared = gen2.content_stems(question) & gen2.content_stems(sentence) - gen2.KIND_WORDS
        assert not shared, (fact.question, fact.sentence)
    again = gen2.build_case(ARTICLES, 0, split, hard=True)
    assert again[0] == docs  # deterministic per (split, seed)
    other = gen2.build_case(ARTICLES, 0, "heldout" if split == "train" else "train", True)
    assert {f.question for f in other[1]}.isdisjoint({f.question for f in facts})
