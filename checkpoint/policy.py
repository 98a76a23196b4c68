"""Which prefixes a TRAILING_PAGES pool can restore (SGLang's hit policy for a state pool).

The checkpoint rule itself (docs/CHECKPOINTS.md: a restore resumes at a checkpoint position
B <= N - 1 where the KV of [0, B) and the state after exactly B tokens are present) is
SGLang's scheduler's; tests/support/checkpoints.py states it as the oracle the tests hold the
backend's answers to. The backend applies only `trailing_pages_hits` (through hits.py).

Page indices are zero-based. Page ``i`` covers tokens ``[i*P, (i+1)*P)``; the state
"of page i" is the one after ``(i + 1) * P`` tokens, stored under page i's hash, as
SGLang keys a Mamba checkpoint by ``node.hash_value[-1]``.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import NamedTuple, TypeAlias

PagesWithState: TypeAlias = Container[int] | Callable[[int], bool]
"""Pages whose state is intact: a container of page indices (``in`` is used) or a
predicate ``has_state(page_index) -> bool`` (anything callable is treated as one)."""


def _state_predicate(pages_with_state: PagesWithState) -> Callable[[int], bool]:
    if callable(pages_with_state):
        return pages_with_state
    return pages_with_state.__contains__


def _require_non_negative_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}={value!r}: must be a non-negative integer")


class TrailingPagesHits(NamedTuple):
    """What SGLang's ``HiCacheFile.batch_exists_v2`` derives for one TRAILING_PAGES pool."""

    restorable_prefix_pages: list[int]
    """Ascending prefix lengths (pages) whose trailing window is present; SGLang's
    ``PoolTransferResult.restorable_prefix_pages`` for KV plus this pool."""
    deepest_prefix_pages: int
    """The last element, or 0: the pool's ``extra_pool_hit_pages`` entry and
    ``kv_hit_pages`` when this is the only extra pool."""


def trailing_pages_hits(
    num_leading_kv_pages: int,
    pages_with_state: PagesWithState,
    num_trailing_keys: int,
) -> TrailingPagesHits:
    """Restorable prefix lengths under SGLang's TRAILING_PAGES policy, in pages.

    Exactly as SGLang 0.5.23 ``HiCacheFile.batch_exists_v2``: with
    ``window = max(1, num_trailing_keys)`` (``num_trailing_keys = len(transfer.keys)``,
    1 for Mamba), a prefix of ``p`` pages, ``1 <= p <= num_leading_kv_pages``, is
    restorable when every page in ``[max(0, p - window), p)`` has its state. Pass the
    leading KV run over all of ``keys`` as `num_leading_kv_pages`.

    This does not apply the checkpoint interval: filter with
    ``grid.is_checkpoint_position(p * grid.page_size_tokens)`` when only grid states count.
    Each page index below `num_leading_kv_pages` is queried once, in ascending order.
    """
    _require_non_negative_int("num_leading_kv_pages", num_leading_kv_pages)
    _require_non_negative_int("num_trailing_keys", num_trailing_keys)
    has_state = _state_predicate(pages_with_state)
    window = max(1, num_trailing_keys)
    restorable: list[int] = []
    present_run = 0  # consecutive pages with a state ending at the current page
    for page_index in range(num_leading_kv_pages):
        present_run = present_run + 1 if has_state(page_index) else 0
        prefix_pages = page_index + 1
        if present_run >= min(window, prefix_pages):
            restorable.append(prefix_pages)
    return TrailingPagesHits(restorable, restorable[-1] if restorable else 0)
