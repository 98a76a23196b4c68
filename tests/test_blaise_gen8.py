"""The eighth recall generator (bench/blaise_gen8.py): its questions share no content word with
their facts beyond the kind noun, its wording and kinds are none of gen2's to gen7's, every
family has a same-entity decoy, and its cases place each decoy at least DECOY_DISTANCE bytes
from its fact, deterministically per seed."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
gen8 = pytest.importorskip("blaise_gen8")
gen7 = pytest.importorskip("blaise_gen7")
gen6 = pytest.importorskip("blaise_gen6")
gen5 = pytest.importorskip("blaise_gen5")
gen4 = pytest.importorskip("blaise_gen4")
gen3 = pytest.importorskip("blaise_gen3")

from test_blaise_gen2 import ARTICLES  # noqa: E402


def test_no_question_shares_a_content_word_with_a_fact_of_its_family():
    assert gen8.check_templates() == []
    assert len(gen8.FAMILIES) == 16 and len(gen8.BY_KIND) == 4
    assert all(len(gen8.BY_KIND[f.kind]) >= 2 for f in gen8.FAMILIES)


def test_its_wording_is_its_own():
    """No fact or question template of gen8 is one of the other generators' (nor a kind)."""

    def templates(module):
        return {t for f in module.FAMILIES for t in (*f.facts, *(q for q, _ in f.questions))}

    ours = templates(gen8)
    for other in (gen8.gen2, gen3, gen4, gen5, gen6):
        assert not ours & templates(other)
        assert not set(gen8.ENTITY_FORMS) & set(other.ENTITY_FORMS)


def test_cases_hold_every_fact_and_decoy_far_apart():
    docs, facts = gen8.build_case(ARTICLES, gen8.FIRST_SEED, hard=True)
    assert len(facts) == gen8.gen2.NUM_FACTS
    corpus = "".join(text for _, text in docs)
    for fact in facts:
        where = corpus.index(fact.sentence)
        assert set(fact.decoys) == {"same_entity", "near_name", "same_value", "echo"}
        for kind, sentence in fact.decoys.items():
            if kind != "echo":
                assert corpus.count(sentence) == 1, (kind, sentence)
                assert abs(corpus.index(sentence) - where) >= gen8.gen2.DECOY_DISTANCE
    assert gen8.build_case(ARTICLES, gen8.FIRST_SEED, hard=True)[0] == docs
