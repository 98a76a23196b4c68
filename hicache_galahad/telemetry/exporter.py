"""The backend's counters as Prometheus metrics, served at SGLang's own /metrics.

SGLang (--enable-metrics) runs prometheus_client in multiprocess mode: metrics created in the
scheduler process, where the backend lives, are written to PROMETHEUS_MULTIPROC_DIR and served
by the HTTP process. The store's counters are copied into Prometheus counters (by difference)
whenever SGLang asks the backend for its storage metrics (get_stats, every scheduler cycle
with metrics on); batch latencies are observed as they happen. Metrics are created once per
process, whatever the number of backend instances.
"""

from __future__ import annotations

import threading

from .metrics import COUNTERS as REGISTRY
from .metrics import RULE_COUNTERS

# store counter -> (metric name, help)
COUNTERS = {
    "hits": ("galahad_hits_total", "Records read and verified"),
    "misses": ("galahad_misses_total", "Reads that found no usable record"),
    "corrupt": ("galahad_corrupt_total", "Records that failed a check (damage)"),
    "foreign": ("galahad_foreign_total", "Records of another key or namespace"),
    "quarantined": ("galahad_quarantined_total", "Damaged records moved to quarantine"),
    "evictions": ("galahad_evictions_total", "Records evicted by the budget"),
    "evicted_bytes": ("galahad_evicted_bytes_total", "Bytes evicted by the budget"),
    "get_bytes": ("galahad_read_bytes_total", "Page bytes served from storage"),
    "put_bytes": ("galahad_written_bytes_total", "Record bytes written"),
    "puts": ("galahad_puts_total", "Records published"),
    "puts_failed": ("galahad_write_failures_total", "Records that could not be stored"),
    "io_errors": ("galahad_io_errors_total", "I/O errors (EIO and the like)"),
    "no_space": ("galahad_no_space_total", "Writes refused for lack of budget or space"),
    "no_space_pinned": (
        "galahad_no_space_pinned_total",
        "Puts refused because only evicting pinned records would make room",
    ),
    "pins_refused": ("galahad_pins_refused_total", "Records not pinned: max_pinned_bytes reached"),
    "unexpected_errors": ("galahad_unexpected_errors_total", "Bugs caught (never raised)"),
}
assert set(COUNTERS) <= set(REGISTRY), "exported counters must be declared in metrics.py"
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

_LOCK = threading.Lock()
_METRICS: dict | None = None


def _metrics() -> dict:
    """The process's metric objects (created on first use)."""
    global _METRICS
    with _LOCK:
        if _METRICS is None:
            from prometheus_client import Counter, Gauge, Histogram

            labels = ("tenant",)
            _METRICS = {
                "counters": {
                    name: Counter(metric, doc, labels) for name, (metric, doc) in COUNTERS.items()
                },
                "failed_checks": Counter(
                    "galahad_failed_checks_total",
                    "Records that broke a docs/FORMAT.md rule, by rule",
                    (*labels, "rule"),
                ),
                # Every process on a root sees the same pins: the highest of the live ones.
                "pinned_bytes": Gauge(
                    "galahad_pinned_bytes",
                    "Bytes of this tenant's pinned records on the store root",
                    labels,
                    multiprocess_mode="livemax",
                ),
                # What the root's eviction order holds (store/order_stats.py): the same for
                # every process on the root, so the highest of the live ones.
                "eviction_queue_bytes": Gauge(
                    "galahad_eviction_queue_bytes",
                    "Bytes the eviction order's queue names: small (not used since written) "
                    "or main (used at least once)",
                    (*labels, "queue"),
                    multiprocess_mode="livemax",
                ),
                "eviction_ghost_keys": Gauge(
                    "galahad_eviction_ghost_keys",
                    "Keys evicted from the small queue lately (a used one comes back to main)",
                    labels,
                    multiprocess_mode="livemax",
                ),
                "restorable_share": Gauge(
                    "galahad_restorable_share",
                    "Estimated share of the records on the root a request can restore: on "
                    "every rank, no page missing before it in its batch (sampled; an upper "
                    "bound)",
                    labels,
                    multiprocess_mode="livemax",
                ),
                # Each process's own backlog: summed over the live ones.
                "reaper_backlog_bytes": Gauge(
                    "galahad_reaper_backlog_bytes",
                    "Bytes of evicted files this process has not unlinked yet",
                    labels,
                    multiprocess_mode="livesum",
                ),
                "batch_seconds": Histogram(
                    "galahad_batch_seconds",
                    "Duration of one batch of page reads (prefetch) or writes (backup)",
                    (*labels, "direction"),
                    buckets=LATENCY_BUCKETS_S,
                ),
            }
        return _METRICS


class Exporter:
    """Copies one store's counters into the process's Prometheus metrics."""

    def __init__(self, tenant: str):
        self._tenant = tenant
        self._metrics = _metrics()
        self._exported: dict[str, int] = {}
        self._lock = threading.Lock()

    def sync(self, snapshot: dict) -> None:
        with self._lock:
            for name, value in snapshot.items():
                delta = value - self._exported.get(name, 0)
                if delta <= 0:
                    continue
                self._exported[name] = value
                if name in COUNTERS:
                    self._metrics["counters"][name].labels(self._tenant).inc(delta)
                elif name in RULE_COUNTERS:
                    rule = RULE_COUNTERS[name]
                    self._metrics["failed_checks"].labels(self._tenant, rule).inc(delta)

    def set_pinned_bytes(self, value: int) -> None:
        """The tenant's pinned bytes (RecordStore.pins.cached_by_tenant(): a cached small read)."""
        self._metrics["pinned_bytes"].labels(self._tenant).set(value)

    def set_eviction_order(self, figures: dict | None, reaper_backlog_bytes: int) -> None:
        """The order's figures (OrderFigures.as_dict(); None: not read yet, or no log) and
        this process's reaper backlog."""
        self._metrics["reaper_backlog_bytes"].labels(self._tenant).set(reaper_backlog_bytes)
        if not figures or not figures.get("log"):
            return
        queues = self._metrics["eviction_queue_bytes"]
        queues.labels(self._tenant, "small").set(figures["small_bytes"])
        queues.labels(self._tenant, "main").set(figures["main_bytes"])
        self._metrics["eviction_ghost_keys"].labels(self._tenant).set(figures["ghost_keys"])
        if figures.get("restorable_share") is not None:
            share = self._metrics["restorable_share"]
            share.labels(self._tenant).set(figures["restorable_share"])

    def observe_batch(self, direction: str, seconds: float) -> None:
        self._metrics["batch_seconds"].labels(self._tenant, direction).observe(seconds)
