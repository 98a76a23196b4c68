"""The third recall generator (bench/blaise_gen3.py): its questions share no content word with
their facts beyond the entity, every family has a same-entity decoy, and its cases place
each decoy at least DECOY_DISTANCE bytes from its fact, deterministically per seed."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))

gen3 = pytest.importorskip("blaise_gen3")
from test_blaise_gen2 import ARTICLES  # noqa: E402


def test_no_question_shares_a_content_word_with_a_fact_of_its_family():
    assert gen3.check_templates() == []
    assert len(gen3.FAMILIES) >= 20 and len(gen3.BY_KIND) >= 5
    assert all(len(gen3.BY_KIND[f.kind]) >= 2 for f in gen3.FAMILIES)


def test_its_wording_is_its_own():
    """No fact or question template of gen3 is one of gen2's (nor a kind of entity)."""
    gen2 = gen3.gen2
    theirs = {t for f in gen2.FAMILIES for t in (*f.facts, *(q for q, _ in f.questions))}
    ours = {t for f in gen3.FAMILIES for t in (*f.facts, *(q for q, _ in f.questions))}
    assert not theirs & ours
    assert not set(gen2.ENTITY_FORMS) & set(gen3.ENTITY_FORMS)


def test_cases_hold_every_fact_and_decoy_far_apart():
    docs, facts = gen3.build_case(ARTICLES, gen3.FIRST_SEED, hard=True)
    assert len(facts) == gen3.gen2.NUM_FACTS
    corpus = "".join(text for _, text in docs)
    for fact in facts:
        where = corpus.index(fact.sentence)
        for kind, sentence in fact.decoys.items():
            if kind != "echo":
                assert corpus.count(sentence) == 1, (kind, sentence)
                assert abs(corpus.index(sentence) - where) >= gen3.gen2.DECOY_DISTANCE
    assert gen3.build_case(ARTICLES, gen3.FIRST_SEED, hard=True)[0] == docs
