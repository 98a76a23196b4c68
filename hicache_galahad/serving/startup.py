"""Makes SGLang's storage-key hashing ready while the backend is constructed, so that the first
storage lookup after a start does not pay for it.

SGLang 0.5.23 hashes storage keys with a C++ extension (`hicache_hash_cpp`) that it builds and
loads lazily, in each process, on the first call (`sglang/srt/mem_cache/cpp_utils/
native_hash.py`, an `lru_cache`d loader), with ninja under one file lock per
`TORCH_EXTENSIONS_DIR` (`sglang/srt/utils/cpp_extension_loader.py`). That first call is a
prefetch thread's: while the build runs (8-20 s on 2 cores) or waits on the lock, SGLang's
default `timeout` prefetch policy gives up after about a second and recomputes, so a restart
that must build restores nothing for its first requests. SGLang constructs the storage backend
in each rank's scheduler before that scheduler reports ready, so hashing one page here makes
the server answer health only once lookups are ready.

Bounded and never raising: the hash runs in a daemon thread that the constructor waits for at
most `KEY_HASH_WAIT_S`; a failure is logged once and the server starts anyway (SGLang's own
code then tries again at its first lookup, as it would without this backend).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

# Long enough for a build on a loaded machine and for seven other ranks' loads queued on the
# lock before this one; short enough that a lock held by a stuck process does not hold the
# server's start for ever.
KEY_HASH_WAIT_S = 300.0

READY, FAILED, WAITING, UNAVAILABLE = "ready", "failed", "still waiting", "unavailable"


@dataclasses.dataclass(frozen=True)
class KeyHashStartup:
    """What the constructor found: `outcome` is READY, FAILED, WAITING (the bound passed; the
    thread goes on and SGLang's first lookup waits for it) or UNAVAILABLE (this SGLang has no
    native key hash); `waited_s` is how long the constructor waited for it."""

    outcome: str
    waited_s: float
    error: str = ""


class KeyHashWarmup:
    """Hashes one page with SGLang's own function in a daemon thread, started by `start()`;
    `wait()` collects the outcome (at most `wait_s` later) and logs it once."""

    def __init__(self, log: logging.Logger):
        self._log = log
        self._done = threading.Event()
        self._outcome = WAITING
        self._error = ""
        self._started_s = 0.0

    def start(self) -> KeyHashWarmup:
        self._started_s = time.monotonic()
        threading.Thread(target=self._run, name="galahad-key-hash", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            try:
                from sglang.srt.mem_cache.utils import get_hash_str
            except ImportError:
                self._outcome = UNAVAILABLE
                return
            get_hash_str([0, 1, 2, 3], None, page_size=4)  # builds/loads the extension
            self._outcome = READY
        except BaseException as error:  # a thread that must end quietly, whatever it met
            self._outcome, self._error = FAILED, f"{type(error).__name__}: {error}"
            cause = error.__cause__
            if cause is not None:
                self._error += f" ({type(cause).__name__}: {str(cause)[:300]})"
        finally:
            self._done.set()

    def wait(self, wait_s: float | None = None) -> KeyHashStartup:
        wait_s = KEY_HASH_WAIT_S if wait_s is None else wait_s
        self._done.wait(max(0.0, self._started_s + wait_s - time.monotonic()))
        waited_s = time.monotonic() - self._started_s
        outcome = self._outcome if self._done.is_set() else WAITING
        result = KeyHashStartup(outcome, round(waited_s, 3), self._error)
        if outcome == READY:
            self._log.info("galahad: SGLang's storage-key hash ready after %.2f s", waited_s)
        elif outcome == FAILED:
            self._log.warning(
                "galahad: SGLang's storage-key hash extension did not load (%s); the server "
                "starts, and SGLang tries again at its first storage lookup",
                self._error,
            )
        elif outcome == WAITING:
            self._log.warning(
                "galahad: SGLang's storage-key hash still not ready after %.0f s (a build, or "
                "another process holding its lock under TORCH_EXTENSIONS_DIR); the server "
                "starts, and storage lookups miss until it is ready",
                waited_s,
            )
        return result
