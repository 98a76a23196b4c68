"""Offline page-cache simulators for bench_cache: an exact LRU and Belady's optimum, under
SGLang's restore rule (pure Python: no torch, no SGLang).

A request is the chained page keys of one prompt (`Request`). SGLang asks storage for the
first `query_pages` of them (floor((tokens - 1) / page_tokens): never the whole prompt, so the
last token is always computed), restores only the leading run the store holds (page k is
useless without pages 0..k-1), and then writes back every full page it did not restore.
`replay` drives a policy through that sequence and returns the restored pages per request.

- `ExactLru`: one recency list over pages. A restore touches its run head first (as reads of
  the run do, page by page); a write of a page already held touches it (SGLang's HiCacheFile
  does the same); a new page goes in at the recent end and the least recently used page leaves.
- `Belady`: the offline optimum (MIN with bypass): when full, of the held pages and the one
  arriving, the one whose next request is farthest away is not kept (never asked again: first
  to go); ties go to the deeper page of its chain. A page's prefix is asked by every request
  that asks the page, so its next use is never later than the page's: the held set stays
  closed under prefixes, every held page it is asked for is restorable, and its restored pages
  are the most any policy that sees the same requests can restore.
- `LeavesFirstLru`: the exact LRU, but every use of a chain makes its head the most recent
  (a restore touches its run deepest page first, a write adds its pages deepest first and
  then touches the run again), as SGLang's radix tree evicts leaves first: a chain is
  evicted from its tail, and what is held is a leading run (whenever a request fits). An online policy (it sees no future): what LRU can reach when it
  knows the chains, beside Belady's limit.
- `Unbounded`: keeps everything (the ceiling the trace allows at all).
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hicache_galahad.warming.keys import page_keys

NEVER = float("inf")


@dataclass(frozen=True)
class Request:
    """One prompt as storage sees it: `keys` names every full page (chained), SGLang asks for
    the first `query_pages`."""

    keys: tuple[str, ...]
    query_pages: int
    prompt_tokens: int


def request_of(token_ids: Sequence[int], page_tokens: int) -> Request:
    """SGLang's page keys of a prompt (the project's `page_keys`, equal to SGLang's
    `get_storage_hash_str` chain) and how many of them a prefetch asks for."""
    keys = tuple(page_keys(list(token_ids), page_tokens))
    query = max(0, (len(token_ids) - 1) // page_tokens)
    return Request(keys=keys, query_pages=query, prompt_tokens=len(token_ids))


class ExactLru:
    """An exact page-level LRU of `capacity_pages` pages."""

    name = "exact LRU (sim)"

    def __init__(self, capacity_pages: int):
        self.capacity_pages = capacity_pages
        self._pages: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def restore(self, index: int, request: Request) -> int:
        run = leading_run(self._pages, request.keys[: request.query_pages])
        for key in request.keys[:run]:
            self._pages.move_to_end(key)
        return run

    def write(self, index: int, request: Request, restored: int) -> None:
        self._admit(request.keys[restored:])

    def _admit(self, keys) -> None:
        """Each key made the most recent in turn, the least recent evicted past capacity."""
        for key in keys:
            if key in self._pages:
                self._pages.move_to_end(key)
                continue
            self._pages[key] = None
            while len(self._pages) > self.capacity_pages:
                self._pages.popitem(last=False)


class LeavesFirstLru(ExactLru):
    """ExactLru whose every use of a chain leaves its head the most recent."""

    name = "LRU, leaves first (sim)"

    def restore(self, index: int, request: Request) -> int:
        run = leading_run(self._pages, request.keys[: request.query_pages])
        for key in reversed(request.keys[:run]):
            self._pages.move_to_end(key)
        return run

    def write(self, index: int, request: Request, restored: int) -> None:
        self._admit(reversed(request.keys[restored:]))
        for key in reversed(request.keys[:restored]):  # the run's head stays the most recent
            if key in self._pages:
                self._pages.move_to_end(key)


class Unbounded:
    """Every page ever written is kept."""

    name = "unbounded (sim)"

    def __init__(self, capacity_pages: int = 0):
        self._pages: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._pages

    def restore(self, index: int, request: Request) -> int:
        return leading_run(self._pages, request.keys[: request.query_pages])

    def write(self, index: int, request: Request, restored: int) -> None:
        self._pages.update(request.keys[restored:])


class Belady:
    """Belady's MIN with bypass over the whole trace (it must see `requests` in advance)."""

    name = "Belady (sim)"

    def __init__(self, capacity_pages: int, requests: Sequence[Request]):
        self.capacity_pages = capacity_pages
        self._asked_at: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            for key in request.keys[: request.query_pages]:
                self._asked_at.setdefault(key, []).append(index)
        self._held: dict[str, tuple[float, int]] = {}  # key -> (next use, depth)
        self._farthest: list[tuple[float, int, str]] = []  # (-next use, -depth, key), lazy

    def __contains__(self, key: str) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    def _next_use(self, key: str, after: int) -> float:
        uses = self._asked_at.get(key, ())
        position = bisect.bisect_right(uses, after)
        return uses[position] if position < len(uses) else NEVER

    def _hold(self, key: str, next_use: float, depth: int) -> None:
        self._held[key] = (next_use, depth)
        heapq.heappush(self._farthest, (-next_use, -depth, key))

    def _peek_farthest(self) -> tuple[float, int, str]:
        while True:
            negative_use, negative_depth, key = self._farthest[0]
            if self._held.get(key) == (-negative_use, -negative_depth):
                return -negative_use, -negative_depth, key
            heapq.heappop(self._farthest)

    def restore(self, index: int, request: Request) -> int:
        asked = request.keys[: request.query_pages]
        run = leading_run(self._held, asked)
        for depth, key in enumerate(asked):
            if key in self._held:  # this use is spent: the next one is later
                self._hold(key, self._next_use(key, index), depth)
        return run

    def write(self, index: int, request: Request, restored: int) -> None:
        for depth in range(restored, len(request.keys)):
            key = request.keys[depth]
            if key in self._held:
                continue
            next_use = self._next_use(key, index)
            if len(self._held) >= self.capacity_pages:
                if next_use == NEVER or self.capacity_pages == 0:
                    continue
                far_use, far_depth, far_key = self._peek_farthest()
                if (next_use, depth) >= (far_use, far_depth):
                    continue  # the arriving page is the one not to keep
                heapq.heappop(self._farthest)
                del self._held[far_key]
            self._hold(key, next_use, depth)


def leading_run(held, keys: Iterable[str]) -> int:
    """How many of `keys`, from the first, are in `held`."""
    run = 0
    for key in keys:
        if key not in held:
            break
        run += 1
    return run


def replay(policy, requests: Sequence[Request]) -> list[int]:
    """Restored pages per request, as SGLang would get them from `policy`."""
    restored_pages = []
    for index, request in enumerate(requests):
        restored = policy.restore(index, request)
        policy.write(index, request, restored)
        restored_pages.append(restored)
    return restored_pages
