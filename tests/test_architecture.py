"""The layout's rules hold: the core imports no framework, packages import only the layers below them, no cycle.

The contracts themselves are in pyproject.toml (``[tool.importlinter]``, also run by ``lint-imports``); the
drawing is docs/architecture.md.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import grimp

import admitgate.core
import admitgate.limit

ROOT = Path(__file__).resolve().parent.parent
#: Distributions the framework-free core must never load (the shell's, the backend's, the exporter's).
SHELL_ONLY = ("starlette", "redis", "prometheus_client", "httpx", "uvicorn")
#: ``import admitgate.core`` and then every module of the core and of the capacity estimators, by name: the import
#: statement, not importlib, so that ``-X importtime`` reports each of them.
IMPORT_THE_CORE = "\n".join(
    f"import {name}"
    for package in (admitgate.core, admitgate.limit)
    for name in [package.__name__, *(m.name for m in pkgutil.iter_modules(package.__path__, f"{package.__name__}."))]
)


def test_the_package_under_test_is_this_checkout() -> None:
    # grimp and import-linter find admitgate on sys.path: the contracts must be checked on this tree's code
    assert Path(admitgate.__file__).resolve().parent == ROOT / "admitgate"


def test_the_import_contracts_are_kept() -> None:
    # in a process of its own: import-linter configures logging (dictConfig), which would silence the
    # "admitgate" logger for every later test that reads its warnings
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True, no_logo=True))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_no_module_imports_one_that_imports_it_back() -> None:
    # every import counts, those under TYPE_CHECKING and inside functions included
    graph = grimp.build_graph("admitgate", cache_dir=None)
    cycles = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )
    assert not cycles


def test_importing_the_core_loads_no_framework() -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", IMPORT_THE_CORE],
                          capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
    loaded = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "admitgate.core.gate" in loaded and "admitgate.limit.capacity" in loaded  # the check saw the core
    assert [name for name in loaded if name.split(".")[0] in SHELL_ONLY] == []


#: The sizes the package keeps to: a module a reader holds at once, a function that does one job.
MODULE_LINES, FUNCTION_LINES = 500, 60


def test_no_module_over_500_lines_and_no_function_over_60() -> None:
    large, long = [], []
    for path in sorted((ROOT / "admitgate").rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(ROOT))
        if len(source.splitlines()) > MODULE_LINES:
            large.append(name)
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.end_lineno is None:
                continue
            if node.end_lineno - node.lineno + 1 > FUNCTION_LINES:
                long.append(f"{name}:{node.lineno} {node.name}")
    assert not large and not long, (large, long)
