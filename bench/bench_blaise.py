"""Blaise's section-selection recall, rebuilt from real text that ships inside a pip package.

The published test: 100 invented facts hidden in 13 Wikipedia articles (about 434 KB) at depths
1% to 99%, each asked in paraphrase; the metric is the share of questions whose selected
section holds the whole inserted fact. Rebuilt here:

* corpus: the English Wikipedia dump in gensim's test data (gensim/test/test_data/enwiki-
  latest-pages-articles1.xml-...-shortened.bz2, gensim 4.4.0), wikitext cleaned to plain text
  with `#` headings (templates, tables, references and reference-only sections removed); the
  13 consecutive articles by cleaned size whose total is nearest 434,000 bytes.
* facts: 10 attribute families (founding year, leader, members, population, location, height,
  length, cost, inventor, discoverer), each with fact templates, question templates and
  synonym sets; a question never uses the fact's verb or noun for the attribute. Names are
  invented from syllables and checked absent from the corpus; numbers are random. Fact i goes
  to depth 1% + 98% * i / 99 of the corpus, at the next sentence start.
* hard version: per fact three decoys at random depths (the same name with another
  attribute, a near name - one letter changed - with the same attribute, the same number on
  another entity), a question from a template that shares little but the name with the fact,
  and every third fact placed at a section boundary (just before or just after a heading).
* baseline (RAGFlow-like): the same documents cut into chunks of at most 512 tokens at
  sentence and line ends, plain BM25 (same analyzer), top-1 chunk; its tokens per question
  are the chunk's and the question's.
* held-out questions (`--questions heldout`): a second set of low-overlap templates, written
  after the ranking was built and not used to tune it, to see whether it generalises.
* each part of the hard version is also run alone (versions decoys, low_overlap,
  boundaries), and `--ablation` reports the recall of each ranking stage.
* second domain (`--corpus pydoc`): Python's help topics from the standard library's
  pydoc_data, largest first until about 434 KB; the same facts and questions.
* tokens: Mistral's Tekken tokenizer (tekken_240911.json, 131k vocabulary) from the
  mistral-common package, loaded from the file: nothing comes from a hub. Tokens per question
  count the whole prompt Blaise composes (preamble, source and heading path, section, padding
  to a 16-token page, question).

    python bench/bench_blaise.py [--seeds 10] [--repeats 5] [--versions basic,hard,...]
                                 [--corpus wiki|pydoc] [--ablation] [--show-misses]
                                 [--questions published|heldout]

Index time is what `add` computes in memory (segmenting and indexing), wall and CPU time, the
median of --repeats runs per seed; `add()` adds the durable record writes. Selection latency
is `Blaise.select` (ranking plus the verified read of the section from the store).
"""

from __future__ import annotations

import argparse
import bz2
import html
import importlib.util
import os
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hicache_galahad.blaise import Blaise, segment  # noqa: E402
from hicache_galahad.blaise.prompt import opening_words  # noqa: E402
from hicache_galahad.blaise.rank import Ranker, RankParams  # noqa: E402

TARGET_BYTES = 434_000
NUM_ARTICLES = 13
NUM_FACTS = 100
PAGE_SIZE = 16
BASELINE_CHUNK_TOKENS = 512
GENSIM_DUMP = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
DROPPED_SECTIONS = {
    "references", "external links", "see also", "further reading", "notes", "bibliography",
    "sources", "footnotes", "citations", "works cited",
}  # fmt: skip


# ------------------------------------------------------------------------------- corpus


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"bench_blaise needs the {name!r} package installed (it ships the data)")
    return spec.submodule_search_locations[0]


def _strip_nested(text: str, open_: str, close: str) -> str:
    out, depth, index = [], 0, 0
    while index < len(text):
        if text.startswith(open_, index):
            depth, index = depth + 1, index + len(open_)
        elif depth and text.startswith(close, index):
            depth, index = depth - 1, index + len(close)
        else:
            if not depth:
                out.append(text[index])
            index += 1
    return "".join(out)


def clean_wikitext(wikitext: str) -> str:
    text = html.unescape(wikitext)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<ref[^>]*/>", "", text)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.S)
    text = _strip_nested(_strip_nested(text, "{{", "}}"), "{|", "|}")
    text = re.sub(
        r"\[\[(?:File|Image|Category|[a-z]{2,3}(?:-[a-z]+)?):(?:[^\[\]]|\[\[[^\]]*\]\])*\]\]",
        "",
        text,
    )
    text = re.sub(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]", r"\1", text)
    text = re.sub(r"\[https?://\S+ ([^\]]*)\]", r"\1", text)
    text = re.sub(r"\[https?://\S+\]", "", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"<[^>]+>", "", text)
    lines, skipping = [], False
    for line in text.split("\n"):
        heading = re.match(r"^(={2,6})\s*(.*?)\s*\1\s*$", line)
        if heading:
            skipping = heading.group(2).lower() in DROPPED_SECTIONS
            if not skipping:
                lines.append("#" * len(heading.group(1)) + " " + heading.group(2))
        elif not skipping:
            lines.append(line.rstrip())
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"
    return re.sub(r"[ \t]{2,}", " ", text)


def load_articles() -> list[tuple[str, str]]:
    """The 13 consecutive articles (by cleaned size) whose total is nearest TARGET_BYTES."""
    path = os.path.join(_package_dir("gensim"), GENSIM_DUMP)
    with bz2.open(path, "rt", encoding="utf-8") as dump:
        xml = dump.read()
    pages = re.findall(r"<page>.*?<title>(.*?)</title>.*?<text[^>]*>(.*?)</text>", xml, re.S)
    articles = [
        (title, clean_wikitext(body))
        for title, body in pages
        if not body.startswith("#REDIRECT") and "/" not in title
    ]
    articles.sort(key=lambda item: (-len(item[1].encode()), item[0]))
    sizes = [len(text.encode()) for _, text in articles]
    best = min(
        range(len(articles) - NUM_ARTICLES + 1),
        key=lambda i: abs(sum(sizes[i : i + NUM_ARTICLES]) - TARGET_BYTES),
    )
    return articles[best : best + NUM_ARTICLES]


def load_pydoc_topics() -> list[tuple[str, str]]:
    """The second domain: Python's own help topics (pydoc_data, in the standard library),
    largest first until they make up TARGET_BYTES."""
    from pydoc_data.topics import topics

    ordered = sorted(topics.items(), key=lambda item: (-len(item[1].encode()), item[0]))
    chosen, total = [], 0
    for name, text in ordered:
        if total >= TARGET_BYTES:
            break
        chosen.append((name, text))
        total += len(text.encode())
    return chosen


CORPORA = {"wiki": load_articles, "pydoc": load_pydoc_topics}


class TekkenTokenizer:
    """Mistral's Tekken tokenizer from mistral-common's packaged file, with the
    `encode(text, add_special_tokens=False)` shape Blaise's prompt composer expects."""

    bos_token_id = None

    def __init__(self) -> None:
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        path = os.path.join(_package_dir("mistral_common"), "data", "tekken_240911.json")
        self._tekken = Tekkenizer.from_file(path)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tekken.encode(text, bos=False, eos=False)

    def count(self, data: bytes) -> int:
        return len(self.encode(data.decode("utf-8")))


# ------------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class Family:
    name: str
    kinds: tuple[str, ...]
    value: str  # "year", "count", "metres", "km", "money", "person", "region"
    facts: tuple[str, ...]  # {E} entity, {X} value
    questions: tuple[str, ...]  # {E}, {q}: a word of question_words (none is in `facts`)
    question_words: tuple[str, ...]
    hard_questions: tuple[str, ...]  # share little but the name


FAMILIES = (
    Family("founded", ("org", "town"), "year",
           ("{E} was founded in {X}.", "In {X}, {E} was established.", "{E} was set up in {X}."),
           ("In which year was {E} {q}?", "When was {E} {q}?"),
           ("created", "started", "formed", "inaugurated"),
           ("Since when has {E} existed?", "How old is {E}?")),
    Family("leader", ("org",), "person",
           ("{E} is led by {X}.", "{E} has been headed by {X} for a decade.", "{X} runs {E}."),
           ("Who {q} {E}?", "Who is the person that {q} {E}?"),
           ("directs", "chairs", "manages", "presides over"),
           ("Who is at the top of {E}?", "Who is in charge at {E}?")),
    Family("members", ("org",), "count",
           ("{E} has {X} members.", "{E} counts {X} affiliates.", "{X} members belong to {E}."),
           ("How many {q} does {E} have?", "What is the number of {q} of {E}?"),
           ("adherents", "participants", "enrolled people"),
           ("How big is {E}?", "What size has {E} grown to?")),
    Family("population", ("town",), "count",
           ("{E} has a population of {X}.", "{E} is home to {X} people.",
            "Some {X} inhabitants live in {E}."),
           ("How many {q} does {E} have?", "What is the number of {q} of {E}?"),
           ("residents", "citizens", "dwellers"),
           ("How large is {E}?", "How crowded is {E}?")),
    Family("location", ("town", "structure", "species"), "region",
           ("{E} lies in the {X} Valley.", "{E} is located in the {X} Valley.",
            "{E} is found at the edge of the {X} Valley."),
           ("Where is {E} {q}?", "In which area is {E} {q}?"),
           ("situated", "placed", "to be seen"),
           ("Where would one travel to visit {E}?", "Which part of the land has {E}?")),
    Family("height", ("structure",), "metres",
           ("{E} is {X} metres tall.", "{E} has a height of {X} metres.",
            "{E} rises to {X} metres."),
           ("How {q} is {E}?", "What is the {q} of {E}?"),
           ("high", "elevated", "lofty"),
           ("How far up does {E} go?", "How big is {E} from bottom to top?")),
    Family("length", ("structure",), "km",
           ("{E} is {X} kilometres long.", "{E} has a length of {X} kilometres.",
            "{E} runs for {X} kilometres."),
           ("Over what distance does {E} {q}?", "How far does {E} {q}?"),
           ("extend", "stretch", "span"),
           ("How much ground does {E} cover end to end?", "From one end, where does {E} stop?")),
    Family("cost", ("structure", "device"), "money",
           ("{E} cost {X} crowns.", "The price of {E} was {X} crowns.",
            "{X} crowns were needed to build {E}."),
           ("How much money was {q} on {E}?", "What sum was {q} for {E}?"),
           ("spent", "paid", "expended"),
           ("What did {E} set its owners back?", "How expensive was {E}?")),
    Family("inventor", ("device",), "person",
           ("{E} was invented by {X}.", "{X} designed {E}.", "{E} is the work of {X}."),
           ("Who {q} {E}?", "Which engineer {q} {E}?"),
           ("devised", "conceived", "came up with"),
           ("Whose idea was {E}?", "Who do we owe {E} to?")),
    Family("discoverer", ("species",), "person",
           ("{E} was discovered by {X}.", "{X} first described {E}.",
            "{E} was recorded for science by {X}."),
           ("Who {q} {E}?", "Which naturalist {q} {E}?"),
           ("identified", "found", "spotted"),
           ("Who is credited with {E}?", "To whom is {E} attributed?")),
)  # fmt: skip

# Held-out hard questions: a second set for the low-overlap part, written after the ranking's
# attribute stage was built and never used to choose anything in it (`--questions heldout`).
HELDOUT_QUESTIONS = {
    "founded": ("How long ago did {E} begin?", "What is the birth year of {E}?"),
    "leader": ("Who sits at the helm of {E}?", "Who steers {E} today?"),
    "members": ("How numerous is {E}?", "How many people make up {E}?"),
    "population": ("How populous is {E}?", "How many souls does {E} count?"),
    "location": ("In what surroundings does {E} sit?", "What landscape is {E} part of?"),
    "height": ("What elevation does the top of {E} reach?", "How high does {E} reach?"),
    "length": ("What is the extent of {E} from start to finish?",
               "Over how much distance does {E} reach?"),
    "cost": ("How much outlay did {E} need?", "What did it take to afford {E}?"),
    "inventor": ("Who thought up {E}?", "Who is the mind behind {E}?"),
    "discoverer": ("Who first came across {E}?", "Who named {E} for science?"),
}  # fmt: skip
QUESTION_SETS = ("published", "heldout")
question_set = "published"

KIND_NOUNS = {
    "org": ("the {W} Institute", "the {W} Society", "the {W} Guild", "the {W} Academy"),
    "town": ("the town of {W}", "the village of {W}"),
    "structure": ("the {W} Tower", "the {W} Bridge", "the {W} Dam", "the {W} Lighthouse"),
    "device": ("the {W} engine", "the {W} loom", "the {W} lamp", "the {W} press"),
    "species": ("the {W} beetle", "the {W} orchid", "the {W} lizard", "the {W} moth"),
}
SYLLABLES = [
    "val",
    "nor",
    "ath",
    "quen",
    "dri",
    "mor",
    "tas",
    "vel",
    "kor",
    "bin",
    "sul",
    "ith",
    "ren",
    "gar",
    "lox",
    "mev",
    "pra",
    "tun",
    "zel",
    "okh",
    "hav",
    "rin",
    "dus",
    "cor",
    "ely",
    "fen",
    "qua",
    "yst",
    "bro",
    "lam",
    "wex",
    "ira",
    "stov",
    "pel",
    "gund",
    "aro",
    "miv",
    "thal",
]


class NameMaker:
    """Invented words, absent from the corpus and from each other."""

    def __init__(self, rng: random.Random, corpus_words: set[str]):
        self.rng = rng
        self.used = set(corpus_words)

    def word(self) -> str:
        while True:
            word = "".join(self.rng.choice(SYLLABLES) for _ in range(self.rng.choice((2, 3))))
            if word not in self.used:
                self.used.add(word)
                return word.capitalize()

    def near(self, word: str) -> str:
        """One letter changed: a near name, itself new."""
        for _ in range(200):
            index = self.rng.randrange(1, len(word))
            letter = self.rng.choice("aeiou" if word[index] in "aeiou" else "bdgklmnprstvz")
            near = word[:index] + letter + word[index + 1 :]
            if near.lower() not in self.used:
                self.used.add(near.lower())
                return near
        raise RuntimeError(f"no near name for {word}")


def _value(rng: random.Random, kind: str, names: NameMaker) -> str:
    if kind == "year":
        return str(rng.randint(1500, 2019))
    if kind == "person":
        return f"{names.word()} {names.word()}"
    if kind == "region":
        return names.word()
    low, high = {"count": (1200, 980000), "metres": (120, 8800), "km": (3, 2900)}.get(
        kind, (10000, 9000000)
    )
    return f"{rng.randint(low, high):,}"


def _sentence(template: str, **slots: str) -> str:
    text = template.format(**slots)
    return text[0].upper() + text[1:]


@dataclass
class Fact:
    family: Family
    entity: str
    word: str
    kind: str
    value: str
    sentence: str
    question: str
    depth: float
    at_boundary: bool = False
    decoys: list[tuple[str, float]] = field(default_factory=list)


def make_fact(rng, names: NameMaker, family: Family, depth: float, low_overlap: bool) -> Fact:
    kind = rng.choice(family.kinds)
    word = names.word()
    entity = rng.choice(KIND_NOUNS[kind]).format(W=word)
    value = _value(rng, family.value, names)
    sentence = _fact_sentence(rng, family, entity, value)
    if low_overlap:
        templates = family.hard_questions
        if question_set == "heldout":
            templates = HELDOUT_QUESTIONS[family.name]
        question = rng.choice(templates).format(E=entity)
    else:
        question = rng.choice(family.questions).format(
            E=entity, q=rng.choice(family.question_words)
        )
    return Fact(family, entity, word, kind, value, sentence, _sentence(question), depth)


def _fact_sentence(rng, family: Family, entity: str, value: str) -> str:
    return _sentence(rng.choice(family.facts), E=entity, X=value)


def add_decoys(rng, names: NameMaker, fact: Fact) -> None:
    """The same name with another attribute, a near name with the same attribute, the same
    number (or value) on another entity; each at a random depth."""
    others = [f for f in FAMILIES if fact.kind in f.kinds and f is not fact.family]
    other = rng.choice(others)
    same_name = _fact_sentence(rng, other, fact.entity, _value(rng, other.value, names))
    near_entity = fact.entity.replace(fact.word, names.near(fact.word))
    near_value = _value(rng, fact.family.value, names)
    near_name = _fact_sentence(rng, fact.family, near_entity, near_value)
    other_entity = rng.choice(KIND_NOUNS[fact.kind]).format(W=names.word())
    same_value = _fact_sentence(rng, fact.family, other_entity, fact.value)
    fact.decoys = [(s, rng.uniform(0.01, 0.99)) for s in (same_name, near_name, same_value)]


@dataclass(frozen=True)
class Hardness:
    """Which parts of the hard version a case has (all three: the hard version)."""

    decoys: bool = False
    low_overlap: bool = False
    boundaries: bool = False

    @property
    def label(self) -> str:
        parts = [name for name in ("decoys", "low_overlap", "boundaries") if getattr(self, name)]
        if len(parts) == 3:
            return "hard"
        return "+".join(parts) if parts else "basic"


BASIC = Hardness()
HARD = Hardness(True, True, True)


def build_case(articles, seed: int, hardness: Hardness = BASIC):
    """(documents with the facts and decoys inserted, facts) for one seed."""
    rng = random.Random(
        seed * 16 + hardness.decoys * 4 + hardness.low_overlap * 2 + hardness.boundaries
    )
    corpus_words = {w.lower() for _, text in articles for w in re.findall(r"\w+", text)}
    names = NameMaker(rng, corpus_words)
    families = [FAMILIES[i % len(FAMILIES)] for i in range(NUM_FACTS)]
    rng.shuffle(families)
    facts = []
    for i, family in enumerate(families):
        depth = 0.01 + 0.98 * i / (NUM_FACTS - 1)
        fact = make_fact(rng, names, family, depth, hardness.low_overlap)
        if hardness.decoys:
            add_decoys(rng, names, fact)
        fact.at_boundary = hardness.boundaries and i % 3 == 0
        facts.append(fact)
    return insert_all(articles, facts, rng), facts


def insert_all(articles, facts: list[Fact], rng) -> list[tuple[str, str]]:
    """Inserts every fact and decoy at its depth (a fraction of the whole corpus)."""
    sizes = [len(text) for _, text in articles]
    total = sum(sizes)
    inserts: dict[int, list[tuple[int, str]]] = {}
    items = [(f.sentence, f.depth, f.at_boundary) for f in facts]
    items += [(s, d, False) for f in facts for s, d in f.decoys]
    for sentence, depth, at_boundary in items:
        offset = int(depth * total)
        doc = 0
        while offset >= sizes[doc]:
            offset -= sizes[doc]
            doc += 1
        text = articles[doc][1]
        point, piece = _insertion(text, offset, sentence, at_boundary, rng)
        inserts.setdefault(doc, []).append((point, piece))
    docs = []
    for index, (title, text) in enumerate(articles):
        for point, piece in sorted(inserts.get(index, []), key=lambda p: -p[0]):
            text = text[:point] + piece + text[point:]
        docs.append((title, text))
    return docs


_SENTENCE_START = re.compile(r"(?<=[.!?] )(?=[A-Z])|(?<=\n\n)(?=[A-Z])")


def _insertion(text: str, offset: int, sentence: str, at_boundary: bool, rng):
    if at_boundary:  # just before a heading, or as the first sentence after one
        heading = re.compile(r"^#+ .*\n\n?", re.M)
        match = heading.search(text, offset) or heading.search(text)
        if match is not None:
            if rng.random() < 0.5:
                return match.start(), sentence + "\n\n"
            return match.end(), sentence + " "
    match = _SENTENCE_START.search(text, offset) or _SENTENCE_START.search(text)
    return match.start(), sentence + " "


# ------------------------------------------------------------------------------- runs


@dataclass
class Run:
    hits: int = 0
    tokens: list[int] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    index_s: float = 0.0
    index_cpu_s: float = 0.0
    add_s: float = 0.0
    misses: list[str] = field(default_factory=list)


def index_in_memory(docs, params: RankParams | None = None) -> float:
    """Seconds to segment and index the corpus in memory (what `add` computes)."""
    started = time.perf_counter()
    ranker, next_id = Ranker(params), 0
    for _, text in docs:
        data = text.encode()
        batch = []
        for section in segment(data):
            text = data[section.start : section.end].decode()
            opening_words(text)  # the line of the mode-2 index, as Blaise.add computes it
            batch.append((next_id, text, section.headings))
            next_id += 1
        ranker.add_many(batch)
    ranker.prepare()  # what the first search would do
    return time.perf_counter() - started


def run_blaise(docs, facts, tokenizer, params: RankParams | None = None) -> Run:
    cpu = time.process_time()
    run = Run(index_s=index_in_memory(docs, params))
    run.index_cpu_s = time.process_time() - cpu
    with tempfile.TemporaryDirectory(prefix="bench-blaise-") as root:
        memory = Blaise(root, rank_params=params)
        started = time.perf_counter()
        for title, text in docs:
            memory.add(title, text)
        run.add_s = time.perf_counter() - started
        for fact in facts:
            started = time.perf_counter()
            found = memory.select(fact.question)
            run.latencies_ms.append((time.perf_counter() - started) * 1000)
            if found and fact.sentence in found[0].text:
                run.hits += 1
            else:
                run.misses.append(f"{fact.question} -> {fact.sentence}")
            if found and tokenizer is not None:
                prompt = memory.prompt(
                    fact.question, tokenizer, page_size=PAGE_SIZE, selection=found[0]
                )
                run.tokens.append(len(prompt.input_ids))
        memory.close()
    return run


def baseline_chunks(docs, count) -> list[str]:
    """RAGFlow's naive chunking: split at sentence and line ends, merge up to 512 tokens."""
    chunks = []
    for _, text in docs:
        current, current_tokens = "", 0
        for piece in re.split(r"(?<=[.!?\n])", text):
            tokens = count(piece.encode())
            if current and current_tokens + tokens > BASELINE_CHUNK_TOKENS:
                chunks.append(current)
                current, current_tokens = "", 0
            current += piece
            current_tokens += tokens
        if current:
            chunks.append(current)
    return chunks


def run_baseline(docs, facts, tokenizer) -> Run:
    chunks = baseline_chunks(docs, tokenizer.count)
    plain = RankParams(
        heading_weight=0.0,
        sentence_weight=0.0,
        answer_weight=0.0,
        attribute_weight=0.0,
        subject=False,
    )
    ranker = Ranker(plain)
    for index, chunk in enumerate(chunks):
        ranker.add(index, chunk)
    run = Run()
    for fact in facts:
        started = time.perf_counter()
        best = ranker.search(fact.question, 1)
        run.latencies_ms.append((time.perf_counter() - started) * 1000)
        text = chunks[best[0][0]] if best else ""
        run.hits += fact.sentence in text
        run.tokens.append(len(tokenizer.encode(text)) + len(tokenizer.encode(fact.question)))
    return run


# ------------------------------------------------------------------------------- report


VERSIONS = {
    "basic": BASIC,
    "hard": HARD,
    "decoys": Hardness(decoys=True),
    "low_overlap": Hardness(low_overlap=True),
    "boundaries": Hardness(boundaries=True),
}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def machine_header() -> list[str]:
    lines = []
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line for line in cpuinfo if line.startswith("model name"))
        lines.append("cpu: " + model.split(":", 1)[1].strip() + f", {os.cpu_count()} cpus")
    except (OSError, StopIteration):
        pass
    try:
        import subprocess

        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        lines.append(f"commit: {commit}")
    except OSError:
        pass
    lines.append(f"python: {sys.version.split()[0]}")
    return lines


def run_version(articles, tokenizer, name: str, seeds: int, repeats: int, show_misses: bool):
    rows = []
    for seed in range(seeds):
        docs, facts = build_case(articles, seed, VERSIONS[name])
        run = run_blaise(docs, facts, tokenizer)
        walls, cpus = [run.index_s], [run.index_cpu_s]
        for _ in range(repeats - 1):
            cpu = time.process_time()
            walls.append(index_in_memory(docs))
            cpus.append(time.process_time() - cpu)
        run.index_s, run.index_cpu_s = statistics.median(walls), statistics.median(cpus)
        base = run_baseline(docs, facts, tokenizer)
        rows.append((run, base))
        print(
            f"{name} seed {seed}: Blaise {run.hits}/{len(facts)}, baseline {base.hits}/"
            f"{len(facts)}; tokens/q median {statistics.median(run.tokens):.0f}; index "
            f"{run.index_s * 1000:.0f} ms (cpu {run.index_cpu_s * 1000:.0f}); add "
            f"{run.add_s * 1000:.0f} ms; select p50 {percentile(run.latencies_ms, 0.5):.2f} "
            f"p95 {percentile(run.latencies_ms, 0.95):.2f} ms; load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if show_misses:
            for miss in run.misses:
                print("   miss:", miss)
    return rows


_OFF = {"subject": False}
ABLATIONS = {
    "BM25 (stemmed, stop words out)": RankParams(
        heading_weight=0.0, sentence_weight=0.0, answer_weight=0.0, attribute_weight=0.0, **_OFF
    ),
    "+ heading path x2": RankParams(
        sentence_weight=0.0, answer_weight=0.0, attribute_weight=0.0, **_OFF
    ),
    "+ best sentence": RankParams(answer_weight=0.0, attribute_weight=0.0, **_OFF),
    "+ answer type": RankParams(attribute_weight=0.0, **_OFF),
    "+ attributes": RankParams(**_OFF),
    "+ subject (Blaise)": RankParams(),
}


def run_ablation(articles, seeds: int, versions: list[str]) -> None:
    """Recall of each ranking stage (selection only, in memory), summed over the seeds."""
    cases = {
        name: [build_case(articles, seed, VERSIONS[name]) for seed in range(seeds)]
        for name in versions
    }
    print()
    print(f"| ranking (recall, sum over {seeds} seeds of 100) | " + " | ".join(versions) + " |")
    print("|---|" + "---|" * len(versions))
    for label, params in ABLATIONS.items():
        cells = []
        for name in versions:
            total = 0
            for docs, facts in cases[name]:
                ranker, texts = Ranker(params), []
                for _, text in docs:
                    data = text.encode()
                    for section in segment(data):
                        texts.append(data[section.start : section.end].decode())
                        ranker.add(len(texts) - 1, texts[-1], section.headings)
                for fact in facts:
                    best = ranker.search(fact.question, 1)
                    total += bool(best) and fact.sentence in texts[best[0][0]]
            cells.append(f"{total} / {100 * seeds}")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5, help="index-time repeats per seed")
    parser.add_argument("--versions", default="basic,hard,decoys,low_overlap,boundaries")
    parser.add_argument("--show-misses", action="store_true")
    parser.add_argument("--ablation", action="store_true", help="only the ranking ablation")
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="wiki")
    parser.add_argument(
        "--questions",
        choices=QUESTION_SETS,
        default="published",
        help="hard questions: the published templates, or the held-out set",
    )
    args = parser.parse_args(argv)
    global question_set
    question_set = args.questions

    articles = CORPORA[args.corpus]()
    tokenizer = TekkenTokenizer()
    corpus_bytes = sum(len(text.encode()) for _, text in articles)
    corpus_tokens = sum(len(tokenizer.encode(text)) for _, text in articles)
    for line in machine_header():
        print(line)
    source = "gensim's enwiki test dump" if args.corpus == "wiki" else "pydoc_data topics"
    print(
        f"corpus: {len(articles)} documents from {source}, {corpus_bytes:,} bytes, "
        f"{corpus_tokens:,} Tekken tokens"
    )
    print("articles:", ", ".join(title for title, _ in articles))
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.ablation:
        run_ablation(articles, args.seeds, args.versions.split(","))
        return 0
    results = {}
    for name in args.versions.split(","):
        results[name] = run_version(
            articles, tokenizer, name, args.seeds, args.repeats, args.show_misses
        )
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print_summary(results)
    return 0


def print_summary(results) -> None:
    print()
    print(
        "| version | seeds | Blaise recall per seed | min / median | baseline min / median | "
        "tokens/q median (p95), Blaise / baseline | index median wall (cpu) | add() median | "
        "select p50 / p95 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        hits = [run.hits for run, _ in rows]
        base_hits = [base.hits for _, base in rows]
        tokens = [t for run, _ in rows for t in run.tokens]
        base_tokens = [t for _, base in rows for t in base.tokens]
        latencies = [t for run, _ in rows for t in run.latencies_ms]
        index_wall = statistics.median(run.index_s for run, _ in rows) * 1000
        index_cpu = statistics.median(run.index_cpu_s for run, _ in rows) * 1000
        print(
            f"| {name} | {len(rows)} | {' '.join(map(str, hits))} | {min(hits)} / "
            f"{statistics.median(hits):.0f} | {min(base_hits)} / "
            f"{statistics.median(base_hits):.0f} | {statistics.median(tokens):.0f} "
            f"({percentile(tokens, 0.95):.0f}) / {statistics.median(base_tokens):.0f} | "
            f"{index_wall:.0f} ms ({index_cpu:.0f} ms) | "
            f"{statistics.median(run.add_s for run, _ in rows) * 1000:.0f} ms | "
            f"{percentile(latencies, 0.5):.2f} / {percentile(latencies, 0.95):.2f} ms |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
