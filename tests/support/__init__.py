"""Helpers of the tests: import them as `support.<module>` from tests/ (pytest puts tests/ on
sys.path) or as `tests.support.<module>` from the repository root. What the tests share with
the benchmarks lives in bench/ (sglang_server.py, mooncake_cluster.py)."""
