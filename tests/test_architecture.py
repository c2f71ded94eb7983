"""The package's structure: the pipeline's layers, no import cycles, short documented modules.

The layer contract lives in ``pyproject.toml`` (``[tool.importlinter]``); the cycle check
counts every import statement, including those inside functions, so a cycle cannot hide in a
deferred import. Each check is also run on a planted violation, so it is known to fail.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp
import pytest

import mirage_jax

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(mirage_jax.__file__).resolve().parent
MAX_LINES = 800


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_runtime_headers" not in p.parts)


def import_cycles(package: str) -> list[list[str]]:
    """The strongly connected components of more than one module in ``package``'s graph."""
    graph = grimp.build_graph(package, cache_dir=None)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm, recursive: module graphs are shallow
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def lint_imports(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on ``config``, in a child process: its command line reconfigures logging,
    which would silence the loggers of every test after this one."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(" \
        f"config_filename={str(config)!r}, no_cache=True))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False, timeout=300)  # fmt: skip


def test_layers_contract_holds() -> None:
    done = lint_imports(ROOT / "pyproject.toml", ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_no_import_cycles() -> None:
    assert import_cycles("mirage_jax") == []


def _plant(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_planted_cycle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _plant(tmp_path, {
        "cyclic/__init__.py": "",
        "cyclic/a.py": "from cyclic import b\n",
        "cyclic/b.py": "def f():\n    from cyclic import a  # deferred: still a cycle\n",
        "cyclic/c.py": "from cyclic import a\n",
    })  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("cyclic") == [["cyclic.a", "cyclic.b"]]


def test_a_planted_upward_import_breaks_the_layers(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    _plant(tmp_path, {
        "layered/__init__.py": "",
        "layered/top.py": "from layered import low\n",
        "layered/low.py": "def f():\n    from layered import top\n",
        "contract.toml": """
            [tool.importlinter]
            root_package = "layered"
            [[tool.importlinter.contracts]]
            name = "layers"
            type = "layers"
            layers = ["layered.top", "layered.low"]
        """,
    })  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    done = lint_imports(tmp_path / "contract.toml", tmp_path)
    assert done.returncode != 0 and "layered.low -> layered.top" in done.stdout, done.stdout


def test_no_module_over_the_line_limit() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert long == {}


def test_every_module_says_what_it_is_for() -> None:
    missing = [str(p.relative_to(PACKAGE)) for p in _modules()
               if not ast.get_docstring(ast.parse(p.read_text()))]  # fmt: skip
    assert missing == []


def _deferred_imports(tree: ast.AST) -> list[ast.stmt]:
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


def test_every_import_inside_a_function_gives_its_reason() -> None:
    """A deferred import must be deliberate (an optional or heavy dependency), and say so in a
    comment on its line or the line above; standard-library imports are exempt."""
    silent = []
    for path in _modules():
        lines = path.read_text().splitlines()
        for node in _deferred_imports(ast.parse("\n".join(lines))):
            name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            if (name or "").split(".")[0] in sys.stdlib_module_names:
                continue
            here, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
            if "#" not in here and not above.startswith("#"):
                silent.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {here.strip()}")
    assert silent == []
