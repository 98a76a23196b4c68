"""Whether the server restores from the store now, not only whether the records are there:
one cheap request whose prompt is a stored prefix, and what the server says it took from
storage (`meta_info["cached_tokens_details"]["storage"]`).

The probe is the shortest stored prefix of a document that SGLang would look up and load, L
tokens (at least the server's `prefetch_threshold` and SGLang's load-back threshold of 10 tokens,
below which a prefix loaded into host memory is recomputed instead; page-aligned; a checkpoint
position for a hybrid), plus
the document's next token, so that the strict prefix is exactly L; one output token. A server
whose storage lookup fails or times out (e.g. while it builds SGLang's key-hash extension after
a start) computes the prompt instead: `not_restored`, which `galahad ready` reports apart from
records that are missing. Its footprint: the server computes one token and generates one, and
keeps the L tokens in its device cache, so a request right after gets them from memory rather
than from storage (the same tokens are reused either way); at most one new page is stored (the
probe's last tokens, when P <= 2). A prefix already in the server's memory is `in_memory`: the
storage path was not exercised, and a request of it is served anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from .readiness import Readiness

RESTORED, IN_MEMORY, NOT_RESTORED, SKIPPED = "restored", "in_memory", "not_restored", "skipped"
LOAD_BACK_THRESHOLD_TOKENS = 10  # SGLang 0.5.23 unified_radix_cache `load_back_threshold`


@dataclass
class Probe:
    verdict: str  # one of RESTORED, IN_MEMORY, NOT_RESTORED, SKIPPED
    document: str | None = None
    prompt_tokens: int = 0
    expected_tokens: int = 0  # L: what the store holds for the probe's prompt
    storage_tokens: int = 0  # what the server took from storage
    memory_tokens: int = 0  # what it found in its own device and host caches
    reason: str = ""

    @property
    def restores(self) -> bool:
        """False only when the server did not reuse what the store holds."""
        return self.verdict != NOT_RESTORED


def probe_length(seen: Readiness, page_size: int, prefetch_threshold: int) -> int:
    """L: the shortest stored prefix of the document a probe can ask for (0: none)."""
    threshold = max(prefetch_threshold, LOAD_BACK_THRESHOLD_TOKENS)
    if seen.hybrid:
        return min((point for point in seen.checkpoints if point >= threshold), default=0)
    pages = -(-threshold // page_size)
    return pages * page_size if 0 < pages <= seen.leading_pages else 0


def probe_prompt(ids: list[int], length: int) -> list[int]:
    """The first L tokens and one more (the document's next, or its last again)."""
    return ids[: length + 1] if len(ids) > length else ids[:length] + ids[length - 1 : length]


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def send_probe(target, document: str, ids: list[int], length: int, request: dict) -> Probe:
    """Sends the probe of `length` stored tokens and reads what the server reused."""
    prompt = probe_prompt(ids, length)
    meta = target.prefill(prompt, request)
    details = meta.get("cached_tokens_details")
    details = details if isinstance(details, dict) else {}
    storage = _count(details.get("storage"))
    memory = _count(details.get("device")) + _count(details.get("host"))
    if not details:  # SGLang reports no details when nothing was cached
        memory = _count(meta.get("cached_tokens"))
    probe = Probe(NOT_RESTORED, document, len(prompt), length, storage, memory)
    if storage + memory >= length:
        probe.verdict = RESTORED if storage else IN_MEMORY
        if not storage:
            probe.reason = "the prefix is in the server's memory: its storage was not asked"
    else:
        probe.reason = (
            f"the server reused {storage + memory} of the {length} stored tokens: its storage "
            "lookup failed or timed out (see its log; a first start may be building SGLang's "
            "key-hash extension)"
        )
    return probe


def skipped(prefetch_threshold: int) -> Probe:
    threshold = max(prefetch_threshold, LOAD_BACK_THRESHOLD_TOKENS)
    return Probe(
        SKIPPED,
        reason=f"no document has a stored prefix of {threshold} tokens (below the server's "
        "prefetch_threshold SGLang looks nothing up, below 10 tokens it loads nothing back)",
    )
