"""Warm a corpus into the store through a running SGLang server, and say what is ready: the
library behind `galahad warm`/`ready` and `hicache_galahad.warm()`/`ready()`.

    reports = hicache_galahad.warm(target, ["handbook.md"], root="/var/lib/galahad", pin=True)
    states = hicache_galahad.ready(target, ["handbook.md"], root="/var/lib/galahad")

`target` is a server URL or an `sglang.Engine`. `warm` tokenizes each document (the server's
/tokenize, or the engine's tokenizer), sends it as a prompt-only request (token ids, one output
token), waits until the server's write-through has backed its pages up, then checks that the
store holds every page by computing SGLang's page keys itself (keys.py) in every namespace the
server writes (namespaces.py); missing pages are retried (flush, resend) a bounded number of
times. A hybrid is sent on its checkpoint grid (checkpoint/prefill.py). `ready` reports, from
the store, how many tokens a request would restore now (readiness.py), and asks the server
once whether it restores at all (probe.py). No torch or SGLang here: HTTP is the standard
library's, every call bounded (http.py).

Modules: keys.py (SGLang's page keys), http.py (one bounded HTTP call), profile.py (what the
server reports), targets.py (a URL or an Engine), namespaces.py (this server's namespaces),
documents.py (what to warm), readiness.py (what the store would restore), probe.py (whether the
server restores now), run.py (`warm` and `ready`).
"""

from .documents import Document
from .keys import page_keys
from .probe import Probe
from .run import WarmReport, ready, warm

__all__ = ["Document", "Probe", "WarmReport", "page_keys", "ready", "warm"]
