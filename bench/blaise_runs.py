"""What Blaise's recall generators after gen2 share (blaise_gen3, gen4, gen5): facts and
decoys from a module's families, the check that no question shares a content word with a
fact of its family, and the run and report loop (per seed, Blaise beside the BM25 baseline,
then a summary), which blaise_gen2 uses too.

A generator module has FAMILIES (each a Family: name, kind, value, facts, questions, echo),
BY_KIND, ENTITY_FORMS and KIND_WORDS.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections import Counter
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import blaise_gen2 as gen2  # noqa: E402
from bench_blaise import CORPORA, TekkenTokenizer, machine_header, percentile, run_baseline  # noqa: E402


@dataclass(frozen=True)
class Family:
    """One kind of fact about an entity kind, asked in questions of its own words."""

    name: str
    kind: str
    value: object  # (rng, names) -> a value string
    facts: tuple[str, ...]  # {E} the entity, {V} the value
    questions: tuple[tuple[str, str], ...]  # (question, its statement in its own words)
    echo: str


def by_kind(families) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in families:
        found.setdefault(family.kind, []).append(family)
    return found


def check_templates(module) -> list[str]:
    """Every (question, fact template) pair of a family that shares a content word beyond
    the kind noun: none is allowed."""
    problems = []
    for family in module.FAMILIES:
        for question, _ in family.questions:
            asked = gen2.content_stems(question) - module.KIND_WORDS
            for fact in family.facts:
                shared = asked & gen2.content_stems(fact)
                if shared:
                    problems.append(f"{family.name}: {question!r} / {fact!r} share {shared}")
    return problems


def make_facts(
    module, rng, names: gen2.Names, hard: bool, count: int = gen2.NUM_FACTS, same_entity: int = 1
):
    """`count` facts of the module's families in turn, each with gen2's four decoys when
    `hard` (the same entity with another attribute of its kind, a near name in the
    question's own words, the same value for another entity, the family's echo); with
    `same_entity` 2, a second decoy of the same entity with a third attribute."""
    facts = []
    forms = module.ENTITY_FORMS
    for index in range(count):
        family = module.FAMILIES[index % len(module.FAMILIES)]
        name = names.fresh(rng, rng.choice((2, 3)))
        entity = forms[family.kind].replace("{N}", name)
        value = family.value(rng, names)
        sentence = gen2.render(rng.choice(family.facts), entity, value)
        question, statement = rng.choice(family.questions)
        decoys = {}
        if hard:
            others = [f for f in module.BY_KIND[family.kind] if f is not family]
            chosen = [rng.choice(others)] if same_entity == 1 else rng.sample(others, same_entity)
            for number, other in enumerate(chosen):
                decoys["same_entity" + (f"_{number + 1}" if number else "")] = gen2.render(
                    rng.choice(other.facts), entity, other.value(rng, names)
                )
            near = forms[family.kind].replace("{N}", names.near(rng, name))
            decoys["near_name"] = gen2.render(statement, near, family.value(rng, names))
            someone = forms[family.kind].replace("{N}", names.fresh(rng, 2))
            decoys["same_value"] = gen2.render(rng.choice(family.facts), someone, value)
            decoys["echo"] = family.echo
        facts.append(gen2.Fact(family.name, sentence, gen2.render(question, entity, ""), decoys))
    return facts


def add_arguments(parser, seeds: int) -> None:
    parser.add_argument("--seeds", type=int, default=seeds)
    parser.add_argument("--version", choices=("easy", "hard"), default="hard")
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="wiki")
    parser.add_argument("--show-misses", action="store_true")
    parser.add_argument("--no-baseline", action="store_true")


def report(label: str, build_case, seeds, args, params=None, problems=()) -> int:
    """Runs Blaise (and the baseline unless --no-baseline) on `build_case(articles, seed,
    hard)` for each seed and prints a line per seed and a summary."""
    if problems:
        raise SystemExit("templates share content words:\n" + "\n".join(problems))
    for line in machine_header():
        print(line)
    if params is not None:
        print(f"ranking: {params}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    articles = CORPORA[args.corpus]()
    tokenizer = TekkenTokenizer()
    hits, base_hits, tokens, latencies, adds, misses = [], [], [], [], [], Counter()
    for seed in seeds:
        docs, facts = build_case(articles, seed, args.version == "hard")
        result = gen2.run_blaise(docs, facts, tokenizer, params)
        base = None if args.no_baseline else run_baseline(docs, facts, tokenizer)
        hits.append(result.hits)
        base_hits.append(base.hits if base else -1)
        tokens += result.tokens
        latencies += result.latencies_ms
        adds.append(result.add_s)
        misses.update(result.misses)
        print(
            f"{label} {args.version} seed {seed}: Blaise {result.hits}/{len(facts)}"
            + (f", BM25 baseline {base.hits}/{len(facts)}" if base else "")
            + f"; misses {dict(result.misses)}; add() {result.add_s * 1000:.0f} ms; select p95 "
            f"{percentile(result.latencies_ms, 0.95):.2f} ms",
            flush=True,
        )
        if args.show_misses:
            for line in result.missed:
                print("   miss:", line)
    print(
        f"summary {label} {args.version}: Blaise {hits} (min {min(hits)}, median "
        f"{statistics.median(hits)}), baseline {base_hits}; misses {dict(misses)}; tokens/q "
        f"median {statistics.median(tokens):.0f} (p95 {percentile(tokens, 0.95):.0f}); add() "
        f"median {statistics.median(adds) * 1000:.0f} ms; select p50 "
        f"{percentile(latencies, 0.5):.2f} p95 {percentile(latencies, 0.95):.2f} ms; load "
        f"{os.getloadavg()[0]:.2f}"
    )
    return 0
