"""Rules of the project that code review alone would let slip."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hookedattn", "analysis", "hookedattn_tl")


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("path", python_files("hookedattn"), ids=lambda p: str(p.relative_to(ROOT)))
def test_hookedattn_never_imports_analysis(path):
    assert "analysis" not in imported_modules(path)


APPLICATIONS = ("store", "sae", "viewer", "training", "testing")


@pytest.mark.parametrize(
    "path", python_files("hookedattn/core"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_core_never_imports_its_applications(path):
    applications = {f"hookedattn.{app}" for app in APPLICATIONS}
    imported = {".".join(name.split(".")[:2]) for name in imported_module_paths(path)}
    assert not imported & applications


@pytest.mark.parametrize(
    "path",
    [p for p in python_files("hookedattn", "analysis") if "core" not in p.parts],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_applications_and_analysis_use_the_cores_public_api(path):
    private = {
        name
        for name in imported_module_paths(path)
        if name.startswith("hookedattn.core.")
        and any(part.startswith("_") for part in name.split(".")[2:])
    }
    assert not private, f"{path.name} imports private modules of the core: {sorted(private)}"


@pytest.mark.parametrize(
    "path",
    [p for p in python_files("analysis") if "patching" not in p.relative_to(ROOT).parts],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_analysis_reaches_the_patching_engine_through_its_one_module(path):
    private = {
        name
        for name in imported_module_paths(path)
        if name.startswith("analysis.patching.")
        and any(part.startswith("_") for part in name.split(".")[2:])
    }
    assert not private, (
        f"{path.name} imports private modules of analysis.patching: {sorted(private)}; "
        "take what it needs from analysis.patching.engine"
    )


def imported_module_paths(path: Path) -> set[str]:
    """Every module path `path` imports (`from a.b import c` counts as `a.b.c` and `a.b`),
    deferred and `TYPE_CHECKING` imports included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a.b import c`: the module a.b.c, or (where c is a name) a.b itself.
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of hookedattn and analysis it imports (most specific match)."""
    modules = {}
    for path in python_files("hookedattn", "analysis"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {r for n in imported_module_paths(path) if (r := resolve(n)) not in (None, module)}
        for module, path in modules.items()
    }


def test_no_import_circles_in_hookedattn_or_analysis():
    graph = _module_graph()
    circles = []
    for start in graph:  # a depth-first search from every module back to itself
        stack, seen = [(start, [start])], set()
        while stack:
            module, route = stack.pop()
            for nxt in graph[module]:
                if nxt == start:
                    circles.append(" -> ".join([*route, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*route, nxt]))
    assert not circles, f"import circles: {sorted(set(circles))[:5]}"


@pytest.mark.parametrize(
    "path",
    python_files("hookedattn", "analysis", "scripts"),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_nothing_imports_scripts_or_tests(path):
    assert not imported_modules(path) & {"scripts", "tests"}


@pytest.mark.parametrize("path", python_files(*PACKAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_postponed_annotations(path):
    # `from __future__ import annotations` turns annotations into strings, which defeats
    # jaxtyping's runtime shape checks.
    assert "from __future__ import annotations" not in path.read_text()


# Overrides of torch.nn.Module methods, documented by the class and by torch.
INHERITED = {"forward", "extra_repr"}


def public_definitions_without_docstring(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    missing = []

    def visit(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                public = not child.name.startswith("_") and not (prefix and child.name in INHERITED)
                if public and ast.get_docstring(child) is None:
                    missing.append(f"{prefix}{child.name}")
                if isinstance(child, ast.ClassDef) and public:
                    visit(child, prefix=f"{child.name}.")

    visit(tree)
    return missing


@pytest.mark.parametrize("path", python_files(*PACKAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_public_function_and_class_has_a_docstring(path):
    assert public_definitions_without_docstring(path) == []


def test_the_hook_name_page_is_generated_from_the_code():
    generated = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "hook_names.py")],
        capture_output=True, text=True, check=True, timeout=600, cwd=ROOT,
    ).stdout.strip()  # fmt: skip
    page = (ROOT / "docs" / "hook-names.md").read_text()
    section = page.split("<!-- hook-names:start -->")[1].split("<!-- hook-names:end -->")[0]
    assert section.strip() == generated, "run: python scripts/hook_names.py --write"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart")[1].split("```bash")[1].split("```")[0]
    commands = [line for line in quickstart.strip().splitlines() if line.strip()]
    assert len(commands) == 2
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
    assert "-c constraints.txt" in commands[0]


def _design_folder_tree() -> set[str]:
    """The folders the design page lists, as paths from the root."""
    readme = (ROOT / "docs" / "design.md").read_text()
    block = readme.split("<!-- folder tree -->\n```\n", 1)[1].split("```", 1)[0]
    folders, parents = set(), {}
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        name = line.split()[0]
        path = parents.get(indent - 2, "") + name
        parents[indent] = path
        folders.add(path.rstrip("/"))
    return folders


def test_the_design_page_lists_every_folder_of_the_repository():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    # Two levels deep: the shipped models' own folders are data, not design.
    folders = {
        "/".join(parts[:depth])
        for parts in (path.split("/") for path in tracked)
        for depth in (1, 2)
        if len(parts) > depth
    }
    assert _design_folder_tree() == folders


def _exported_by(package: str) -> set[tuple[str, str]]:
    """`(module, name)` of every function and class a package's `__init__` exports: each
    object in its `__all__`, and each name a module exported as a namespace lists in its own."""
    import importlib
    import types

    pkg = importlib.import_module(package)
    exported = set()
    for name in pkg.__all__:
        obj = getattr(pkg, name)
        if isinstance(obj, types.ModuleType):
            exported |= {(obj.__name__, inner) for inner in obj.__all__}
        elif hasattr(obj, "__module__") and hasattr(obj, "__name__"):
            exported.add((obj.__module__, obj.__name__))
    return exported


# A public-named module's public names that its package does not export, each with why.
PUBLIC_SURFACE_EXCEPTIONS: dict[str, str] = {}


def test_public_modules_hold_only_the_api():
    """A module whose name has no leading `_` is public, and every function and class of it
    without one is exported by its package's `__init__` (`__all__`); anything else is
    private: its module is `_name.py` (re-exported where some of it is public), or its name
    starts with `_`."""
    unexported = []
    for top in ("hookedattn", "analysis"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if any(part.startswith("_") for part in parts):  # private, __init__, __main__
                continue
            exported = _exported_by(".".join(parts[:-1]))
            module = ".".join(parts)
            for node in ast.parse(path.read_text()).body:
                is_def = isinstance(node, ast.FunctionDef | ast.ClassDef)
                if is_def and not node.name.startswith("_"):
                    qualified = f"{module}.{node.name}"
                    if (module, node.name) not in exported and qualified not in (
                        PUBLIC_SURFACE_EXCEPTIONS
                    ):
                        unexported.append(qualified)
    assert not unexported, (
        f"public names of public modules that no package __init__ exports: {unexported}; "
        "export each from the package (its __all__), or make it private (_module.py or _name)"
    )
