"""One counter registry: every name the code counts under is declared, with what it counts,
in telemetry/metrics.py: COUNTERS (and failed_<rule> for each rule of RULES) for the store,
the adapter and the tier, TIER_COUNTERS for the Mooncake client's own (tier/mooncake/). Read
from the code with `ast`, so a misspelt counter fails here instead of appearing as a new
counter that no one reads; a counter name built at run time (an f-string) is refused, except
through `metrics.failed`. A bug caught is counted by one rule, `metrics.count_bug`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hicache_galahad.telemetry import exporter, metrics

ROOT = Path(__file__).resolve().parent.parent / "hicache_galahad"
DECLARED = set(metrics.COUNTERS) | set(metrics.RULE_COUNTERS)
TIER_CLIENT = "tier/mooncake/"  # its `_counts` are the Mooncake client's: TIER_COUNTERS


def _registry(where: str, owner: str) -> set[str]:
    if where.startswith(TIER_CLIENT) and owner.endswith("_counts"):
        return set(metrics.TIER_COUNTERS)
    return DECLARED


def _names(node: ast.AST) -> list[str] | None:
    """The counter names an argument can be: constants, either side of an `a if c else b`;
    None when it is built at run time."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _names(node.body), _names(node.orelse)
        return None if body is None or orelse is None else body + orelse
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "failed":
        return []  # metrics.failed(rule): a declared rule counter, or a KeyError
    return None


def counted_names() -> tuple[dict[str, list[str]], list[str]]:
    """(name -> where it is counted, the calls whose name is built at run time); `where` is
    path:line, and `!` after it when the name is not in the registry of that counter set."""
    found: dict[str, list[str]] = {}
    built = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            owner = ast.unparse(node.func.value)
            if node.func.attr == "_on_event" and node.args:  # the budget's counters.add
                owner = "counters"
            elif not owner.endswith(("counters", "counts", "_counts")):
                continue
            registry = _registry(where, owner)
            if node.func.attr in ("add", "_on_event") and node.args:
                names = _names(node.args[0])
            elif node.func.attr == "add_many":
                names = []
                for keyword in node.keywords:
                    if keyword.arg is not None:
                        names.append(keyword.arg)
                    elif not (
                        isinstance(keyword.value, ast.Dict)
                        and all(_names(key) is not None for key in keyword.value.keys)
                    ):
                        names = None
                        break
            else:
                continue
            if names is None:
                built.append(where)
                continue
            for name in names:
                found.setdefault(name, []).append(where if name in registry else where + "!")
    return found, built


def test_every_counter_the_code_counts_is_declared():
    found, built = counted_names()
    assert len(found) > 30, "the scan found too few counters: is it reading the code?"
    unknown = {
        name: [site for site in where if site.endswith("!")]
        for name, where in sorted(found.items())
        if any(site.endswith("!") for site in where)
    }
    assert not unknown, f"counters not declared in telemetry/metrics.py: {unknown}"
    assert "budget_unreconciled" in found  # the budget's own counting is read too
    assert "put_no_space" in found and "mooncake_hits" in found
    assert not built, f"counter names built at run time (use metrics.failed): {built}"


def test_exported_counters_are_declared_and_rules_have_their_counters():
    assert set(exporter.COUNTERS) <= set(metrics.COUNTERS)
    assert metrics.failed("V13") == "failed_V13" and metrics.failed("M1") == "failed_M1"
    with pytest.raises(KeyError):
        metrics.failed("V17")


def test_the_rules_are_the_formats():
    from hicache_galahad.record import format as fmt

    assert {error.rule for error in fmt.ALL_ERRORS} | {"M1"} == set(metrics.RULES)


def test_a_bug_is_counted_by_one_rule():
    """`unexpected_errors` is counted by metrics.count_bug (counted, then a rate-limited
    warning with the traceback), nowhere by hand."""
    by_hand = [
        site
        for site in counted_names()[0]["unexpected_errors"]
        if not site.startswith("telemetry/metrics.py")
    ]
    assert by_hand == [], by_hand
