"""Helpers the tests and the benchmarks share: import them as `support.<module>` from tests/
(pytest puts tests/ on sys.path) or as `tests.support.<module>` from the repository root."""
