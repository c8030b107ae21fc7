"""Every third-party package that a module of gemma4_t4 imports when it is loaded is a declared base
dependency in pyproject.toml, so ``pip install gemma4-t4`` (or a notebook's ``[notebooks]`` install)
never meets a ``ModuleNotFoundError``. An extra's package (boto3, mcp, torch, vLLM, matplotlib...)
is imported inside the function that needs it, or at module level inside ``try: ... except
ImportError: raise Gemma4T4Error(..., fix="pip install 'gemma4-t4[EXTRA]'")`` naming an extra that
declares it; and no module that ``gemma4-t4`` or ``gemma4_t4.notebook`` loads at start-up is such an
extra-only module.

The checker is a function (:func:`undeclared_imports`) run on the real package and on synthetic
sources, so the test is seen to report an undeclared import."""

from __future__ import annotations

import ast
import functools
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import gemma4_t4

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(gemma4_t4.__file__).resolve().parent
NAME = "gemma4_t4"
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


@dataclass(frozen=True)
class ModuleImport:
    """One import of a third-party top-level module that runs when its module is loaded."""

    module: str  # the gemma4_t4 module (or synthetic name) holding the import
    line: int
    name: str  # the imported top-level name, e.g. "yaml"
    extra_guard: str | None  # the extra a Gemma4T4Error names when this import fails, if any


@dataclass(frozen=True)
class Finding:
    module: str
    line: int
    name: str
    problem: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: import {self.name}: {self.problem}"


def declared(pyproject: Path = REPO / "pyproject.toml") -> tuple[set[str], dict[str, set[str]]]:
    """(base dependency names, extra -> dependency names), canonicalised."""
    project = tomllib.loads(pyproject.read_text())["project"]
    base = {canonicalize_name(Requirement(r).name) for r in project.get("dependencies", [])}
    extras = {
        extra: {canonicalize_name(Requirement(r).name) for r in reqs}
        for extra, reqs in project.get("optional-dependencies", {}).items()
    }
    return base, extras


@functools.cache
def installed_distributions() -> Mapping[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, read once per run (it reads every installed
    distribution's file list: ~1 s each time)."""
    return metadata.packages_distributions()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _extra_named_by(handlers: list[ast.ExceptHandler]) -> str | None:
    """The extra named by ``except ImportError: raise Gemma4T4Error(..."gemma4-t4[EXTRA]"...)``."""
    for handler in handlers:
        caught = handler.type
        names = (
            {e.id for e in caught.elts if isinstance(e, ast.Name)}
            if isinstance(caught, ast.Tuple)
            else {caught.id}
            if isinstance(caught, ast.Name)
            else set()
        )
        if not names & IMPORT_ERRORS:
            continue
        for stmt in handler.body:
            if not (isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call)):
                continue
            func = stmt.exc.func
            if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")) != "Gemma4T4Error":
                continue
            for const in ast.walk(stmt.exc):
                if isinstance(const, ast.Constant) and isinstance(const.value, str) and "gemma4-t4[" in const.value:
                    return const.value.split("gemma4-t4[", 1)[1].split("]", 1)[0]
    return None


def module_level_imports(source: str, module: str) -> list[ModuleImport]:
    """Third-party imports that run when ``module`` is loaded: not inside a function, not under
    ``if TYPE_CHECKING``; class bodies and ``try``/``if`` blocks at module level count."""
    found: list[ModuleImport] = []

    def record(stmt: ast.Import | ast.ImportFrom, guard: str | None) -> None:
        if isinstance(stmt, ast.ImportFrom):
            if stmt.level or not stmt.module:
                return  # relative: the package itself
            tops = [stmt.module.split(".")[0]]
        else:
            tops = [alias.name.split(".")[0] for alias in stmt.names]
        for top in tops:
            if top == NAME or top in sys.stdlib_module_names or top == "__future__":
                continue
            found.append(ModuleImport(module, stmt.lineno, top, guard))

    def visit(stmts: Iterable[ast.stmt], guard: str | None) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue  # runs when called, not when imported
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                record(stmt, guard)
            elif isinstance(stmt, ast.If):
                if not _is_type_checking(stmt.test):
                    visit(stmt.body, guard)
                visit(stmt.orelse, guard)
            elif isinstance(stmt, (ast.Try, ast.TryStar)):
                visit(stmt.body, _extra_named_by(stmt.handlers) or guard)
                for handler in stmt.handlers:
                    visit(handler.body, guard)
                visit(stmt.orelse, guard)
                visit(stmt.finalbody, guard)
            elif isinstance(stmt, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While, ast.ClassDef)):
                visit(stmt.body, guard)
                visit(getattr(stmt, "orelse", []), guard)
            elif isinstance(stmt, ast.Match):
                for case in stmt.cases:
                    visit(case.body, guard)

    visit(ast.parse(source).body, None)
    return found


def undeclared_imports(
    sources: Mapping[str, str],
    base: set[str],
    extras: Mapping[str, set[str]],
    distributions: Mapping[str, list[str]] | None = None,
) -> list[Finding]:
    """Each module-level third-party import (``sources``: module name -> source text) whose
    distribution is not a base dependency, unless it is guarded by a Gemma4T4Error naming an extra
    that declares it. ``distributions`` maps import names to distributions (default: what is
    installed, ``importlib.metadata.packages_distributions()``)."""
    dists = installed_distributions() if distributions is None else distributions
    findings: list[Finding] = []
    for module, source in sorted(sources.items()):
        for imp in module_level_imports(source, module):
            names = {canonicalize_name(d) for d in dists.get(imp.name, [])}
            if not names:
                findings.append(Finding(module, imp.line, imp.name, "no installed distribution provides it"))
                continue
            if names & base:
                continue
            if imp.extra_guard is not None:
                if imp.extra_guard not in extras:
                    findings.append(Finding(module, imp.line, imp.name, f"names an unknown extra [{imp.extra_guard}]"))
                elif not names & extras[imp.extra_guard]:
                    findings.append(
                        Finding(module, imp.line, imp.name, f"{sorted(names)} is not in the [{imp.extra_guard}] extra")
                    )
                continue
            findings.append(
                Finding(module, imp.line, imp.name, f"{sorted(names)} is not a base dependency (pyproject.toml)")
            )
    return findings


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def startup_modules(sources: Mapping[str, str], roots: Iterable[str]) -> set[str]:
    """The package modules loaded (module-level imports, transitively) by importing ``roots``;
    importing ``a.b.c`` loads ``a`` and ``a.b`` too, and ``cli`` loads every command module."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        mod = todo.pop()
        if mod in seen or mod not in sources:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        if mod == f"{NAME}.cli":  # main() imports every command module (pkgutil discovery)
            todo.extend(m for m in sources if m.startswith(f"{NAME}.cli.") and not m.split(".")[-1].startswith("_"))
        is_pkg = (PACKAGE / Path(*parts[1:]) / "__init__.py").exists()
        for stmt in _gemma4_imports(sources[mod]):
            if isinstance(stmt, ast.Import):
                targets = [a.name for a in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    anchor = parts if is_pkg else parts[:-1]
                    anchor = anchor[: len(anchor) - (stmt.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in stmt.names]
            for target in targets:
                while target and target not in sources:
                    target = target.rpartition(".")[0]
                if target.startswith(NAME):
                    todo.append(target)
    return seen


def _gemma4_imports(source: str) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(stmts: Iterable[ast.stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            ours = (isinstance(stmt, ast.Import) and any(a.name.startswith(NAME) for a in stmt.names)) or (
                isinstance(stmt, ast.ImportFrom) and (stmt.level or (stmt.module or "").startswith(NAME))
            )
            if ours:
                out.append(stmt)
            elif isinstance(stmt, ast.If):
                if not _is_type_checking(stmt.test):
                    visit(stmt.body)
                visit(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                visit(stmt.body)
                visit(stmt.orelse)
                visit(stmt.finalbody)
            elif isinstance(stmt, (ast.With, ast.ClassDef)):
                visit(stmt.body)

    visit(ast.parse(source).body)
    return out


# ------------------------------------------------------------------------------------------
# The real package


def test_every_module_level_import_is_declared():
    base, extras = declared()
    findings = undeclared_imports(package_sources(), base, extras)
    assert not findings, "undeclared module-level imports:\n" + "\n".join(map(str, findings))


def test_the_cli_and_notebook_helpers_load_no_extra_only_module():
    """``gemma4-t4 --help`` and ``from gemma4_t4.notebook import setup`` load only modules whose
    module-level imports are base dependencies; an extra-only module (one that raises
    Gemma4T4Error naming its extra when imported) waits for the command that needs it."""
    sources = package_sources()
    loaded = startup_modules(sources, [f"{NAME}.cli", f"{NAME}.notebook", NAME])
    assert {f"{NAME}.cli.serve", f"{NAME}.foundation.signals", f"{NAME}.bench.schemas"} <= loaded  # followed transitively
    guarded = [
        f"{imp.module}:{imp.line}: import {imp.name} needs [{imp.extra_guard}]"
        for mod in sorted(loaded)
        for imp in module_level_imports(sources[mod], mod)
        if imp.extra_guard is not None
    ]
    assert not guarded, "loaded by the CLI or the notebook helpers at start-up:\n" + "\n".join(guarded)


# ------------------------------------------------------------------------------------------
# The checker itself, on synthetic modules


DISTS = {"yaml": ["PyYAML"], "boto3": ["boto3"], "mcp": ["mcp"], "torch": ["torch"], "anyio": ["anyio"]}
BASE = {"pyyaml"}
EXTRAS = {"aws": {"boto3"}, "mcp": {"mcp"}}


def test_checker_reports_an_undeclared_module_level_import():
    source = "import yaml\nimport boto3\n"
    findings = undeclared_imports({"synthetic": source}, BASE, EXTRAS, DISTS)
    assert [(f.module, f.line, f.name) for f in findings] == [("synthetic", 2, "boto3")]
    assert "not a base dependency" in findings[0].problem


def test_checker_reports_module_level_imports_in_blocks_and_classes():
    source = (
        "import contextlib\n"
        "with contextlib.suppress(Exception):\n    import torch\n"
        "class A:\n    from boto3 import client\n"
        "try:\n    import anyio\nexcept ImportError:\n    anyio = None\n"
    )
    findings = undeclared_imports({"synthetic": source}, BASE, EXTRAS, DISTS)
    assert sorted(f.name for f in findings) == ["anyio", "boto3", "torch"]


def test_checker_reports_a_package_nothing_provides():
    findings = undeclared_imports({"synthetic": "import not_a_real_dist\n"}, BASE, EXTRAS, DISTS)
    assert [f.name for f in findings] == ["not_a_real_dist"]
    assert "no installed distribution" in findings[0].problem


def test_checker_accepts_function_level_type_checking_and_extra_guarded_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from gemma4_t4.errors import Gemma4T4Error\n"
        "if TYPE_CHECKING:\n    import torch\n"
        "def f():\n    import boto3\n    return boto3\n"
        "try:\n    import mcp\nexcept ImportError as exc:\n"
        "    raise Gemma4T4Error('no MCP SDK', fix=\"pip install 'gemma4-t4[mcp]'\") from exc\n"
    )
    assert undeclared_imports({"synthetic": source}, BASE, EXTRAS, DISTS) == []


def test_checker_reports_a_guard_naming_the_wrong_extra():
    source = (
        "from gemma4_t4.errors import Gemma4T4Error\n"
        "try:\n    import torch\nexcept ImportError as exc:\n"
        "    raise Gemma4T4Error('no torch', fix=\"pip install 'gemma4-t4[aws]'\") from exc\n"
    )
    findings = undeclared_imports({"synthetic": source}, BASE, EXTRAS, DISTS)
    assert [f.name for f in findings] == ["torch"] and "[aws]" in findings[0].problem


def test_startup_closure_finds_an_extra_only_module_loaded_by_the_cli():
    sources = {
        f"{NAME}": "",
        f"{NAME}.cli": "",
        f"{NAME}.cli.thing": "from gemma4_t4 import extra_only\n",
        f"{NAME}.extra_only": (
            "try:\n    import mcp\nexcept ImportError as exc:\n"
            "    raise Gemma4T4Error('x', fix=\"pip install 'gemma4-t4[mcp]'\") from exc\n"
        ),
    }
    assert f"{NAME}.extra_only" in startup_modules(sources, [f"{NAME}.cli"])


# ------------------------------------------------------------------------------------------
# Imports inside functions: an extra's package missing names the extra to install


def optional_imports(source: str, module: str) -> list[ModuleImport]:
    """Third-party imports inside functions that are not guarded by an ``except ImportError``
    (or a broader handler) around them: a missing package reaches the caller as
    ModuleNotFoundError, which the error boundaries turn into the fix naming its extra."""
    found: list[ModuleImport] = []

    def guarded(handlers: list[ast.ExceptHandler]) -> bool:
        for handler in handlers:
            caught = handler.type
            names = (
                {e.id for e in caught.elts if isinstance(e, ast.Name)}
                if isinstance(caught, ast.Tuple)
                else {caught.id}
                if isinstance(caught, ast.Name)
                else {"BaseException"}
            )
            if names & (IMPORT_ERRORS | {"Exception", "BaseException"}):
                return True
        return False

    def visit(node: ast.AST, in_function: bool, in_guard: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function and not in_guard:
                if isinstance(child, ast.ImportFrom):
                    tops = [] if child.level or not child.module else [child.module.split(".")[0]]
                else:
                    tops = [a.name.split(".")[0] for a in child.names]
                for top in tops:
                    if top != NAME and top not in sys.stdlib_module_names and top != "__future__":
                        found.append(ModuleImport(module, child.lineno, top, None))
            if isinstance(child, ast.Try):
                for stmt in child.body:
                    visit_stmt(stmt, in_function, in_guard or guarded(child.handlers))
                for part in (*child.handlers, *child.orelse, *child.finalbody):
                    visit_stmt(part, in_function, in_guard)
                continue
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)), in_guard)

    def visit_stmt(stmt: ast.AST, in_function: bool, in_guard: bool) -> None:
        wrapper = ast.Module(body=[stmt], type_ignores=[])
        visit(wrapper, in_function, in_guard)

    visit(ast.parse(source), False, False)
    return found


def _extra_closure(extra_requirements: set[str]) -> set[str]:
    """The installed distributions an extra's requirements bring, transitively (markers ignored)."""
    seen: set[str] = set()
    todo = list(extra_requirements)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_requirements_of(name))
    return seen


@functools.cache
def _requirements_of(name: str) -> list[str]:
    """The distributions ``name`` requires (none when it is not installed); each extra's closure
    shares most of them."""
    try:
        requires = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return []
    return [canonicalize_name(Requirement(r).name) for r in requires]


def test_every_optional_import_names_what_installs_it():
    from gemma4_t4.errors import EXTRA_FOR_MODULE, SETUP_FOR_MODULE

    base, _extras = declared()
    dists = installed_distributions()
    unnamed = []
    for module, source in package_sources().items():
        for imp in optional_imports(source, module):
            if {canonicalize_name(d) for d in dists.get(imp.name, [])} & base:
                continue
            if imp.name not in EXTRA_FOR_MODULE and imp.name not in SETUP_FOR_MODULE:
                unnamed.append(f"{module}:{imp.line}: import {imp.name}")
    assert not unnamed, "add to gemma4_t4.errors.EXTRA_FOR_MODULE (or guard with except ImportError):\n" + "\n".join(
        unnamed
    )


def test_the_extra_table_agrees_with_pyproject():
    from gemma4_t4.errors import EXTRA_FOR_MODULE

    _base, extras = declared()
    dists = installed_distributions()
    wrong = []
    for module, extra in EXTRA_FOR_MODULE.items():
        if extra not in extras:
            wrong.append(f"{module}: no extra [{extra}] in pyproject.toml")
            continue
        installed = {canonicalize_name(d) for d in dists.get(module, [])}
        if installed and not installed & _extra_closure(extras[extra]):
            wrong.append(f"{module}: {sorted(installed)} is not brought by [{extra}]")
    assert not wrong, "\n".join(wrong)


def test_a_missing_extra_package_is_reported_with_its_extra():
    from gemma4_t4.errors import user_error

    assert user_error(ModuleNotFoundError("No module named 'boto3'", name="boto3")).fix == (
        "pip install 'gemma4-t4[aws]'"
    )
    assert "gemma4-t4[notebooks]" in user_error(ModuleNotFoundError("x", name="matplotlib.pyplot")).fix
    assert user_error(ModuleNotFoundError("x", name="vllm")).fix.startswith("gemma4-t4 setup")


def test_optional_import_scan_sees_unguarded_function_imports_only():
    source = (
        "import yaml\n"
        "def f():\n    import boto3\n"
        "def g():\n    try:\n        import pynvml\n    except ImportError:\n        return None\n"
        "def h():\n    from matplotlib import pyplot\n"
    )
    assert [(i.name, i.line) for i in optional_imports(source, "synthetic")] == [("boto3", 3), ("matplotlib", 10)]
