"""The package tree is the architecture: the import rules between hicache_galahad's packages,
checked on the code's own imports (read with `ast`), and the packages that must not need torch
or SGLang imported in a subprocess where both fail to import.

The rules are written here, once (PACKAGES); docs/ARCHITECTURE.md shows them in its
'Packages' table, which must say the same, and lists every module (for the picture that
docs/architecture.py draws). A new package or top-level module fails these tests until it is
given a rule. Every module has a docstring, and none is over 450 lines nor any class over 300.
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
TOP = "hicache_galahad"

# package -> (the packages it may import besides itself, whether it may import torch/sglang).
# A package is a folder of hicache_galahad/, a top-level module of it (errors, units), the
# entry points (`hicache_galahad/__init__.py`: "(root)", `__main__.py`) or `checkpoint/`.
# Listed from the bottom layer up; imports flow one way, towards the top of this table.
BASE = ("errors", "units")
PACKAGES: dict[str, tuple[tuple[str, ...], bool]] = {
    "errors": ((), False),
    "units": ((), False),
    "checkpoint": ((), False),
    "config": (BASE, False),
    "record": (BASE, False),
    "telemetry": (BASE, False),
    "store": (("config", "record", "telemetry", *BASE), False),
    "tier": (("store", "config", "record", "telemetry", *BASE), False),
    "blaise": (("store", "record", *BASE), False),
    "warming": (("blaise", "store", "config", "record", "checkpoint", *BASE), False),
    "ops": (("warming", "blaise", "store", "config", "record", "telemetry", *BASE), False),
    "serving": (
        ("tier", "store", "config", "record", "telemetry", "checkpoint", *BASE),
        True,
    ),
    "__main__": (("ops",), False),
}
ROOT_INIT = "(root)"  # hicache_galahad/__init__.py: imports only inside functions (lazily)
HEAVY = ("torch", "sglang")


# ----------------------------------------------------------------------------- the code


def code_modules() -> list[str]:
    return sorted(
        path.relative_to(ROOT).as_posix()
        for top in (TOP, "checkpoint")
        for path in (ROOT / top).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def package_of(path: str) -> str:
    """hicache_galahad/store/reader.py -> store; hicache_galahad/errors.py -> errors;
    hicache_galahad/__init__.py -> (root); checkpoint/hits.py -> checkpoint."""
    parts = path.removesuffix(".py").split("/")
    if parts[0] == "checkpoint":
        return "checkpoint"
    if parts == [TOP, "__init__"]:
        return ROOT_INIT
    return parts[1]


def _module_file(dotted: str) -> str | None:
    base = dotted.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if (ROOT / candidate).is_file():
            return candidate
    return None


def imports_of(path: str) -> list[tuple[str, bool, int]]:
    """(what a module imports: a module file of this project or a top-level package outside
    the standard library, whether only inside a function, line)."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=path)
    dotted = path.removesuffix(".py").replace("/", ".")
    package = dotted.removesuffix(".__init__") if path.endswith("__init__.py") else dotted
    if not path.endswith("__init__.py"):
        package = package.rpartition(".")[0]
    found = []

    def add(target: str, lazy: bool, line: int) -> None:
        top = target.split(".")[0]
        if top == "__future__" or top in sys.stdlib_module_names:
            return
        if top in (TOP, "checkpoint"):
            file = _module_file(target)
            assert file is not None, f"{path}:{line} imports {target}, which is not a module"
            found.append((file, lazy, line))
        else:
            found.append((top, lazy, line))

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, inner, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (child.level - 1)]
                    base = ".".join(parts + ([child.module] if child.module else []))
                else:
                    base = child.module
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    add(submodule if _module_file(submodule) else base, inner, child.lineno)
            visit(child, inner)

    visit(tree, False)
    return found


# ----------------------------------------------------------------------------- the rules


def test_every_module_is_in_a_package_with_a_rule():
    unknown = sorted(
        path
        for path in code_modules()
        if package_of(path) not in PACKAGES and package_of(path) != ROOT_INIT
    )
    assert not unknown, f"modules outside the packages of the rules (give them one): {unknown}"


def test_every_package_says_what_it_holds():
    """Each package's __init__.py opens with a docstring (the package's job)."""
    silent = []
    for path in code_modules():
        if path.endswith("/__init__.py"):
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            if not ast.get_docstring(tree):
                silent.append(path)
    assert not silent, f"packages without a docstring: {silent}"


def test_imports_follow_the_package_rules():
    wrong = []
    for path in code_modules():
        package = package_of(path)
        allowed, heavy = PACKAGES.get(package, ((), False))
        for target, lazy, line in imports_of(path):
            where = f"{path}:{line}"
            if target in HEAVY:
                if not heavy:
                    wrong.append(f"{where} ({package}) imports {target}")
                continue
            if not target.endswith(".py"):
                continue  # a package outside the project
            other = package_of(target)
            if package == ROOT_INIT:
                if not lazy:
                    wrong.append(f"{where}: the package root imports {target} at import time")
            elif other != package and other not in allowed:
                wrong.append(f"{where} ({package}) imports {target} ({other})")
    assert not wrong, "imports against the package rules:\n" + "\n".join(wrong)


def test_the_operators_command_uses_the_stores_public_verbs():
    """ops/ (the galahad command) and warming/ (warm and ready) reach the store through
    RecordStore's verbs, never its parts (layout, reader, codec, ...); only the record-file
    type of a scan is named."""
    allowed = {f"{TOP}/store/__init__.py", f"{TOP}/store/record_store.py"}
    wrong = []
    for path in code_modules():
        if package_of(path) not in ("ops", "warming"):
            continue
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("store"):
                names = {alias.name for alias in node.names}
                if node.module == "store.layout" and names == {"FileEntry"}:
                    continue
                if node.module != "store":
                    wrong.append(f"{path}:{node.lineno} imports {node.module}")
        for target, _, line in imports_of(path):
            inside = target.startswith(f"{TOP}/store/") and target not in allowed
            if inside and not target.endswith("/layout.py"):  # FileEntry, checked above
                wrong.append(f"{path}:{line} imports {target}")
    assert not wrong, "ops/ reaching into the store's parts:\n" + "\n".join(sorted(set(wrong)))


def test_the_rules_have_no_cycle():
    done: set[str] = set()

    def walk(package: str, trail: tuple[str, ...]) -> None:
        assert package not in trail, f"cycle in the package rules: {trail + (package,)}"
        if package in done:
            return
        for other in PACKAGES[package][0]:
            walk(other, trail + (package,))
        done.add(package)

    for package in PACKAGES:
        walk(package, ())


def test_no_import_cycle_between_modules():
    """No import cycle between any two modules, inside a package or across: imports made
    inside functions count too (a cycle hidden in a function is still two modules that need
    each other). A module's import of its own package's __init__ (its public names) is left
    out: that __init__ imports the module, which Python resolves."""
    graph = {
        path: sorted({target for target, _, _ in imports_of(path) if target.endswith(".py")})
        for path in code_modules()
    }
    done: set[str] = set()
    cycles = []

    def walk(path: str, trail: list[str]) -> None:
        if path in trail:
            cycles.append(" -> ".join(trail[trail.index(path) :] + [path]))
            return
        if path in done:
            return
        for target in graph.get(path, []):
            if target.endswith("/__init__.py") and path.startswith(target.rpartition("/")[0] + "/"):
                continue  # a module reaching its own package's __init__ (its public names)
            walk(target, trail + [path])
        done.add(path)

    for path in graph:
        walk(path, [])
    assert not cycles, "import cycles between modules:\n" + "\n".join(sorted(set(cycles)))


def _torch_free_modules() -> list[str]:
    names = []
    for path in code_modules():
        package = package_of(path)
        if path.endswith("/__main__.py"):
            continue  # runs its program when imported; its imports are checked above
        if package == ROOT_INIT or not PACKAGES[package][1] or path.endswith("/__init__.py"):
            names.append(path.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    return names


def test_packages_without_torch_import_without_torch_and_sglang():
    """Every module of a package that may not import torch or SGLang, the package root and
    each package's __init__ (so `galahad` and `import hicache_galahad` work without them)
    import in a process where `import torch` and `import sglang` fail."""
    names = _torch_free_modules()
    assert f"{TOP}.ops.cli" in names and f"{TOP}.store.reader" in names
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
        f"modules that need torch or sglang:\n{result.stdout}{result.stderr[-2000:]}"
    )


# ----------------------------------------------------------------------------- module sizes

MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 300
GENERATED = {f"{TOP}/blaise/attributes_data.py"}  # data written by a script, not read as code


def test_every_module_has_a_docstring():
    """Each module of hicache_galahad/ and checkpoint/ opens with a docstring (its one job)."""
    missing = [
        path
        for path in code_modules()
        if not ast.get_docstring(ast.parse((ROOT / path).read_text(encoding="utf-8")))
    ]
    assert not missing, f"modules without a docstring: {missing}"


def test_no_module_or_class_is_too_long():
    """No module of hicache_galahad/ or checkpoint/ over MAX_MODULE_LINES lines (generated
    data aside), and no class, nested ones included, over MAX_CLASS_LINES."""
    too_long = []
    for path in code_modules():
        text = (ROOT / path).read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES and path not in GENERATED:
            too_long.append(f"{path}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                class_lines = node.end_lineno - node.lineno + 1
                if class_lines > MAX_CLASS_LINES:
                    too_long.append(f"{path}: class {node.name} {class_lines} lines")
    assert not too_long, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_CLASS_LINES} a class:\n"
        + "\n".join(too_long)
    )


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


def test_the_document_states_the_rules():
    """docs/ARCHITECTURE.md's 'Packages' table: `package` | job | may import | torch."""
    documented = {}
    for row in _rows("Packages"):
        assert len(row) == 4, f"Packages row with {len(row)} cells (want 4): {row}"
        name, job, may_import, heavy = row
        name = name.strip("`").removeprefix(f"{TOP}/").rstrip("/").removesuffix(".py")
        assert job, f"package {name} has no job in {DOC.name}"
        allowed = (
            ()
            if may_import == "(nothing)"
            else tuple(item.strip("`") for item in may_import.split(", "))
        )
        documented[name] = (set(allowed), heavy == "yes")
    expected = {name: (set(allowed), heavy) for name, (allowed, heavy) in PACKAGES.items()}
    assert documented == expected, (
        f"{DOC.name} 'Packages' table differs from the rules of {Path(__file__).name}"
    )


def test_the_document_lists_every_module():
    documented = {row[0].strip("`") for row in _rows("Modules")}
    actual = set(code_modules())
    missing, gone = sorted(actual - documented), sorted(documented - actual)
    assert not missing and not gone, (
        f"{DOC.relative_to(ROOT)} module table is out of date: add {missing}, remove {gone} "
        "(then regenerate docs/architecture.png with .venv/bin/python docs/architecture.py)"
    )


@pytest.mark.parametrize("source", [DOC, FIGURE_SOURCE], ids=lambda path: path.name)
def test_named_module_files_exist(source):
    """Every `name.py` the document or the picture's source mentions is a file: a path from
    the repository root or from hicache_galahad/, or a module's own name found in the tree
    (reader.py, mooncake/tier.py)."""
    files = {path.relative_to(ROOT).as_posix() for path in ROOT.glob(f"{TOP}/**/*.py")}

    def exists(name: str) -> bool:
        if (ROOT / name).is_file() or (ROOT / TOP / name).is_file():
            return True
        return any(file.endswith("/" + name) for file in files)

    missing = sorted(
        {
            name
            for name in re.findall(r"(?<![\w./-])((?:\w+/)*\w+\.py)\b", source.read_text("utf-8"))
            if not exists(name)
        }
    )
    assert not missing, f"{source.relative_to(ROOT)} names files that do not exist: {missing}"
