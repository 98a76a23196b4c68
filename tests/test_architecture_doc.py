"""docs/ARCHITECTURE.md against the code: its module table lists exactly the modules under
hicache_galahad/ and checkpoint/, with the imports they really have, every import follows the
group rules, the modules of groups that never import torch or sglang import without them, and
every module file the document or the picture's source names exists.

Pure Python: reads the sources with `ast`, and imports the torch-free modules in a subprocess
where torch and sglang cannot be imported.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
FIGURE_SOURCE = ROOT / "docs" / "architecture.py"
PACKAGES = ("hicache_galahad", "checkpoint")
LAZY = " (lazy)"


# ----------------------------------------------------------------------------- the document


def _section(heading: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    marker = f"\n## {heading}\n"
    assert marker in text, f"{DOC} has no '## {heading}' section"
    start = text.index(marker)
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _rows(heading: str) -> list[list[str]]:
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in _section(heading).splitlines()
        if line.startswith("|") and not line.startswith("|---")
    ]
    return rows[1:]  # without the header row


def documented_modules() -> dict[str, dict]:
    """path -> {"group", "imports": {name: lazy}} from the module table."""
    modules = {}
    for row in _rows("Modules"):
        assert len(row) == 4, f"module table row with {len(row)} cells (want 4): {row}"
        path, group, job, imports = row
        assert re.fullmatch(r"`[\w/]+\.py`", path), f"module cell is not a `path.py`: {path!r}"
        path = path.strip("`")
        assert path not in modules, f"{path} is listed twice in {DOC.name}"
        assert job, f"{path} has no job in {DOC.name}"
        names = {}
        if imports != "(none)":
            for item in imports.split(", "):
                match = re.fullmatch(r"`([\w/]+)`( \(lazy\))?", item)
                assert match, (
                    f"{path}: cannot read the import {item!r} (want `name` or `name` (lazy))"
                )
                names[match.group(1)] = match.group(2) is not None
        modules[path] = {"group": group, "imports": names}
    return modules


def group_rules() -> dict[str, tuple[set[str], bool]]:
    """group -> (the groups it may import besides itself, whether it may import torch/sglang)."""
    rules = {}
    for group, may_import, heavy in _rows("Module groups"):
        allowed = set() if may_import == "(nothing else)" else set(may_import.split(", "))
        assert heavy in ("yes", "never"), f"group {group}: torch/sglang must be 'yes' or 'never'"
        rules[group] = (allowed, heavy == "yes")
    for group, (allowed, _) in rules.items():
        assert allowed <= set(rules), f"group {group} may import unknown groups {allowed}"
    return rules


# ----------------------------------------------------------------------------- the code


def code_modules() -> list[str]:
    return sorted(
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def short_name(path: str) -> str:
    """hicache_galahad/store/record_store.py -> store; hicache_galahad/blaise/cli.py -> blaise/cli;
    checkpoint/hits.py -> checkpoint/hits; a package's __init__.py -> the package."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[0] == "hicache_galahad" and len(parts) > 1:
        parts = parts[1:]
    return "/".join(parts)


def _module_file(dotted: str) -> str | None:
    base = dotted.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if (ROOT / candidate).is_file():
            return candidate
    return None


def actual_imports(path: str) -> dict[str, bool]:
    """What a module imports, by short name (project modules) or top-level name (packages
    outside the standard library) -> whether only inside functions."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=path)
    dotted = path.removesuffix(".py").replace("/", ".")
    package = dotted.removesuffix(".__init__") if path.endswith("__init__.py") else dotted
    if not path.endswith("__init__.py"):
        package = package.rpartition(".")[0]
    found: dict[str, bool] = {}

    def add(target: str, lazy: bool) -> None:
        top = target.split(".")[0]
        if top == "__future__" or top in sys.stdlib_module_names:
            return
        if top in PACKAGES:
            file = _module_file(target)
            assert file is not None, f"{path} imports {target}, which is not a module here"
            name = short_name(file)
        else:
            name = top
        found[name] = found.get(name, True) and lazy

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, inner)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (child.level - 1)]
                    base = ".".join(parts + ([child.module] if child.module else []))
                else:
                    base = child.module
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    add(submodule if _module_file(submodule) else base, inner)
            visit(child, inner)

    visit(tree, False)
    return found


# ----------------------------------------------------------------------------- the checks


def test_module_table_lists_exactly_the_modules():
    documented = set(documented_modules())
    actual = set(code_modules())
    missing, gone = sorted(actual - documented), sorted(documented - actual)
    assert not missing and not gone, (
        f"{DOC.relative_to(ROOT)} module table is out of date: add {missing}, remove {gone} "
        "(then regenerate docs/architecture.png with .venv/bin/python docs/architecture.py)"
    )


def test_module_table_imports_match_the_code():
    wrong = []
    for path, entry in sorted(documented_modules().items()):
        if not (ROOT / path).is_file():
            continue  # reported by test_module_table_lists_exactly_the_modules
        actual = actual_imports(path)
        if entry["imports"] != actual:
            shown = ", ".join(
                f"`{name}`" + (LAZY if lazy else "") for name, lazy in sorted(actual.items())
            )
            wrong.append(f"{path}: the code imports {shown or '(none)'}")
    assert not wrong, f"{DOC.relative_to(ROOT)} module table, Imports column:\n" + "\n".join(wrong)


def test_imports_flow_one_way():
    modules = documented_modules()
    rules = group_rules()
    group_of = {short_name(path): entry["group"] for path, entry in modules.items()}
    wrong = []
    for path, entry in sorted(modules.items()):
        group = entry["group"]
        assert group in rules, f"{path}: group {group!r} has no row in 'Module groups'"
        allowed, heavy = rules[group]
        if not (ROOT / path).is_file():
            continue
        for name in actual_imports(path):
            if name in ("torch", "sglang") and not heavy:
                wrong.append(f"{path} ({group}) imports {name}")
            target = group_of.get(name)
            if target is not None and target != group and target not in allowed:
                wrong.append(f"{path} ({group}) imports {name} ({target})")
    assert not wrong, "imports against the group rules of docs/ARCHITECTURE.md:\n" + "\n".join(
        wrong
    )


def _torch_free_groups() -> list[str]:
    return [group for group, (_, heavy) in group_rules().items() if not heavy]


@pytest.mark.parametrize("group", _torch_free_groups())
def test_group_imports_without_torch_and_sglang(group):
    """Every module of a group marked 'never' (the pure group among them) imports in a process
    where `import torch` and `import sglang` fail. A `__main__.py` runs its program when
    imported: its imports are checked by test_imports_flow_one_way instead."""
    names = [
        path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for path, entry in sorted(documented_modules().items())
        if entry["group"] == group and (ROOT / path).is_file() and not path.endswith("/__main__.py")
    ]
    assert names, f"group {group} has no modules"
    script = (
        "import importlib, sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['sglang'] = None\n"
        "failed = []\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as error:\n"
        "        failed.append(f'{name}: {error!r}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (
        f"{group} modules need torch or sglang:\n{result.stdout}{result.stderr[-2000:]}"
    )


@pytest.mark.parametrize("source", [DOC, FIGURE_SOURCE], ids=lambda path: path.name)
def test_named_module_files_exist(source):
    """Every `name.py` the document or the picture's source mentions is a file: a module of
    hicache_galahad (reader.py, blaise/cli.py), or a path from the repository root."""
    missing = sorted(
        {
            name
            for name in re.findall(r"(?<![\w./-])((?:\w+/)*\w+\.py)\b", source.read_text("utf-8"))
            if not (ROOT / name).is_file() and not (ROOT / "hicache_galahad" / name).is_file()
        }
    )
    assert not missing, f"{source.relative_to(ROOT)} names files that do not exist: {missing}"
