"""Warm a corpus into the store through a running SGLang server, and say what is ready.

    galahad warm  --server URL [--root DIR] [--tenant T] [--pin] [--sections] [--json] FILE...
    galahad warm  --check ...                      (the same as `galahad ready`)
    galahad ready --server URL [--root DIR] [--tenant T] [--sections] [--json] FILE...

and from Python, for a program that embeds SGLang (`target` is a URL or an `sglang.Engine`):

    reports = hicache_galahad.warm(target, ["handbook.md"], root="/var/lib/galahad", pin=True)
    states = hicache_galahad.ready(target, ["handbook.md"], root="/var/lib/galahad")

`warm` tokenizes each document (the server's /tokenize, or the engine's tokenizer), sends it as
a prompt-only request (token ids, one output token), waits until the server's write-through has
backed its pages up, then checks that the store holds every page by computing the page keys
itself: SGLang 0.5.23's storage chain (`mem_cache/utils.py` `get_storage_hash_str`: SHA-256 over
the prior raw digest and the page's token ids as uint32 little-endian, seeded by
`storage_namespace_seed(extra_key, cache_salt)` when the request carries either) over the same
token ids, in every namespace the server writes (one per TP rank, found from the namespace
descriptions under the root). Missing pages are retried (flush, resend) a bounded number of
times. With `--sections` each Blaise section is warmed as the page-aligned prefix that
`Blaise.prompt` composes for it, so a later question about that section finds all of it.

A hybrid model (a Mamba/GDN state pool beside the KV pool) restores from a checkpoint: the
state after exactly B tokens, B on SGLang's grid C, B <= N - 1 (docs/CHECKPOINTS.md). SGLang
0.5.23 saves a prefill's state only at the request's last grid position, C*floor(N/C), so a
document of D tokens is sent as: its prefix of C*floor((D-1)/C) tokens first when that is a
different grid position (D a multiple of C), then the whole document (its first part found in
the device cache, only the rest computed). Later prompts that continue the document find the
state at C*floor(D/C), and the document resent alone finds the one at C*floor((D-1)/C).
`checkpoint_every` adds grid positions inside the document (for prompts that leave it early).

`ready` computes the same keys and reports, from the store alone, how many tokens a request
would restore now: the leading run of pages present in every rank's namespace, over SGLang's
strict prefix (floor((N-1)/P) pages for a request of exactly the document), and for a hybrid the
deepest page of that run whose state is present in every rank's state namespace. A request that
continues the document (a question after it) may restore up to floor(N/P) pages:
`continuation_tokens`. Nothing is sent to the model (the server only tokenizes).

No torch or SGLang here: HTTP is urllib; the hash chain is re-implemented byte for byte and
tests/test_warm.py holds it to SGLang's own function.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config.fingerprint import fingerprint_model_dir
from ..record.namespace import Namespace
from ..store import RecordStore

HTTP_TIMEOUT_S = 600.0
DEFAULT_WAIT_S = 60.0
DEFAULT_RETRIES = 2
POLL_S = 0.2
QUIET_S = 0.5  # the store unchanged this long, after the last expected page arrived
MAMBA_CHUNK = 64  # SGLang's FLA chunk: the checkpoint grid is max(64, page_size)
KV_POOL, STATE_POOLS = "kv", ("mamba",)
DTYPE_ARGS = ("kv_cache_dtype", "mamba_ssm_dtype", "dtype")
PIN_BUDGET_KEYS = ("max_bytes", "max_pinned_bytes")  # the server's; a pin obeys them
EXIT_OK, EXIT_INCOMPLETE, EXIT_EXPECTED = 0, 1, 2

log = logging.getLogger("hicache_galahad.warm")


class WarmError(Exception):
    """A condition an operator can meet (no server, no store, no namespace of the server's
    model under the root): one line, exit status 2."""


# ----------------------------------------------------------------------------- page keys


def namespace_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    """SGLang 0.5.23 `storage_namespace_seed`: the prior of a chain's first page when the
    request carries an extra key (LoRA, ...) or a cache salt; None for the default namespace."""
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(b"sglang-cache-namespace-v1")
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
            continue
        encoded = part.encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.hexdigest()


def page_keys(
    token_ids: list[int],
    page_size: int,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
) -> list[str]:
    """The storage keys SGLang gives the full pages of `token_ids` (its `get_storage_hash_str`
    over a page-aligned list): key i names the prefix of (i + 1) * page_size tokens."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    seed = namespace_seed(extra_key, cache_salt)
    prior = bytes.fromhex(seed) if seed else b""
    keys = []
    for start in range(0, len(token_ids) - len(token_ids) % page_size, page_size):
        page = token_ids[start : start + page_size]
        if any(token < 0 for token in page):
            raise ValueError("token ids must be non-negative")
        if any(token >= 1 << 32 for token in page):
            # SGLang switches such a page to its "wide" encoding (tag 0xff, uint64 tokens)
            body = b"\xff" + b"".join(int(t).to_bytes(8, "little") for t in page)
        else:
            body = b"".join(int(t).to_bytes(4, "little") for t in page)
        prior = hashlib.sha256(prior + body).digest()
        keys.append(prior.hex())
    return keys


# ----------------------------------------------------------------------------- arithmetic


def checkpoint_interval(page_size: int) -> int:
    """SGLang's hybrid checkpoint grid C = max(FLA chunk 64, page size)."""
    return max(MAMBA_CHUNK, page_size)


def strict_prefix_bound(num_tokens: int, interval: int) -> int:
    """B = C*floor((N-1)/C): the deepest checkpoint a request of N tokens can restore."""
    return interval * max(0, (num_tokens - 1) // interval)


def prefill_plan(num_tokens: int, interval: int, checkpoint_every: int = 0) -> list[int]:
    """The prefix lengths to send, in order, so that a hybrid's prefill leaves a checkpoint at
    every grid position later prompts need (see the module docstring); the last is N."""
    points = set()
    if checkpoint_every:
        if checkpoint_every % interval:
            raise ValueError(
                f"checkpoint_every={checkpoint_every}: expected a multiple of the checkpoint "
                f"grid C={interval}"
            )
        points.update(range(checkpoint_every, num_tokens, checkpoint_every))
    alone = strict_prefix_bound(num_tokens, interval)
    if 0 < alone < interval * (num_tokens // interval):
        points.add(alone)
    return sorted(point for point in points if point < num_tokens) + [num_tokens]


def state_pages(plan: list[int], interval: int, page_size: int) -> list[int]:
    """Page indices whose state a prefill plan leaves (one per request, at its last grid
    position; none for a request shorter than C)."""
    pages = {interval * (length // interval) // page_size - 1 for length in plan}
    return sorted(page for page in pages if page >= 0)


# ----------------------------------------------------------------------------- the server


@dataclass
class ServerProfile:
    """What warm and ready need to know of the server (from /server_info and /model_info, or
    an Engine's server arguments)."""

    model_path: str
    tokenizer_path: str
    page_size: int
    tp_size: int
    root: str | None
    tenant: str
    model_fingerprint: str | None
    dtypes: dict
    write_policy: str | None
    store_options: dict = field(default_factory=dict)  # the budget a pin must respect
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_args(cls, args: dict, model: dict | None = None) -> ServerProfile:
        model = model or {}
        extra = args.get("hicache_storage_backend_extra_config") or {}
        if isinstance(extra, str):
            if extra.startswith("@"):
                try:
                    extra = Path(extra[1:]).read_text()
                except OSError:
                    extra = "{}"
            try:
                extra = json.loads(extra)
            except ValueError:
                extra = {}
        model_path = str(model.get("model_path") or args.get("model_path") or "")
        return cls(
            model_path=model_path,
            tokenizer_path=str(
                model.get("tokenizer_path") or args.get("tokenizer_path") or model_path
            ),
            page_size=int(args.get("page_size") or 1),
            tp_size=int(args.get("tp_size") or 1),
            root=extra.get("root"),
            tenant=str(extra.get("tenant") or "default"),
            model_fingerprint=extra.get("model_fingerprint"),
            dtypes={name: str(args.get(name)) for name in DTYPE_ARGS},
            write_policy=args.get("hicache_write_policy"),
            store_options={key: extra[key] for key in PIN_BUDGET_KEYS if key in extra},
            raw=args,
        )


class HttpTarget:
    """A running server, over HTTP (urllib)."""

    def __init__(self, url: str, timeout_s: float = HTTP_TIMEOUT_S):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._tokenizer = None

    def _call(self, path: str, body: dict | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read()[:300].decode(errors="replace")
            raise WarmError(f"{self.url}{path}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as error:
            raise WarmError(f"no SGLang server at {self.url} ({error})") from None
        try:
            return json.loads(text) if text else {}
        except ValueError:
            return {}

    def profile(self) -> ServerProfile:
        return ServerProfile.from_args(self._call("/server_info"), self._call("/model_info"))

    def tokenize(self, text: str) -> list[int]:
        answer = self._call("/tokenize", {"prompt": text, "add_special_tokens": True})
        return [int(token) for token in answer["tokens"]]

    def tokenizer(self, profile: ServerProfile):
        """A local tokenizer for Blaise's prompt layout (its own encode calls), loaded from the
        path the server reports, as `galahad blaise ask` does."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer  # only for --sections

            self._tokenizer = AutoTokenizer.from_pretrained(profile.tokenizer_path)
        return self._tokenizer

    def prefill(self, input_ids: list[int], request: dict) -> dict:
        body = {
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            **request,
        }
        return self._call("/generate", body).get("meta_info", {})

    def flush(self) -> bool:
        try:
            self._call("/flush_cache", {})
            return True
        except WarmError:
            return False  # refused while requests run: the resend still recomputes


class EngineTarget:
    """An in-process `sglang.Engine` (duck-typed: nothing of SGLang is imported here)."""

    def __init__(self, engine):
        self.engine = engine

    def profile(self) -> ServerProfile:
        args = getattr(self.engine, "server_args", None)
        if args is None:
            args = self.engine.tokenizer_manager.server_args
        names = (
            "model_path",
            "tokenizer_path",
            "page_size",
            "tp_size",
            "hicache_storage_backend_extra_config",
            "hicache_write_policy",
            *DTYPE_ARGS,
        )  # SGLang's ServerArgs is not always a plain object (vars() can be empty)
        return ServerProfile.from_args({name: getattr(args, name, None) for name in names})

    def tokenizer(self, profile: ServerProfile):
        return self.engine.tokenizer_manager.tokenizer

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(None).encode(text))

    def prefill(self, input_ids: list[int], request: dict) -> dict:
        output = self.engine.generate(
            input_ids=input_ids,
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            **request,
        )
        return dict(output.get("meta_info", {})) if isinstance(output, dict) else {}

    def flush(self) -> bool:
        result = self.engine.flush_cache()
        return bool(getattr(result, "success", True))


def as_target(target) -> HttpTarget | EngineTarget:
    if isinstance(target, HttpTarget | EngineTarget):
        return target
    if isinstance(target, str):
        return HttpTarget(target)
    if hasattr(target, "generate") and hasattr(target, "tokenizer_manager"):
        return EngineTarget(target)
    raise TypeError(f"target must be a server URL or an sglang.Engine, not {type(target)}")


# ----------------------------------------------------------------------------- namespaces


@dataclass
class RankNamespaces:
    """The namespaces one rank of the server writes: its KV pages and (hybrid) its states."""

    rank: str
    kv: Namespace
    states: list[Namespace] = field(default_factory=list)


def _fingerprint(profile: ServerProfile) -> str | None:
    if profile.model_fingerprint:
        return profile.model_fingerprint
    if os.path.isdir(profile.model_path):
        try:
            return fingerprint_model_dir(profile.model_path)
        except Exception:
            return None
    return None


def server_namespaces(
    store: RecordStore, profile: ServerProfile, tenant: str | None = None
) -> list[RankNamespaces]:
    """The server's namespaces under the store's root, one entry per rank: the KV namespaces
    whose description names the server's tenant, model (fingerprint, else model path), page
    size and TP size, grouped by parallel coordinates (a TP rank, a PP stage: every one must
    hold a page for SGLang to restore it); where several match one rank, those of the server's
    dtypes; the state pools tied to each (their `kv_namespace`)."""
    tenant = tenant or profile.tenant
    fingerprint = _fingerprint(profile)
    described = [ns for _, ns in store.namespaces_on_disk() if ns is not None]

    def ours(ns: Namespace) -> bool:
        geometry = ns.geometry or {}
        parallel = geometry.get("parallel") or {}
        if ns.tenant != tenant or int(parallel.get("tp_size") or 1) != profile.tp_size:
            return False
        if fingerprint is not None:
            return ns.model_fingerprint == fingerprint
        return geometry.get("model_name") == profile.model_path

    kv_by_rank: dict[str, list[Namespace]] = {}
    for ns in described:
        if ns.pool == KV_POOL and ours(ns) and ns.geometry.get("page_size") == profile.page_size:
            rank = json.dumps(ns.geometry.get("parallel") or {}, sort_keys=True)
            kv_by_rank.setdefault(rank, []).append(ns)
    ranks = []
    for rank, found in sorted(kv_by_rank.items()):
        same_dtypes = [ns for ns in found if ns.geometry.get("serving_dtypes") == profile.dtypes]
        kv = sorted(same_dtypes or found, key=lambda ns: ns.dirname)[0]
        states = [
            ns
            for ns in described
            if ns.pool in STATE_POOLS and (ns.geometry or {}).get("kv_namespace") == kv.dirname
        ]
        ranks.append(RankNamespaces(rank, kv, sorted(states, key=lambda ns: ns.pool)))
    return ranks


# ----------------------------------------------------------------------------- documents


@dataclass
class Document:
    """A prefix to warm: its name, its token ids (or its text, tokenized by the server)."""

    name: str
    text: str | None = None
    token_ids: list[int] | None = None


def load_documents(documents: Iterable, sections: bool, target, profile) -> list[Document]:
    """Documents from paths (os.PathLike, or str naming a file), (name, text or ids) pairs,
    Document objects, or token-id lists; with `sections`, each Blaise section of each text as
    the prefix `Blaise.prompt` composes."""
    loaded: list[Document] = []
    for index, item in enumerate(documents):
        if isinstance(item, Document):
            document = item
        elif isinstance(item, os.PathLike) or (isinstance(item, str) and os.path.isfile(item)):
            path = os.fspath(item)
            with open(path, "rb") as handle:
                document = Document(path, handle.read().decode("utf-8"))
        elif isinstance(item, tuple) and len(item) == 2:
            name, body = item
            document = (
                Document(str(name), body)
                if isinstance(body, str)
                else Document(str(name), None, list(body))
            )
        elif isinstance(item, str):
            document = Document(f"document {index + 1}", item)
        else:
            document = Document(f"document {index + 1}", None, [int(t) for t in item])
        if sections and document.text is not None:
            loaded.extend(section_prefixes(document, target.tokenizer(profile), profile.page_size))
        else:
            loaded.append(document)
    return loaded


def section_prefixes(document: Document, tokenizer, page_size: int) -> list[Document]:
    """Each Blaise section of the document as the page-aligned prefix of the prompt
    `Blaise.prompt` composes for it (the same segmentation defaults as `Blaise.add`, the
    document named as `galahad blaise add` names it: its path as given)."""
    from ..blaise.prompt import compose
    from ..blaise.segment import segment

    data = (document.text or "").encode("utf-8")
    prefixes = []
    for number, section in enumerate(segment(data), 1):
        prompt = compose(
            tokenizer,
            doc_id=document.name,
            headings=section.headings,
            text=data[section.start : section.end].decode("utf-8"),
            question="",
            page_size=page_size,
        )
        prefixes.append(
            Document(f"{document.name}#{number}", None, prompt.input_ids[: prompt.prefix_len])
        )
    return prefixes


# ----------------------------------------------------------------------------- readiness


@dataclass
class Readiness:
    tokens: int  # the document's token count N
    restorable_tokens: int  # a request of exactly the document, now
    continuation_tokens: int  # a request that continues the document (a question after it)
    pages_expected: int  # the pages SGLang stores: floor(N/P), for a hybrid C*floor(N/C)/P
    pages_stored: int  # of those, present in every rank's namespace
    checkpoints: list[int]  # token positions with a state in every rank (hybrid)
    hybrid: bool


def readiness(
    store, ranks: list[RankNamespaces], keys: list[str], num_tokens: int, page_size: int
) -> Readiness:
    """From the store alone: how much of a prefix of `num_tokens` tokens (page keys `keys`)
    a request would restore now (see the module docstring)."""
    hybrid = any(rank.states for rank in ranks)
    if not ranks:
        return Readiness(num_tokens, 0, 0, len(keys), 0, [], hybrid)
    stored = min(store.leading_run(rank.kv, keys) for rank in ranks)
    present = [sum(1 for key in keys if store.contains(rank.kv, key)) for rank in ranks]
    checkpoints = []
    if hybrid:
        for page in range(stored):
            if all(all(store.contains(ns, keys[page]) for ns in rank.states) for rank in ranks):
                checkpoints.append((page + 1) * page_size)

    def restorable(pages: int) -> int:
        if not hybrid:
            return pages * page_size
        return max((point for point in checkpoints if point <= pages * page_size), default=0)

    alone_pages = min(stored, max(0, num_tokens - 1) // page_size)
    return Readiness(
        num_tokens,
        restorable(alone_pages),
        restorable(stored),
        len(keys),
        min(present),
        checkpoints,
        hybrid,
    )


# ----------------------------------------------------------------------------- reports


@dataclass
class WarmReport:
    document: str
    tokens: int
    pages_expected: int
    pages_stored: int
    restorable_tokens: int
    continuation_tokens: int
    checkpoints: list[int]
    checkpoints_expected: list[int]
    requests: int
    attempts: int
    seconds: float
    pinned: dict | None = None
    hybrid: bool = False
    checked_only: bool = False

    @property
    def complete(self) -> bool:
        return self.pages_stored == self.pages_expected and set(self.checkpoints_expected) <= set(
            self.checkpoints
        )

    def as_dict(self) -> dict:
        return asdict(self) | {"complete": self.complete}


def _open_store(root: str | None, profile: ServerProfile, *, writable: bool) -> RecordStore:
    root = root or profile.root
    if not root:
        raise WarmError("no store root: pass --root (the server's extra config names none)")
    root = os.path.abspath(os.path.expanduser(root))
    if not os.path.isdir(os.path.join(root, "ns")):
        raise WarmError(f"{root} is not a hicache-galahad store (no ns/ directory)")
    if not writable:
        return RecordStore(root, read_only=True)
    return RecordStore(root, **profile.store_options)


def _request_fields(extra_key: str | None, cache_salt: str | None) -> dict:
    fields = {}
    if extra_key is not None:
        fields["extra_key"] = extra_key
    if cache_salt is not None:
        fields["cache_salt"] = cache_salt
    return fields


class _Session:
    """One target, one store, the server's namespaces: what warm and ready share."""

    def __init__(self, target, root, tenant, *, writable, extra_key=None, cache_salt=None):
        self.target = as_target(target)
        self.profile = self.target.profile()
        self.store = _open_store(root, self.profile, writable=writable)
        self.tenant = tenant
        self.ranks = server_namespaces(self.store, self.profile, tenant)
        if not self.ranks:
            self.store.close()
            raise WarmError(
                f"no namespace of the server's model ({self.profile.model_path}, tenant "
                f"{tenant or self.profile.tenant!r}, page size {self.profile.page_size}, TP "
                f"size {self.profile.tp_size}) under {self.store.root}: is the server using "
                "this root?"
            )
        self.hybrid = any(rank.states for rank in self.ranks)
        self.interval = checkpoint_interval(self.profile.page_size)
        self.extra_key, self.cache_salt = extra_key, cache_salt

    def ids(self, document: Document) -> list[int]:
        if document.token_ids is None:
            document.token_ids = self.target.tokenize(document.text or "")
        return document.token_ids

    def keys(self, ids: list[int]) -> list[str]:
        return page_keys(
            ids, self.profile.page_size, extra_key=self.extra_key, cache_salt=self.cache_salt
        )

    def readiness(self, ids: list[int]) -> Readiness:
        keys = self.keys(ids)
        if self.hybrid:  # the radix cache of a hybrid holds (and backs up) whole grid units
            keys = keys[: self.interval * (len(ids) // self.interval) // self.profile.page_size]
        return readiness(self.store, self.ranks, keys, len(ids), self.profile.page_size)

    def close(self) -> None:
        self.store.close()


def _wait_stored(session: _Session, ids, expected_points, wait_s: float) -> Readiness:
    """Polls the store until every page and expected checkpoint is there and nothing changed
    for QUIET_S, or `wait_s` passes; returns what it saw last."""
    deadline = time.monotonic() + wait_s
    last, since = None, time.monotonic()
    while True:
        seen = session.readiness(ids)
        state = (seen.pages_stored, tuple(seen.checkpoints))
        if state != last:
            last, since = state, time.monotonic()
        done = seen.pages_stored == seen.pages_expected and set(expected_points) <= set(
            seen.checkpoints
        )
        if done and time.monotonic() - since >= QUIET_S:
            return seen
        if time.monotonic() >= deadline:
            return seen
        time.sleep(POLL_S)


def _pin(session: _Session, ids, document: str, report: WarmReport) -> dict:
    pin = getattr(session.store, "pin", None)
    if pin is None:
        raise WarmError("this build of hicache-galahad has no pins (RecordStore.pin)")
    keys = session.keys(ids)[: report.pages_stored]
    state_keys = [keys[point // session.profile.page_size - 1] for point in report.checkpoints]
    totals = {"pinned_records": 0, "already_pinned_records": 0, "pinned_bytes": 0}
    missing, refused = [], []
    for rank in session.ranks:
        for namespace, wanted in [(rank.kv, keys)] + [(ns, state_keys) for ns in rank.states]:
            if not wanted:
                continue
            result = pin(namespace, wanted, document)
            for name in totals:
                totals[name] += int(getattr(result, name, 0) or 0)
            missing += list(getattr(result, "missing_keys", []) or [])
            refused += list(getattr(result, "refused_keys", []) or [])
    return totals | {"missing_keys": len(missing), "refused_keys": len(refused)}


def warm(
    target,
    documents: Iterable,
    *,
    root: str | None = None,
    tenant: str | None = None,
    pin: bool = False,
    sections: bool = False,
    check: bool = False,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    retries: int = DEFAULT_RETRIES,
    wait_s: float = DEFAULT_WAIT_S,
    checkpoint_every: int = 0,
    on_document: Callable[[WarmReport], None] | None = None,
) -> list[WarmReport]:
    """Warms each document into the store through `target` (a server URL or an
    `sglang.Engine`); see the module docstring. `root` defaults to the server's own; `tenant`
    to the server's. With `check`, only reports (nothing is sent but /tokenize). Returns one
    report per document (per section with `sections`); `.complete` says whether every page
    (and, for a hybrid, every planned checkpoint) is in the store."""
    session = _Session(
        target,
        root,
        tenant,
        writable=pin and not check,
        extra_key=extra_key,
        cache_salt=cache_salt,
    )
    request = _request_fields(extra_key, cache_salt)
    policy = session.profile.write_policy
    if not check and policy and not str(policy).startswith("write_through"):
        log.warning(
            "galahad warm: the server's --hicache-write-policy is %s: its pages reach the store "
            "only when evicted from host memory, so warm may wait out --wait and its retries; "
            "use write_through",
            policy,
        )
    try:
        reports = []
        for document in load_documents(documents, sections, session.target, session.profile):
            started = time.monotonic()
            ids = session.ids(document)
            page = session.profile.page_size
            plan = (
                prefill_plan(len(ids), session.interval, checkpoint_every)
                if session.hybrid
                else [len(ids)]
            )
            expected_points = (
                [(p + 1) * page for p in state_pages(plan, session.interval, page)]
                if session.hybrid
                else []
            )
            seen = session.readiness(ids)
            requests = attempts = 0
            if not check:
                while attempts <= retries:
                    complete = seen.pages_stored == seen.pages_expected and set(
                        expected_points
                    ) <= set(seen.checkpoints)
                    if complete:
                        break  # stored (before the first request: nothing to send)
                    if attempts:
                        session.target.flush()  # device and host tiers: resend recomputes
                    for length in plan:
                        session.target.prefill(ids[:length], request)
                        requests += 1
                    attempts += 1
                    seen = _wait_stored(session, ids, expected_points, wait_s)
            report = WarmReport(
                document=document.name,
                tokens=len(ids),
                pages_expected=seen.pages_expected,
                pages_stored=seen.pages_stored,
                restorable_tokens=seen.restorable_tokens,
                continuation_tokens=seen.continuation_tokens,
                checkpoints=seen.checkpoints,
                checkpoints_expected=expected_points,
                requests=requests,
                attempts=attempts,
                seconds=round(time.monotonic() - started, 3),
                hybrid=session.hybrid,
                checked_only=check,
            )
            if pin and not check:
                report.pinned = _pin(session, ids, document.name, report)
            reports.append(report)
            if on_document is not None:
                on_document(report)
        return reports
    finally:
        session.close()


def ready(
    target,
    documents: Iterable,
    *,
    root: str | None = None,
    tenant: str | None = None,
    sections: bool = False,
    extra_key: str | None = None,
    cache_salt: str | None = None,
) -> list[WarmReport]:
    """How many tokens of each document a request would restore now, from the store alone
    (`restorable_tokens`; `continuation_tokens` for a request that continues it)."""
    return warm(
        target,
        documents,
        root=root,
        tenant=tenant,
        sections=sections,
        check=True,
        extra_key=extra_key,
        cache_salt=cache_salt,
    )


# ----------------------------------------------------------------------------- the command


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _render(reports: list[WarmReport], check: bool) -> str:
    hybrid = any(report.hybrid for report in reports)
    header = ["document", "tokens", "pages stored", "restorable"]
    header += ["checkpoints"] if hybrid else []
    header += [] if check else ["requests", "seconds", "pinned"]
    rows = [header]
    for r in reports:
        row = [
            r.document,
            str(r.tokens),
            f"{r.pages_stored}/{r.pages_expected}",
            f"{r.restorable_tokens} (+question: {r.continuation_tokens})",
        ]
        if hybrid:
            row.append(",".join(str(point) for point in r.checkpoints) or "-")
        if not check:
            pinned = (
                "-"
                if r.pinned is None
                else f"{r.pinned['pinned_records'] + r.pinned['already_pinned_records']}"
            )
            row += [str(r.requests), f"{r.seconds:.2f}", pinned]
        rows.append(row)
    incomplete = [r.document for r in reports if not r.complete]
    lines = [_table(rows)]
    if incomplete:
        lines.append(f"not fully stored: {', '.join(incomplete)}")
    return "\n".join(lines)


def cmd_warm(args) -> int:
    check = args.check or args.command == "ready"
    progress = None
    if sys.stderr.isatty() and not args.json:
        from tqdm import tqdm

        progress = tqdm(
            total=len(args.files), unit="doc", desc="ready" if check else "warm", file=sys.stderr
        )
    try:
        reports = warm(
            args.server,
            [Path(path) for path in args.files],
            root=args.root,
            tenant=args.tenant,
            pin=getattr(args, "pin", False),
            sections=args.sections,
            check=check,
            extra_key=args.extra_key,
            cache_salt=args.cache_salt,
            retries=getattr(args, "retries", DEFAULT_RETRIES),
            wait_s=getattr(args, "wait", DEFAULT_WAIT_S),
            checkpoint_every=getattr(args, "checkpoint_every", 0),
            on_document=(lambda report: progress.update(1)) if progress else None,
        )
    except WarmError as error:
        print(f"galahad: {error}", file=sys.stderr)
        return EXIT_EXPECTED
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        data = {"documents": [report.as_dict() for report in reports]}
        data["complete"] = all(report.complete for report in reports)
        print(json.dumps(data, indent=2))
    else:
        print(_render(reports, check))
    return EXIT_OK if all(report.complete for report in reports) else EXIT_INCOMPLETE


def _common(parser) -> None:
    parser.add_argument("--server", required=True, help="SGLang server URL (http://host:port)")
    parser.add_argument("--root", help="store directory (default: the server's root)")
    parser.add_argument("--tenant", help="the tenant the server writes as (default: its own)")
    parser.add_argument(
        "--sections", action="store_true", help="each Blaise section as its prompt prefix"
    )
    parser.add_argument("--extra-key", help="the request's extra_key (also seeds the keys)")
    parser.add_argument("--cache-salt", help="the request's cache_salt (also seeds the keys)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.set_defaults(run=cmd_warm)


def register(commands) -> None:
    """Adds `warm` and `ready` to the `galahad` command's subparsers."""
    warm_parser = commands.add_parser(
        "warm", help="send documents through a server until the store holds every page"
    )
    _common(warm_parser)
    warm_parser.add_argument("--pin", action="store_true", help="pin the warmed records")
    warm_parser.add_argument(
        "--check", action="store_true", help="send nothing: report what is ready (= ready)"
    )
    warm_parser.add_argument(
        "--retries", type=int, default=DEFAULT_RETRIES, help="flush and resend this often (2)"
    )
    warm_parser.add_argument(
        "--wait", type=float, default=DEFAULT_WAIT_S, help="seconds to wait for write-back (60)"
    )
    warm_parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="TOKENS",
        help="hybrid: also leave a checkpoint every TOKENS (a multiple of the grid)",
    )
    ready_parser = commands.add_parser(
        "ready", help="how many tokens of each document a request would restore now"
    )
    _common(ready_parser)
    ready_parser.set_defaults(check=True)
