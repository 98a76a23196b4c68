"""`warm` and `ready`, the library functions: each document sent through the server until the
store holds every page (and, for a hybrid, every planned checkpoint), checked by recomputing
SGLang's page keys in every namespace the server writes; optionally pinned; and what a request
would restore now, with one probe of whether the server restores at all."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from checkpoint.prefill import checkpoint_interval, grid_floor, prefill_plan, state_pages

from ..errors import ServerError
from ..store import RecordStore
from .documents import Document, load_documents
from .http import DEFAULT_DEADLINE_S
from .keys import page_keys
from .namespaces import server_namespaces
from .probe import Probe, probe_length, send_probe, skipped
from .profile import ServerProfile
from .readiness import Readiness, readiness
from .targets import as_target

DEFAULT_WAIT_S = 60.0
DEFAULT_RETRIES = 2
POLL_S = 0.2
QUIET_S = 0.5  # the store unchanged this long, after the last expected page arrived

log = logging.getLogger("hicache_galahad.warm")


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
    probe: Probe | None = None  # ready: whether the server restores now (one per call)

    @property
    def complete(self) -> bool:
        return self.pages_stored == self.pages_expected and set(self.checkpoints_expected) <= set(
            self.checkpoints
        )

    def as_dict(self) -> dict:
        data = asdict(self) | {"complete": self.complete}
        data.pop("probe")
        return data


def _open_store(
    root: str | None, profile: ServerProfile, *, writable: bool, root_pin_limit: bool = False
) -> RecordStore:
    if not root and not profile.root:
        why = f" ({profile.extra_config_problem})" if profile.extra_config_problem else ""
        raise ServerError(f"no store root: pass --root (the server's extra config names none{why})")
    root = os.path.abspath(os.path.expanduser(root or profile.root))
    if not os.path.isdir(os.path.join(root, "ns")):
        raise ServerError(f"{root} is not a hicache-galahad store (no ns/ directory)")
    if not writable:
        return RecordStore(root, read_only=True)
    if profile.extra_config_problem and not root_pin_limit:
        raise ServerError(
            "warm --pin must obey the server's pin limit (max_pinned_bytes, max_bytes), and "
            f"its extra config cannot be read here: {profile.extra_config_problem}; pass "
            "--root-pin-limit to pin within the root's limit instead"
        )
    if profile.extra_config_problem:
        log.warning(
            "galahad warm: the server's extra config cannot be read here (%s): pinning within "
            "the root's limit (the smallest max_pinned_bytes of the live store processes, else "
            "the last one applied)",
            profile.extra_config_problem,
        )
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

    def __init__(
        self, target, root, tenant, *, writable, extra_key, cache_salt, timeout_s, root_pin_limit
    ):
        self.target = as_target(target, timeout_s)
        self.profile = self.target.profile()
        self.store = _open_store(
            root, self.profile, writable=writable, root_pin_limit=root_pin_limit
        )
        try:
            self.ranks = server_namespaces(self.store, self.profile, tenant)
        except BaseException:
            self.store.close()
            raise
        if not self.ranks:
            self.store.close()
            unread = self.profile.extra_config_problem
            raise ServerError(
                f"no namespace of the server's model ({self.profile.served_model_name}, tenant "
                f"{tenant or self.profile.tenant!r}, page size {self.profile.page_size}, TP "
                f"size {self.profile.tp_size}) under {self.store.root}: is the server using "
                "this root?" + (f" (its extra config: {unread})" if unread else "")
            )
        self.hybrid = any(rank.states for rank in self.ranks)
        self.interval = checkpoint_interval(self.profile.page_size)
        self.request = _request_fields(extra_key, cache_salt)
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
            keys = keys[: grid_floor(len(ids), self.interval) // self.profile.page_size]
        return readiness(self.store, self.ranks, keys, len(ids), self.profile.page_size)

    def probe(self, seen: list[tuple[Document, Readiness]]) -> Probe:
        threshold = self.profile.prefetch_threshold
        for document, state in seen:
            length = probe_length(state, self.profile.page_size, threshold)
            if length:
                ids = self.ids(document)
                return send_probe(self.target, document.name, ids, length, self.request)
        return skipped(threshold)

    def close(self) -> None:
        self.store.close()


def _is_complete(seen: Readiness, expected_points) -> bool:
    return seen.pages_stored == seen.pages_expected and set(expected_points) <= set(
        seen.checkpoints
    )


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
        if _is_complete(seen, expected_points) and time.monotonic() - since >= QUIET_S:
            return seen
        if time.monotonic() >= deadline:
            return seen
        time.sleep(POLL_S)


def _pin(session: _Session, ids, document: str, report: WarmReport) -> dict:
    keys = session.keys(ids)[: report.pages_stored]
    state_keys = [keys[point // session.profile.page_size - 1] for point in report.checkpoints]
    totals = {"pinned_records": 0, "already_pinned_records": 0, "pinned_bytes": 0}
    missing, refused = [], []
    for rank in session.ranks:
        for namespace, wanted in [(rank.kv, keys)] + [(ns, state_keys) for ns in rank.states]:
            if not wanted:
                continue
            result = session.store.pin(namespace, wanted, document)
            for name in totals:
                totals[name] += int(getattr(result, name, 0) or 0)
            missing += list(getattr(result, "missing_keys", []) or [])
            refused += list(getattr(result, "refused_keys", []) or [])
    return totals | {"missing_keys": len(missing), "refused_keys": len(refused)}


def _warm_one(session: _Session, document: Document, *, check, retries, wait_s, every):
    started = time.monotonic()
    ids = session.ids(document)
    page = session.profile.page_size
    plan = prefill_plan(len(ids), session.interval, every) if session.hybrid else [len(ids)]
    expected_points = (
        [(p + 1) * page for p in state_pages(plan, session.interval, page)]
        if session.hybrid
        else []
    )
    seen = session.readiness(ids)
    requests = attempts = 0
    while not check and attempts <= retries and not _is_complete(seen, expected_points):
        if attempts:
            session.target.flush()  # device and host tiers: the resend recomputes
        for length in plan:
            session.target.prefill(ids[:length], session.request)
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
    return report, seen


def warm(
    target,
    documents: Iterable,
    *,
    root: str | None = None,
    tenant: str | None = None,
    pin: bool = False,
    sections: bool = False,
    check: bool = False,
    probe: bool = True,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    retries: int = DEFAULT_RETRIES,
    wait_s: float = DEFAULT_WAIT_S,
    checkpoint_every: int = 0,
    timeout_s: float = DEFAULT_DEADLINE_S,
    root_pin_limit: bool = False,
    on_document: Callable[[WarmReport], None] | None = None,
) -> list[WarmReport]:
    """Warms each document into the store through `target` (a server URL or an
    `sglang.Engine`). `root` defaults to the server's own; `tenant` to the server's. With
    `check`, only reports what a request would restore now (nothing is sent but /tokenize and,
    with `probe`, one probe: warming/probe.py). `timeout_s` bounds each call to a server. A pin
    obeys the server's pin limit, read from its extra config; when that cannot be read here,
    warm refuses (ServerError) unless `root_pin_limit`: then the root's limit applies. Returns
    one report per document (per section with `sections`); `.complete` says whether every page
    (and, for a hybrid, every planned checkpoint) is in the store."""
    session = _Session(
        target,
        root,
        tenant,
        writable=pin and not check,
        extra_key=extra_key,
        cache_salt=cache_salt,
        timeout_s=timeout_s,
        root_pin_limit=root_pin_limit,
    )
    policy = session.profile.write_policy
    if not check and policy and not str(policy).startswith("write_through"):
        log.warning(
            "galahad warm: the server's --hicache-write-policy is %s: its pages reach the store "
            "only when evicted from host memory, so warm may wait out --wait and its retries; "
            "use write_through",
            policy,
        )
    try:
        reports, seen = [], []
        for document in load_documents(documents, sections, session.target, session.profile):
            report, state = _warm_one(
                session,
                document,
                check=check,
                retries=retries,
                wait_s=wait_s,
                every=checkpoint_every,
            )
            if pin and not check:
                report.pinned = _pin(session, document.token_ids, document.name, report)
            reports.append(report)
            seen.append((document, state))
            if on_document is not None:
                on_document(report)
        if check and probe:
            verdict = session.probe(seen)
            for report in reports:
                report.probe = verdict
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
    probe: bool = True,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    timeout_s: float = DEFAULT_DEADLINE_S,
) -> list[WarmReport]:
    """How many tokens of each document a request would restore now, from the store
    (`restorable_tokens`; `continuation_tokens` for a request that continues it), and, with
    `probe`, whether the server restores now (`report.probe`, the same for every report)."""
    return warm(
        target,
        documents,
        root=root,
        tenant=tenant,
        sections=sections,
        check=True,
        probe=probe,
        extra_key=extra_key,
        cache_salt=cache_salt,
        timeout_s=timeout_s,
    )
