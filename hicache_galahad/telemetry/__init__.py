"""What the backend tells its operator while it runs: thread-safe counters and rate-limited
warnings (`metrics`), and those counters as Prometheus metrics at SGLang's /metrics
(`exporter`; prometheus_client imported on first use).

No torch, no SGLang, no file I/O. Imports nothing else of the project, so that every other
package may count.
"""
