"""The operator's command, `galahad` (cli.py; also `python -m hicache_galahad`): the commands
only. stats, verify, purge, gc, inspect, fingerprint, demo and blaise (cli.py, printing what
reports.py computes as data), unpin (pins_cli.py), warm and ready (warm_cli.py, over the warming
package); what they share (exit statuses, opening a store, tables) is common.py.

Needs neither torch nor SGLang. Uses the stores' public verbs; imports `store`, `record`,
`config`, `warming`, the project's errors and (for `galahad blaise`, on first use) `blaise`.
"""
