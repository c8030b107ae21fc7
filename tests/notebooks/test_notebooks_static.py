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

REPO = Path(__file__).resolve().parents[2]
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
    assert values["TARGET"] == "auto", "TARGET='auto' must be what runs without edits (GPU path or CPU default)"
    assert {"TARGET", "OUT_DIR", "WORK_DIR", "CLEANUP"} <= set(values)
    target_line = next(line for line in cell.source.splitlines() if line.startswith("TARGET"))
    choices = ast.literal_eval(target_line.split("# @param")[1].strip())
    assert choices[0] == "auto" and "cpu" in choices and set(choices) <= {"auto", *TARGETS}, choices
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


def _code_lines(source: str) -> list[str]:
    return [ln for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_install_cell_is_one_pip_line_and_setup(nb_path):
    nb = _load(nb_path)
    cells = _tagged(nb, "install")
    assert len(cells) == 1
    source = cells[0].source
    assert len(_code_lines(source)) <= 4, _code_lines(source)
    assert 'find_spec("gemma4_t4") is None' in source, "the pip line must be a no-op where the package exists"
    assert f"git+https://github.com/{REPO_URL}@main" in source
    tree = ast.parse(source)
    setup_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup"]
    assert len(setup_calls) == 1, "the install cell ends with gemma4_t4.notebook.setup()"
    assert any(isinstance(n, ast.ImportFrom) and n.module == "gemma4_t4.notebook" for n in ast.walk(tree))
    extras = PYPROJECT["project"]["optional-dependencies"]
    for group in re.findall(r"gemma4-t4\[([^\]{}]+)\]", source):
        for extra in group.split(","):
            assert extra in extras, f"install cell asks for extra {extra!r} which pyproject lacks"
    all_deps = {dep for deps in extras.values() for dep in deps}
    for keyword in setup_calls[0].keywords:
        if keyword.arg == "packages":
            for requirement in ast.literal_eval(keyword.value):
                assert requirement in all_deps, f"setup() installs {requirement!r}, which pyproject does not list"
    assert "import torch" not in source and "import vllm" not in source and "==" not in source, \
        "versions are pinned in one place: pyproject and gemma4_t4.host.setup, not the notebooks"


def test_install_section_tells_the_learner_about_the_restart(nb_path):
    import inspect

    from gemma4_t4 import notebook

    nb = _load(nb_path)
    install = _tagged(nb, "install")[0]
    heading = nb.cells[nb.cells.index(install) - 1]
    assert heading.cell_type == "markdown" and heading.source.startswith("## Install")
    assert "RESTART NEEDED" in heading.source and "setup()" in heading.source
    assert "RESTART NEEDED" in inspect.getsource(notebook.setup)  # what setup() prints


def test_repository_url_is_the_one_in_pyproject(nb_path):
    """Badges, "View on GitHub" and the install line all point at [project.urls]."""
    text = nb_path.read_text()
    links = re.findall(r"github\.com/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:/|@|\.git|\"|\)|\s)", text)
    ours = [link for link in links if "gemma4" in link.lower() and "xbill9" not in link.lower()]
    assert ours and set(ours) == {REPO_URL}, set(ours)
    urls = PYPROJECT["project"]["urls"]
    assert {urls["Homepage"], urls["Repository"]} == {f"https://github.com/{REPO_URL}"}


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


_NOT_MEASURED = {"TARGET", "nb", "published", "hardware", "models", "round", "len", "f", "max", "min", "bool"}


def test_assertion_cells_check_every_measured_result(nb_path):
    """Each name whose value the summary reports as measured is checked by an ``assert``: a
    notebook cannot report a number nothing verified (published figures go in ``published=``)."""
    tree = ast.parse("\n".join(_strip_magics(c.source) for c in _code_cells(_load(nb_path))))
    summaries = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "save_summary"]
    if len(summaries) == 1 and re.fullmatch(r"\*\*\w+\.summary\(\)", ast.unparse(summaries[0].keywords[-1]) if summaries[0].keywords else ""):
        # the summary comes from a result the package checked when it was built (e.g. part2's compare())
        name = ast.unparse(summaries[0].keywords[-1].value.func.value)
        assert re.search(rf"\b{name} = \w+\.compare\(", ast.unparse(tree)), f"{name} is not a checked comparison"
        return
    asserted = {n.id for a in ast.walk(tree) if isinstance(a, ast.Assert) for n in ast.walk(a.test)
                if isinstance(n, ast.Name)}
    asserts = [a for a in ast.walk(tree) if isinstance(a, ast.Assert)]
    assert len(asserts) >= 4, "the assertion cell checks too little"
    assert not any(isinstance(a.test, ast.Constant) for a in asserts), "assert on a constant checks nothing"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "save_summary"]
    assert len(calls) == 1
    results = next(k.value for k in calls[0].keywords if k.arg == "results")
    assert isinstance(results, ast.Dict)
    for key in results.keys:
        assert "published" not in ast.unparse(key).lower(), "published figures belong in published={...}"
    measured = {n.id for value in results.values for n in ast.walk(value) if isinstance(n, ast.Name)} - _NOT_MEASURED
    assert measured, "the summary reports nothing measured"
    unchecked = measured - asserted
    assert not unchecked, f"reported but never asserted: {sorted(unchecked)}"


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


def _package_names(tree: ast.AST) -> dict[str, object]:
    """What each ``import``/``from ... import`` of gemma4_t4 binds in a notebook."""
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gemma4_t4"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                value = getattr(module, alias.name, None)
                names[alias.asname or alias.name] = value if value is not None else \
                    importlib.import_module(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gemma4_t4"):
                    names[alias.asname or alias.name.split(".")[0]] = importlib.import_module(alias.name)
    return names


# functions whose **kwargs are the fields of a config model: the keywords must be those fields
_FORWARDS = {"run_benchmark": ("gemma4_t4.bench.workloads", ("BenchArgs",)),
             "serve": ("gemma4_t4.serving.server_config", ("ServerConfig",))}


def _bind(target, label: str, node: ast.Call) -> None:
    """Bind a call's arguments to ``target``'s real signature (raises TypeError on a mismatch)."""
    import dataclasses
    import inspect

    signature = inspect.signature(target)
    starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
    keywords = {k.arg: k.value for k in node.keywords if k.arg}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if not starred:
        signature.bind(*node.args, **keywords)
    elif not var_kw:
        unknown = sorted(set(keywords) - set(signature.parameters))
        if unknown:
            raise TypeError(f"got unexpected keyword argument(s) {unknown}")
    name = getattr(target, "__name__", "")
    if var_kw and name in _FORWARDS:
        module = importlib.import_module(_FORWARDS[name][0])
        model = next(getattr(module, c) for c in _FORWARDS[name][1] if hasattr(module, c))
        fields = set(getattr(model, "model_fields", None) or {f.name for f in dataclasses.fields(model)})
        if name == "run_benchmark":  # its options are BenchArgs' and the registered workloads' fields
            from gemma4_t4.bench.registry import REGISTRY

            fields |= {f for spec in REGISTRY.values() for f in spec.model_fields} | {"method"}
        named = {p for p, v in signature.parameters.items() if v.kind is not v.VAR_KEYWORD}
        unknown = sorted(set(keywords) - fields - named)
        if unknown:
            raise TypeError(f"{label}() got unexpected keyword argument(s) {unknown} (not {model.__name__} fields)")


def test_calls_into_the_package_match_the_real_signatures(nb_path):
    """Every call a notebook makes into gemma4_t4 (``f(...)`` or ``module.f(...)``) binds to the
    function's real signature: names, keywords and positional count, checked without running."""
    import inspect

    tree = ast.parse("\n".join(_strip_magics(c.source) for c in _code_cells(_load(nb_path))))
    names = _package_names(tree)
    checked = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in names:
            target, label = names[func.id], func.id
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in names \
                and inspect.ismodule(names[func.value.id]):
            owner = names[func.value.id]
            assert hasattr(owner, func.attr), f"{func.value.id}.{func.attr} does not exist"
            target, label = getattr(owner, func.attr), f"{func.value.id}.{func.attr}"
        else:
            continue
        if not callable(target) or inspect.ismodule(target):
            continue
        try:
            _bind(target, label, node)
        except ValueError:  # a builtin without a signature
            continue
        except TypeError as exc:
            pytest.fail(f"{nb_path.name} line {node.lineno}: {ast.unparse(node)[:120]} does not match "
                        f"{label}{inspect.signature(target)}: {exc}")
        checked += 1
    assert checked >= 5, f"only {checked} package calls found in {nb_path.name}"


def test_the_checker_catches_a_wrong_keyword():
    """The signature check above bites: a misspelt keyword fails to bind."""
    import inspect

    from gemma4_t4 import notebook
    from gemma4_t4.bench.workloads import run_benchmark

    call = ast.parse('run_benchmark("u", "m", "decode", "out", concurency=[1])').body[0].value
    with pytest.raises(TypeError, match="concurency"):
        _bind(run_benchmark, "run_benchmark", call)
    _bind(run_benchmark, "run_benchmark", ast.parse('run_benchmark("u", "m", "decode", "o", concurrency=[1])').body[0].value)
    with pytest.raises(TypeError, match="max_num_seq"):
        _bind(notebook.endpoint, "nb.endpoint",
              ast.parse('nb.endpoint("cpu", "m", "w", name="n", max_num_seq=2)').body[0].value)
    from gemma4_t4.bench.specs import DecodeSpec

    with pytest.raises(TypeError, match="concurency"):  # a spec's fields are its signature
        _bind(DecodeSpec, "DecodeSpec", ast.parse("DecodeSpec(concurency=[1])").body[0].value)
    with pytest.raises(TypeError):
        _bind(notebook.model_for, "nb.model_for", ast.parse('nb.model_for("cpu", "e2b", "bf16", "w", "x")').body[0].value)
    assert inspect.signature(notebook.model_for)


# ---------------------------------------------------------------- the series' conditions and claims


def test_t4_parameters_reproduce_the_series_conditions():
    from gemma4_t4.bench.registry import notebook_params
    from gemma4_t4.venues.parameters import PARAMETERS

    t4 = yaml.safe_load((PARAMS_DIR / "t4.yaml").read_text())
    assert t4["04"]["TTFT_INPUT_LENS"] == [512, 1024, 2048, 4096] and 8 in t4["04"]["CONCURRENCY"]
    assert t4["04"]["CONCURRENCY"] == [1, 8] and (t4["04"]["INPUT_LEN"], t4["04"]["OUTPUT_LEN"]) == (512, 128)
    assert t4["02"] == {"MODEL_SIZE": "e2b", "CONCURRENCY": [1, 8], "INPUT_LEN": 512, "OUTPUT_LEN": 128,
                        "NUM_PROMPTS": 8}
    for part in (2, 4):  # the notebooks' own T4 defaults are the same values
        section = {k: v for k, v in t4[f"{part:02d}"].items() if k != "MODEL_SIZE"}
        assert notebook_params("t4", **dict.fromkeys(PARAMETERS[part])) == section  # params/t4.yaml: the workload classes' T4 values


def test_workload_parameters_left_at_none_are_filled_per_target():
    from gemma4_t4 import notebook

    declared = {p.stem[:2]: _parameters(_load(p)) for p in NOTEBOOKS}
    for part in ("02", "04"):
        none = [k for k, v in declared[part].items() if v is None]
        assert none and set(none) <= set(notebook.PARAMETERS[int(part)]), none
    # Part 4 reports its figures at one stream: a CONCURRENCY without 1 gets it
    assert notebook.fill_defaults(4, "t4", TTFT_INPUT_LENS=None, CONCURRENCY=[2]) == ([512, 1024, 2048, 4096], [1, 2])
    assert notebook.fill_defaults(2, "cpu", INPUT_LEN=None) == (128,)


def test_each_parameters_cell_is_the_one_its_part_checks(nb_path):
    """check_parameters knows every parameter a notebook declares, and the notebook calls it first."""
    from gemma4_t4 import notebook

    part = int(nb_path.stem[:2])
    assert set(_parameters(_load(nb_path))) == set(notebook.PART_PARAMS[part])
    first = next(c for c in _load(nb_path).cells if c.cell_type == "code" and "notebook as nb" in c.source)
    assert f"nb.check_parameters({part}, globals())" in first.source


def test_published_claims_carry_their_source_and_match_it():
    from gemma4_t4.bench import published

    assert round(published.PART2_L4_QAT_VS_BF16.ratio, 2) == 2.05
    assert (published.PART2_L4_QAT_VS_BF16.baseline_value, published.PART2_L4_QAT_VS_BF16.value) == (51.3, 105.1)
    assert round(published.PART3_L4_EMB4_VS_QAT.ratio, 2) == 1.39 and published.PART3_L4_EMB4_VS_QAT.model == \
        "gemma-4-26B-A4B"
    c8 = published.T4_QAT_VS_BF16_C8
    assert (c8.baseline_value, c8.value, round(c8.ratio, 2)) == (164.62, 215.91, 1.31)
    assert round(published.T4_QAT_VS_BF16_C1.ratio, 2) == 1.79
    ratios = (published.PART2_L4_QAT_VS_BF16, published.PART3_L4_EMB4_VS_QAT, c8, published.T4_QAT_VS_BF16_C1)
    assert all(r.published and r.source and r.conditions for r in ratios)
    # the GCE run: 8 prompts per cell, 3 repeats, driver 615 (its REPORT.md), TTFT the median
    assert "3 repeats" in published.GCE_SOURCE and "8 prompts per cell" in published.GCE_SOURCE
    assert "615.71.09" in published.GCE_SOURCE
    assert published.gce_t4("bf16", 4096, 4).ttft_ms == 15304 and published.gce_t4("qat", 4096, 16).ttft_ms == 80119
    assert published.GRID_26B_Q_PROJ.awq_changed_pct == 30.3 and published.GRID_26B_Q_PROJ.repack_changed_pct == 0


def test_published_numbers_in_notebooks_come_from_the_published_module(nb_path):
    """No published figure typed into a code cell: each comes from gemma4_t4.bench.published."""
    from gemma4_t4.bench import published

    figures = {r.per_stream_tok_s for r in published.GCE_T4_E2B} | {r.output_throughput_tok_s for r in published.GCE_T4_E2B}
    figures |= {r.ttft_ms for r in published.GCE_T4_E2B} | {r.l4_tok_s for r in published.SAGEMAKER_DECODE}
    figures |= {published.GRID_26B_Q_PROJ.awq_changed_pct, 2.05, 1.39, 1.79, 1.31}
    for cell in _code_cells(_load(nb_path)):
        for node in ast.walk(ast.parse(_strip_magics(cell.source))):
            if isinstance(node, ast.Constant) and isinstance(node.value, float):
                assert node.value not in figures, f"published figure {node.value} typed into {nb_path.name}"


# ---------------------------------------------------------------- TARGET=sagemaker


@pytest.mark.parametrize("part", ["02", "03", "04"])
def test_parts_2_to_4_choose_the_venue_once_and_run_the_same_cells_everywhere(part):
    """Each of Parts 2-4 accepts TARGET='sagemaker' (with REGION and BUDGET_USD), chooses the venue in
    ``nb.endpoint(runtime, ...)`` only, compares TARGET nowhere else (at most one branch), passes no
    dict-of-dicts, repeats no heading, and its clean-up cell checks no endpoint of its part is left."""
    nb = _load(next(p for p in NOTEBOOKS if p.name.startswith(part)))
    values = _parameters(nb)
    assert {"REGION", "BUDGET_USD"} <= set(values) and values["BUDGET_USD"] > 0
    target_line = next(ln for ln in _tagged(nb, "parameters")[0].source.splitlines() if ln.startswith("TARGET"))
    assert "sagemaker" in ast.literal_eval(target_line.split("# @param")[1].strip())
    tree = ast.parse("\n".join(_strip_magics(c.source) for c in _code_cells(nb)))
    checks = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "runtime_check"]
    allowed = next(ast.literal_eval(k.value) for k in checks[0].keywords if k.arg == "allowed")
    assert "sagemaker" in allowed
    endpoints = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "endpoint"]
    assert endpoints and all(ast.unparse(n.args[0]) == "runtime" for n in endpoints), [ast.unparse(n) for n in endpoints]
    branches = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                and any(isinstance(x, ast.Name) and x.id == "TARGET" for x in [n.left, *n.comparators])]
    assert len(branches) <= 1, f"TARGET compared {len(branches)} times: {branches}"
    nested = [ast.unparse(k)[:80] for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords
              if isinstance(k.value, ast.Dict) and any(isinstance(v, ast.Dict) for v in k.value.values)]
    assert not nested, f"dict-of-dicts arguments: {nested}"
    headings = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## ")]
    assert len(headings) == len(set(headings)), headings
    cleanup = _tagged(nb, "cleanup")[0].source
    assert "nb.clean_up(" in cleanup and f"part={int(part)}, region=REGION" in cleanup and re.search(r"assert not left|\.clean_up\(left\b", cleanup)


def test_the_venue_rule_bites():
    """The branch counter above counts a second TARGET comparison and a dict-of-dicts argument."""
    tree = ast.parse('if TARGET == "cpu":\n    x = 1\ny = f(a=1) if TARGET != "sagemaker" else g(o={"d": {"c": 1}})')
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)
                and any(isinstance(x, ast.Name) and x.id == "TARGET" for x in [n.left, *n.comparators])]
    nested = [k for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords
              if isinstance(k.value, ast.Dict) and any(isinstance(v, ast.Dict) for v in k.value.values)]
    assert len(compares) == 2 and len(nested) == 1


def test_sagemaker_parameters_skip_nothing():
    data = yaml.safe_load((PARAMS_DIR / "sagemaker.yaml").read_text())
    assert not [section for section, values in data.items() if "_skip" in (values or {})], data


# ---------------------------------------------------------------- a notebook step is the call and its result


def _if_lines(sources: list[str]) -> list[str]:
    """Lines (any indentation) that open an ``if``/``elif`` branch in code cells."""
    return [ln.strip() for src in sources for ln in src.splitlines() if re.match(r"(if|elif)\b", ln.strip())]


def _rows_built_for_display(source: str) -> list[str]:
    """Where a cell assembles display rows itself: any ``show_table`` call (a result displays itself
    as the cell's last expression), and a list of dicts, written out or comprehended."""
    def assembles(node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            return getattr(node.func, "attr", getattr(node.func, "id", None)) == "show_table"
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            return isinstance(node.elt, (ast.Dict, ast.DictComp))
        return isinstance(node, ast.List) and any(isinstance(e, (ast.Dict, ast.DictComp)) for e in node.elts)

    found = [ast.unparse(node)[:80] for node in ast.walk(ast.parse(_strip_magics(source))) if assembles(node)]
    return found


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=IDS)
def test_a_notebook_branches_at_most_twice_and_builds_no_rows_to_show(nb_path):
    """Venue and display choices live in the package: at most two ``if`` lines per notebook (the
    install cell's and the clean-up's, or a step's), and every table is a result the package built."""
    sources = [c.source for c in _code_cells(_load(nb_path))]
    assert len(_if_lines(sources)) <= 2, _if_lines(sources)
    built = [found for src in sources for found in _rows_built_for_display(src)]
    assert not built, built


def test_the_display_rules_bite():
    cell = ('if a:\n    x = 1\nelif b:\n    y = [{"k": v} for v in z]\n'
            'nb.show_table(rows)\nrows = [{"a": 1}, {"a": 2}]\nok = [f(r) for r in rows]')
    assert _if_lines([cell]) == ["if a:", "elif b:"]
    assert len(_rows_built_for_display(cell)) == 3
    assert not _rows_built_for_display('nb.Table(report.problems, title="t")\nfits\nnb.mcp_session([("t", {"a": 1})])')
