"""Blaise's modules and classes stay small enough to read (issue 29): no module over 450
lines (the generated WordNet data aside), no class over 300."""

from __future__ import annotations

import ast
from pathlib import Path

BLAISE = Path(__file__).resolve().parent.parent / "hicache_galahad" / "blaise"
GENERATED = {"attributes_data.py"}


def test_no_blaise_module_over_450_lines_and_no_class_over_300():
    too_long = []
    for path in sorted(BLAISE.glob("*.py")):
        if path.name in GENERATED:
            continue
        text = path.read_text()
        if len(text.splitlines()) > 450:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 300:
                    too_long.append(f"{path.name}: class {node.name} of {lines} lines")
    assert too_long == []
