"""What pyproject.toml declares matches what the package imports."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

from admitgate.config import tomllib

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def name(requirement: str) -> str:
    """The canonical distribution name of a requirement string (PEP 503)."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def top_level_imports(path: Path) -> set[str]:
    """Modules a file imports when it is imported (module level, outside try blocks), first component only."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__"}


def test_every_import_of_the_core_package_is_a_declared_dependency() -> None:
    every_name = "import admitgate as a, sys; [getattr(a, n) for n in a.__all__]; print(*sorted(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", every_name],
                            capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()  # fmt: skip
    core = [m.removeprefix("admitgate.") for m in loaded if m.startswith("admitgate.")]
    distributions = importlib.metadata.packages_distributions()
    declared = {name(r) for r in PROJECT["dependencies"]}
    for module in core:
        path = ROOT / "admitgate" / module.replace(".", "/")
        for imported in top_level_imports(path / "__init__.py" if path.is_dir() else path.with_suffix(".py")):
            # Python 3.10 maps only distributions that ship top_level.txt; the others are named as imported
            assert {name(d) for d in distributions.get(imported, [imported])} & declared, (module, imported)


def test_no_extra_lists_a_distribution_twice() -> None:
    for extra, requirements in PROJECT["optional-dependencies"].items():
        names = [name(r) for r in requirements]
        assert len(names) == len(set(names)), (extra, names)


def test_tomli_is_declared_where_tomllib_is_missing() -> None:
    assert "tomli>=1.1; python_version < '3.11'" in PROJECT["dependencies"]
    assert PROJECT["requires-python"] == ">=3.10"


def test_the_package_holds_no_lab_code() -> None:
    # the wheel is admitgate/**: no module of it may import a development-only distribution, even lazily,
    # and the estimator trials, the slowapi comparison and the test helpers live in bench/
    dev_only = (
        {name(r) for r in PROJECT["optional-dependencies"]["dev"]}
        - {name(r) for extra, rs in PROJECT["optional-dependencies"].items() if extra != "dev" for r in rs}
        - {name(r) for r in PROJECT["dependencies"]}
    )
    assert {"slowapi", "pytest", "hypothesis", "selenium"} <= dev_only
    modules = sorted((ROOT / "admitgate").rglob("*.py"))
    assert "trials" not in {path.stem for path in modules}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported = {node.module.split(".")[0]}
            else:
                continue
            assert not {name(i) for i in imported} & dev_only, (path.relative_to(ROOT), imported)
