"""Cheap static checks over the notebooks' JSON: no kernel, no execution, a few seconds.

They catch what breaks a learner's "Run all" on Colab before anything runs: invalid JSON,
cells that don't parse, a missing or duplicated ``parameters`` cell, committed outputs,
machine-specific paths, install pins that drifted from pyproject, and calls into
``gemma4_t4`` names that no longer exist.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml

from gemma4_t4.pipeline import PARTS, TARGETS, find_notebooks

REPO = Path(__file__).resolve().parents[1]
NB_DIR = REPO / "notebooks"
PARAMS_DIR = NB_DIR / "params"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
REPO_URL = PYPROJECT["project"]["urls"]["Homepage"].removeprefix("https://github.com/")

NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]


def _load(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def _tagged(nb, tag: str) -> list:
    return [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]


def _strip_magics(source: str) -> str:
    """Replace IPython magics/shell escapes by ``pass`` (keeping indentation) so ast can parse."""
    lines = []
    for line in source.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")):
            lines.append(line[: len(line) - len(stripped)] + "pass")
        else:
            lines.append(line)
    return "\n".join(lines)


def _parameters(nb) -> dict[str, object]:
    cell = _tagged(nb, "parameters")[0]
    values = {}
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


# ---------------------------------------------------------------- the set of notebooks


def test_one_notebook_per_part_in_order():
    found = find_notebooks(NB_DIR)
    missing = [n for n, p in found.items() if p is None]
    assert not missing, f"missing notebooks for parts {missing}"
    assert [p.name[:2] for p in NOTEBOOKS] == list(PARTS)


def test_parameter_files_exist_for_every_target():
    for target in TARGETS:
        data = yaml.safe_load((PARAMS_DIR / f"{target}.yaml").read_text())
        assert data["all"]["TARGET"] == target


@pytest.mark.parametrize("target", TARGETS)
def test_parameter_files_only_set_parameters_the_notebooks_declare(target):
    data = yaml.safe_load((PARAMS_DIR / f"{target}.yaml").read_text())
    declared = {p.stem: set(_parameters(_load(p))) for p in NOTEBOOKS}
    for section, values in data.items():
        if section == "all":
            targets = list(declared)
        else:
            targets = [stem for stem in declared if stem == section or stem[:2] == str(section)]
            assert targets, f"{target}.yaml section {section!r} names no notebook"
        for stem in targets:
            unknown = set(values or {}) - declared[stem] - {"_skip"}
            assert not unknown, f"{target}.yaml sets {unknown} which {stem} does not declare"


# ---------------------------------------------------------------- per notebook


@pytest.fixture(params=NOTEBOOKS, ids=IDS)
def nb_path(request) -> Path:
    return request.param


def test_valid_json_and_nbformat(nb_path):
    json.loads(nb_path.read_text())
    nbformat.validate(_load(nb_path))


def test_kernel_and_colab_metadata(nb_path):
    meta = _load(nb_path).metadata
    assert meta["kernelspec"]["name"] == "python3"
    assert meta.get("accelerator") == "GPU" and meta["colab"]["gpuType"] == "T4"


def test_every_code_cell_parses(nb_path):
    for i, cell in enumerate(_code_cells(_load(nb_path))):
        try:
            ast.parse(_strip_magics(cell.source))
        except SyntaxError as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"code cell {i} does not parse: {exc}\n{cell.source}")


def test_outputs_are_stripped(nb_path):
    for cell in _code_cells(_load(nb_path)):
        assert cell.outputs == [], f"committed outputs in cell {cell.get('id')}"
        assert cell.execution_count is None, f"committed execution count in cell {cell.get('id')}"


def test_nbstripout_would_change_nothing(nb_path):
    """The committed form is exactly what `nbstripout` produces (outputs, counts, ids, metadata)."""
    nbstripout = pytest.importorskip("nbstripout", reason="nbstripout (dev extra) is not installed")
    nb = _load(nb_path)
    stripped = nbstripout.strip_output(nbformat.from_dict(json.loads(json.dumps(nb))), keep_output=False,
                                       keep_count=False, keep_id=False)
    assert json.dumps(stripped, sort_keys=True) == json.dumps(nb, sort_keys=True)


def test_exactly_one_parameters_cell_and_no_injected_one(nb_path):
    nb = _load(nb_path)
    assert len(_tagged(nb, "parameters")) == 1
    assert not _tagged(nb, "injected-parameters")


def test_parameters_cell_is_a_colab_form_with_the_standard_names(nb_path):
    nb = _load(nb_path)
    cell = _tagged(nb, "parameters")[0]
    values = _parameters(nb)
    assert values["TARGET"] == "cpu", "the embedded CPU default must be what runs without edits"
    assert {"TARGET", "OUT_DIR", "WORK_DIR", "CLEANUP"} <= set(values)
    target_line = next(line for line in cell.source.splitlines() if line.startswith("TARGET"))
    assert "# @param" in target_line and '"cpu"' in target_line.split("# @param")[1]
    for line in cell.source.splitlines():
        if re.match(r"^[A-Z_][A-Z0-9_]* = ", line):
            assert "# @param" in line, f"parameter without a Colab form field: {line}"
    # nothing but literal assignments and comments: papermill replaces this cell
    for node in ast.parse(cell.source).body:
        assert isinstance(node, ast.Assign), ast.dump(node)


def test_parameters_cell_comes_after_install_and_before_any_package_import(nb_path):
    cells = _load(nb_path).cells
    params = next(i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    install = next(i for i, c in enumerate(cells) if "install" in c.get("metadata", {}).get("tags", []))
    first_import = next(i for i, c in enumerate(cells) if c.cell_type == "code" and i != install
                        and re.search(r"^(from|import) gemma4_t4", c.source, re.M))
    assert install < params < first_import


def test_no_absolute_or_machine_specific_paths(nb_path):
    text = nb_path.read_text()
    for pattern in (r"/work/", r"/home/\w", r"/Users/\w", r"/tmp/", r"[A-Z]:\\\\", r"/root/", r"\.venv/"):
        assert not re.search(pattern, text), f"{pattern} found in {nb_path.name}"


def test_title_badge_and_overview(nb_path):
    nb = _load(nb_path)
    first = nb.cells[0]
    number = int(nb_path.name[:2])
    assert first.cell_type == "markdown" and first.source.startswith(f"# Part {number} of 4")
    badge = f"colab.research.google.com/github/{REPO_URL}/blob/main/notebooks/{nb_path.name}"
    assert badge in first.source, "Colab badge missing or pointing at another notebook"
    for heading in ("What you will learn", "Cost and time"):
        assert heading in first.source


def test_install_cell_is_guarded_and_pins_match_pyproject(nb_path):
    nb = _load(nb_path)
    cells = _tagged(nb, "install")
    assert len(cells) == 1
    source = cells[0].source
    assert 'find_spec("gemma4_t4") is None' in source, "install must be a no-op where the package exists"
    assert "google.colab" in source and "nvidia-smi" in source and '"T4"' in source
    assert f"github.com/{REPO_URL}" in source
    extras = PYPROJECT["project"]["optional-dependencies"]
    for group in re.findall(r"gemma4-t4\[([^\]{}]+)\]", source) + re.findall(r'extras = "([^"]+)"', source) \
            + re.findall(r'else "([a-z,]+)"', source):
        for extra in group.split(","):
            assert extra in extras, f"install cell asks for extra {extra!r} which pyproject lacks"
    pinned = {}
    for deps in extras.values():
        for dep in deps:
            m = re.match(r"^([A-Za-z0-9_.\-]+)==([^;,\s]+)$", dep)
            if m:
                pinned[m.group(1).lower()] = m.group(2)
    for name, version in re.findall(r"([A-Za-z0-9_.\-]+)==([0-9][^\"'\s]*)", source):
        assert pinned.get(name.lower()) == version, f"install pins {name}=={version}, pyproject says {pinned.get(name.lower())}"
    all_deps = {dep for deps in extras.values() for dep in deps}
    for requirement in re.findall(r'pip \+ \["([^"]+)"\]', source):
        assert requirement in all_deps, f"install cell installs {requirement!r}, which pyproject does not list"
    assert "import torch" not in source and "import vllm" not in source


def test_runtime_check_before_the_steps(nb_path):
    sources = [c.source for c in _code_cells(_load(nb_path))]
    assert any("runtime_check(TARGET" in s for s in sources)


def test_cleanup_section_and_cell(nb_path):
    nb = _load(nb_path)
    headings = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "## Cleaning up" in c.source]
    assert len(headings) == 1
    cleanup = _tagged(nb, "cleanup")
    assert len(cleanup) == 1 and "CLEANUP" in cleanup[0].source
    assert nb.cells.index(cleanup[0]) > headings[0]


def test_assertion_cells_check_the_numbers(nb_path):
    asserts = [c for c in _code_cells(_load(nb_path)) if re.search(r"^assert ", c.source, re.M)]
    assert asserts, "no assertion cell: nbval/papermill would pass a notebook that measured nothing"


def test_summary_is_saved_and_next_part_linked(nb_path):
    nb = _load(nb_path)
    assert any("save_summary(" in c.source for c in _code_cells(nb))
    number = int(nb_path.name[:2])
    last_md = [c for c in nb.cells if c.cell_type == "markdown"][-1].source
    following = f"{number + 1:02d}_" if number < 4 else "01_"
    links = re.findall(r"\(([0-9]{2}_[a-z0-9_]+\.ipynb)\)", last_md)
    assert any(link.startswith(following) and (NB_DIR / link).exists() for link in links), last_md


def test_plots_are_saved_as_well_as_shown(nb_path):
    sources = "\n".join(c.source for c in _code_cells(_load(nb_path)))
    assert re.search(r"show_figure\(|show_image\(", sources)


def test_cells_stay_thin(nb_path):
    """Logic lives in the package: no function or class definitions, no long cells."""
    for cell in _code_cells(_load(nb_path)):
        if "install" in cell.get("metadata", {}).get("tags", []):
            continue
        tree = ast.parse(_strip_magics(cell.source))
        assert not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(tree))
        code_lines = [ln for ln in cell.source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert len(code_lines) <= 25, f"cell {cell.get('id')} has {len(code_lines)} lines"


def test_progress_bars_come_from_tqdm_auto(nb_path):
    text = "\n".join(c.source for c in _code_cells(_load(nb_path)))
    assert "from tqdm import tqdm" not in text, "use tqdm.auto so bars render in Jupyter and terminals"


def test_gemma4_t4_names_used_by_the_notebook_exist(nb_path):
    """Catch API drift without executing: every ``from gemma4_t4... import x`` resolves and every
    ``module.attr`` used on an imported gemma4_t4 module exists."""
    modules: dict[str, object] = {}
    for cell in _code_cells(_load(nb_path)):
        tree = ast.parse(_strip_magics(cell.source))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gemma4_t4"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
                    value = getattr(module, alias.name, None) or importlib.import_module(f"{node.module}.{alias.name}")
                    modules[alias.asname or alias.name] = value
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("gemma4_t4"):
                        modules[alias.asname or alias.name] = importlib.import_module(alias.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                owner = modules[node.value.id]
                if hasattr(owner, "__path__") or type(owner).__name__ == "module":
                    assert hasattr(owner, node.attr), f"{node.value.id}.{node.attr} does not exist"


def test_no_words_about_how_it_was_built(nb_path):
    text = nb_path.read_text()
    for word in (r"\bTODO\b", r"\bFIXME\b", r"issue #\d", r"\bagent\b"):
        assert not re.search(word, text, re.I), word
