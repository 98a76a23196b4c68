"""The byte budget of a store root: a cap on all records and a free-space floor.

Pure policy over three collaborators, so it can be tested with fakes: the shared `Ledger`
(bytes claimed by every process), the `LruIndex` (the fallback order: records sampled, oldest
first) and an `Evictor` that keeps the shared order (fifo.py, through accounting.py) and
deletes what the policy chooses. Eviction never starts
unless deleting everything it can see could cover the shortfall: a ledger that over-counts
(leaked reservations, a damaged ledger) must fail a put, never empty the store. Pinned records
(store/pins/) are not evictable: a put that could only fit by evicting a pin fails
(counted in `no_space_pinned`), without evicting anything and without a recount.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from .eviction import LruIndex

PINNED_RESAMPLES = 8  # samples more when pinned records fill one, before refusing a put
# Eviction in the shared order frees room for the next put too, when that is at most a
# share of the cap (EVICT_AHEAD_SHARE, at most EVICT_AHEAD_MAX_BYTES): the files' blocks are
# freed in the background (reaper.py), so the next put finds room while the unlinks run, and
# a full store holds at most one put less than its cap.
EVICT_AHEAD_SHARE = 1 / 64
EVICT_AHEAD_MAX_BYTES = 16 << 20


class LedgerLike(Protocol):
    needs_rebuild: bool

    def seen_total(self) -> int: ...
    def reserve(self, amount: int, limit: int | None) -> bool: ...
    def settle(self, committed_bytes: int, released_bytes: int) -> None: ...
    def publish(self, dirname: str, items: list, link_all) -> int: ...


class Evictor(Protocol):
    def evict_quarantined(self) -> bool:
        """Deletes the oldest quarantined file; False when there is none."""

    def quarantined_bytes(self) -> int: ...

    def evict_in_order(self, want_bytes: int) -> tuple[int, int] | None:
        """Evicts at least `want_bytes` (when it can) in the order every process shares
        (fifo.py), in one locked section; (records, bytes) this process evicted (another
        may have deleted some first), None when that order has no victim (then the sampled
        index is the fallback)."""

    def wait_reaped(self) -> bool:
        """Waits (bounded) for evicted files still being unlinked, whose bytes the ledger
        holds until they are; False when there were none."""

    def enqueue(self, dirname: str, items: list, kept_bytes: int) -> None:
        """Enters a published batch into the shared order (called under the ledger's lock,
        inside Ledger.publish, after the links: `items` as given to publish)."""

    def remove(self, victim) -> int | None:
        """Deletes a victim of the index (location, size[, what the file was when sampled]);
        the bytes it freed, or None if it was already gone or changed since."""

    def load_unindexed(self) -> None:
        """Adds records that other processes wrote since the last scan to the index."""


class Budget:
    def __init__(
        self,
        ledger: LedgerLike,
        index: LruIndex,
        evictor: Evictor,
        *,
        max_bytes: int | None,
        min_free_bytes: int,
        free_bytes: Callable[[], int],
        rebuild: Callable[[], bool] = lambda: False,
        reclaim: Callable[[], bool] = lambda: False,
        on_event: Callable[[str, int], None] = lambda name, amount: None,
        pinned_bytes: Callable[[], int] = lambda: 0,
    ):
        self.ledger = ledger
        self.index = index
        self.evictor = evictor
        self.max_bytes = max_bytes
        self.min_free_bytes = min_free_bytes
        self._free_bytes = free_bytes
        self._rebuild = rebuild  # recounts the ledger from disk (rate-limited); True if it did
        self._reclaim = reclaim  # takes back reservations of dead processes; True if any
        self._on_event = on_event
        self._pinned_bytes = pinned_bytes  # held by pins (already out of index.total_bytes)
        self._pending_bytes = 0
        self._unsettled_kept_bytes = 0  # settles the ledger refused, retried with the next
        self._unsettled_released_bytes = 0
        self._pending_lock = threading.Lock()

    @property
    def pending_bytes(self) -> int:
        """Bytes this process has reserved for writes not yet published or abandoned."""
        with self._pending_lock:
            return self._pending_bytes

    def reserve(self, amount: int) -> bool:
        """Claims `amount` bytes, evicting as needed and possible: in the shared order
        (fifo.py) enough for the whole amount at once, else by the sampled index. The
        shortfall is the one the failed reserve saw (Ledger.seen_total: no locked read of
        its own); the next reserve, under the lock, decides."""
        if self.max_bytes is not None and amount > self.max_bytes:
            return False  # can never fit: evicting every record first would only lose them
        if self.ledger.needs_rebuild:
            self._rebuild()
        while not self.ledger.reserve(amount, self.max_bytes):
            if not self._evict_toward(lambda: self.ledger.seen_total() + amount - self.max_bytes):
                return False
        with self._pending_lock:
            self._pending_bytes += amount
        try:
            while self.min_free_bytes and self._free_shortfall() > 0:
                if not self._evict_toward(self._free_shortfall):
                    self.end_reservation(amount, keep=False)
                    return False
        except OSError:
            self.end_reservation(amount, keep=False)
            return False
        return True

    def publish(self, dirname: str, items: list, link_all) -> int:
        """Links a batch into place (`link_all()`, which returns the bytes it published) and
        counts it, in one ledger update (Ledger.publish); returns the bytes kept. The rest of
        the batch's reservation ends with settle. A ledger that cannot be written after the
        links: the kept bytes are carried into the next settle (OSError raised)."""

        def link_and_enqueue() -> int:
            kept = link_all()
            if kept:
                self.evictor.enqueue(dirname, items, kept)
            return kept

        try:
            kept = self.ledger.publish(dirname, items, link_and_enqueue)
        except OSError as error:
            kept = getattr(error, "kept", 0)
            with self._pending_lock:
                self._pending_bytes -= kept
                self._unsettled_kept_bytes += kept
            raise
        with self._pending_lock:
            self._pending_bytes -= kept
        return kept

    def end_reservation(self, amount: int, *, keep: bool) -> None:
        """Ends a reservation: kept when its record was published, else released."""
        self.settle(amount if keep else 0, 0 if keep else amount)

    def settle(self, kept_bytes: int, released_bytes: int) -> None:
        """Ends reservations of a whole batch at once (one ledger update): `kept_bytes` were
        published, `released_bytes` were not. If the ledger cannot be written (OSError), the
        amounts are carried into the next settle, so the ledger over-counts meanwhile (the
        safe side) and comes right once it can be written again."""
        with self._pending_lock:
            self._pending_bytes -= kept_bytes + released_bytes
            kept_bytes += self._unsettled_kept_bytes
            released_bytes += self._unsettled_released_bytes
            self._unsettled_kept_bytes = self._unsettled_released_bytes = 0
        if not (kept_bytes or released_bytes):
            return
        try:
            self.ledger.settle(kept_bytes, released_bytes)
        except OSError:
            with self._pending_lock:
                self._unsettled_kept_bytes += kept_bytes
                self._unsettled_released_bytes += released_bytes
            raise

    def _free_shortfall(self) -> int:
        return self.min_free_bytes - (self._free_bytes() - self.pending_bytes)

    def _evictable_bytes(self) -> int:
        return self.index.total_bytes + self.evictor.quarantined_bytes()

    def _evict_toward(self, shortfall: Callable[[], int]) -> bool:
        """Evicts one file toward covering `shortfall()` bytes; False (and nothing deleted)
        when everything evictable could not cover it."""
        if self._reclaim():  # space held by writers that died comes back before any eviction
            return True
        if self.evictor.wait_reaped():  # bytes already evicted come back: no more eviction
            return True
        missing = shortfall()
        if missing > self._evictable_bytes():
            # Either records other processes wrote are not indexed yet, or the ledger claims
            # bytes nothing on disk explains (leaked reservations, a damaged ledger): look
            # again, recount, and only then give up, without deleting anything.
            self.evictor.load_unindexed()
            pinned = self._pinned_bytes()
            if shortfall() > self._evictable_bytes() + pinned and self._rebuild():
                return True
            missing = shortfall()
            if missing > self._evictable_bytes():
                if pinned and missing <= self._evictable_bytes() + pinned:
                    self._on_event("no_space_pinned", 1)  # only evicting a pin would do
                else:
                    self._on_event("budget_unreconciled", 1)
                return False
        if self.evictor.evict_quarantined():
            return True
        missing = shortfall()  # (the reaper may have released some since the put's try)
        if missing <= 0:
            return True
        room = min(int((self.max_bytes or 0) * EVICT_AHEAD_SHARE), EVICT_AHEAD_MAX_BYTES)
        ahead = missing if missing <= room else 0  # (a cap of a few puts: exact)
        in_order = self.evictor.evict_in_order(missing + ahead)
        if in_order is not None:
            if in_order[0]:
                self._on_event("evictions", in_order[0])
                self._on_event("evicted_bytes", in_order[1])
                # The ledger holds the victims' bytes until they are unlinked: the reserve
                # that follows finds them free, rather than failing once more first.
                self.evictor.wait_reaped()
            return True
        victim = self.index.pop_oldest()
        if victim is None and self._pinned_bytes():
            # Pinned records fill the sample: look on (a few more bounded samples; the
            # sample's walk moves on), and refuse rather than recount: pins explain it.
            for _ in range(PINNED_RESAMPLES):
                self.evictor.load_unindexed()
                victim = self.index.pop_oldest()
                if victim is not None:
                    break
            else:
                self._on_event("no_space_pinned", 1)
                return False
        if victim is None:
            # No record found at all while the ledger still claims the bytes: records removed
            # behind the store's back (an operator's rm). Recount (rate-limited; cheap, since
            # the sample found nothing to count) rather than refuse every put from now on.
            return self._rebuild()
        freed = self.evictor.remove(victim)
        if freed is not None:  # else another process removed it (and released its bytes)
            self._on_event("evictions", 1)
            self._on_event("evicted_bytes", freed)
        return True
