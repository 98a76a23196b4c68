"""The recall generators after gen3 (bench/blaise_gen4.py to blaise_gen8.py), each written apart
from the ones before it: its questions share no content word with their facts beyond the kind
noun, its wording and entity kinds are none of any earlier generator's, every family has a
same-entity decoy (gen5: two), and its cases place each decoy at least DECOY_DISTANCE bytes
from its fact, deterministically per seed."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
pytest.importorskip("blaise_gen2")

from test_blaise_gen2 import ARTICLES  # noqa: E402

ORDER = [f"blaise_gen{n}" for n in range(2, 9)]  # in the order they were written
DECOYS = {"same_entity", "near_name", "same_value", "echo"}
GENERATORS = {  # name -> (least families of one kind, the decoy kinds of a fact)
    "blaise_gen4": (2, DECOYS),
    "blaise_gen5": (3, DECOYS | {"same_entity_2"}),
    "blaise_gen6": (2, DECOYS),
    "blaise_gen7": (2, DECOYS),
    "blaise_gen8": (2, DECOYS),
}


def templates(module) -> set[str]:
    return {t for f in module.FAMILIES for t in (*f.facts, *(q for q, _ in f.questions))}


@pytest.mark.parametrize("name", GENERATORS)
def test_no_question_shares_a_content_word_with_a_fact_of_its_family(name):
    gen = importlib.import_module(name)
    least, _ = GENERATORS[name]
    assert gen.check_templates() == []
    assert len(gen.FAMILIES) == 16 and len(gen.BY_KIND) == 4
    assert all(len(gen.BY_KIND[f.kind]) >= least for f in gen.FAMILIES)


@pytest.mark.parametrize("name", GENERATORS)
def test_its_wording_is_its_own(name):
    """No fact or question template of a generator is one of an earlier generator's, nor
    one of its entity kinds."""
    gen = importlib.import_module(name)
    ours = templates(gen)
    earlier = ORDER[: ORDER.index(name)]
    assert len(earlier) == ORDER.index(name) >= 2
    for other in map(importlib.import_module, earlier):
        assert not ours & templates(other), other.__name__
        assert not set(gen.ENTITY_FORMS) & set(other.ENTITY_FORMS), other.__name__


@pytest.mark.parametrize("name", GENERATORS)
def test_cases_hold_every_fact_and_decoy_far_apart(name):
    gen = importlib.import_module(name)
    _, decoy_kinds = GENERATORS[name]
    docs, facts = gen.build_case(ARTICLES, gen.FIRST_SEED, hard=True)
    assert len(facts) == gen.gen2.NUM_FACTS
    corpus = "".join(text for _, text in docs)
    for fact in facts:
        where = corpus.index(fact.sentence)
        assert set(fact.decoys) == decoy_kinds
        if "same_entity_2" in decoy_kinds:
            assert fact.decoys["same_entity"] != fact.decoys["same_entity_2"]
        for kind, sentence in fact.decoys.items():
            if kind != "echo":
                assert corpus.count(sentence) == 1, (kind, sentence)
                assert abs(corpus.index(sentence) - where) >= gen.gen2.DECOY_DISTANCE
    assert gen.build_case(ARTICLES, gen.FIRST_SEED, hard=True)[0] == docs
