"""The operator's command, `galahad` (cli.py; also `python -m hicache_galahad`): stats, verify,
purge, gc, inspect, fingerprint, demo and blaise, printing what reports.py computes as data.

Needs neither torch nor SGLang. Uses the stores' public verbs; imports `store`, `record`,
`config`, the project's errors and (for `galahad blaise`, on first use) `blaise`.
"""
