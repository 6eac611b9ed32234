"""The package's import structure: importing a light module loads no heavy library, no module reaches another's
private name, and no import runs in a circle (top-level imports and imports inside functions alike)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"yolo_ckpt": ROOT / "yolo_ckpt", "benchmarks": ROOT / "benchmarks"}


def _modules() -> dict[str, Path]:
    """Every module of the package and of the studies in ``benchmarks/``, by its dotted name."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path):
    """``(module imported, names taken from it, line)`` for every import in the module, at any depth, relative ones
    resolved; ``module.attr`` reads of an imported package module count as taking ``attr``."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join([*base[: len(base) - node.level + 1], *([module] if module else [])])
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in MODULES:  # 'from . import engine': the module itself
                    aliases[alias.asname or alias.name] = sub
                    yield sub, (), node.lineno
                else:
                    yield module, (alias.name,), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), node.lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            yield aliases[node.value.id], (node.attr,), node.lineno


MODULES = _modules()


def test_light_modules_load_no_heavy_library():
    """``import yolo_ckpt.checkpointing.policy`` and ``yolo_ckpt.config`` (pure data and key checks) load neither Ultralytics nor
    scipy nor torch; the package's public names still import on first use."""
    code = (
        "import sys, yolo_ckpt.checkpointing.policy, yolo_ckpt.config, yolo_ckpt.errors\n"
        "print(sorted(m for m in ('ultralytics', 'scipy', 'torch') if m in sys.modules))\n"
        "from yolo_ckpt import CheckpointDetectionTrainer, apply_checkpointing\n"
        "print(CheckpointDetectionTrainer.__module__, apply_checkpointing.__module__, 'ultralytics' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.splitlines()
    assert out == ["[]", "yolo_ckpt.train.trainer yolo_ckpt.checkpointing.engine True"]


def test_public_names_resolve_and_unknown_names_raise():
    import yolo_ckpt

    assert all(getattr(yolo_ckpt, name) is not None for name in yolo_ckpt.__all__)
    assert set(yolo_ckpt.__all__) <= set(dir(yolo_ckpt))
    with pytest.raises(AttributeError, match="nothing"):
        yolo_ckpt.nothing  # noqa: B018


def test_no_module_imports_another_modules_private_name():
    """A module uses another module of the package through its public names only (``_name`` is the module's own)."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} takes {module}.{names[0]}"
        for name, path in MODULES.items()
        for module, names, line in _imports(name, path)
        if module in MODULES and module != name and names and names[0].startswith("_") and not names[0].startswith("__")
    ]
    assert bad == []


def test_no_import_cycle():
    """The package's modules import each other in one direction (imports inside functions count)."""
    graph = {name: {m for m, _, _ in _imports(name, path) if m in MODULES and m != name} for name, path in MODULES.items()}
    graph = {name: {m for m in deps if not name.startswith(m + ".") and m not in PACKAGES} for name, deps in graph.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join([*stack[stack.index(dep):], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_import_contracts_hold():
    """The rules of what may import what (docs/development.md) hold: import-linter's contracts in pyproject.toml
    (``[tool.importlinter]``, run as ``lint-imports``; the ``test`` extra installs it), on this checkout."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_wing_is_in_a_layer():
    """The layers contract places every top-level module and folder of the package, so a new wing gets a place in it."""
    from importlinter.api import read_configuration

    contracts = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    (layers,) = [c["layers"] for c in contracts if c["id"] == "wings"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    wings = {p.stem for p in PACKAGES["yolo_ckpt"].glob("*.py") if p.stem != "__init__"}
    wings |= {p.name for p in PACKAGES["yolo_ckpt"].iterdir() if (p / "__init__.py").is_file()}
    assert placed == wings


def _front_door_kept(extra_import: tuple[str, str] | None = None) -> bool:
    """Whether the ``memory-front-door`` contract of pyproject.toml holds on the package's import graph, with
    ``extra_import`` (importer, imported) added to it."""
    import grimp
    from importlinter.api import read_configuration
    from importlinter.contracts.forbidden import ForbiddenContract

    config = read_configuration(str(ROOT / "pyproject.toml"))
    (options,) = [c for c in config["contracts_options"] if c["id"] == "memory-front-door"]
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    if extra_import:
        graph.add_import(importer=extra_import[0], imported=extra_import[1])
    contract = ForbiddenContract(name=options["name"], session_options=config["session_options"], contract_options=options)
    return contract.check(graph, verbose=False).kept


def test_memory_front_door_breaks_when_bypassed():
    """Outside the memory wing its names come from ``yolo_ckpt.memory``: the contract holds on this checkout, breaks
    where a caller takes a name from one of the wing's modules (``cli.plan -> memory.step``, a study's
    ``-> memory.estimate``), and holds where the same name comes from the face."""
    assert _front_door_kept()
    assert not _front_door_kept(("yolo_ckpt.cli.plan", "yolo_ckpt.memory.step"))
    assert not _front_door_kept(("benchmarks.memory_model.breaker", "yolo_ckpt.memory.estimate"))
    assert _front_door_kept(("yolo_ckpt.cli.plan", "yolo_ckpt.memory"))


def test_memory_front_door_covers_every_other_wing():
    """The contract's sources are every wing of the package but memory, and the studies: a new wing goes through the
    face too."""
    from importlinter.api import read_configuration

    contracts = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    (sources,) = [c["source_modules"] for c in contracts if c["id"] == "memory-front-door"]
    wings = {p.stem for p in PACKAGES["yolo_ckpt"].glob("*.py") if p.stem != "__init__"}
    wings |= {p.name for p in PACKAGES["yolo_ckpt"].iterdir() if (p / "__init__.py").is_file()}
    assert set(sources) == {f"yolo_ckpt.{w}" for w in wings - {"memory"}} | {"benchmarks"}


def test_memory_face_names_resolve_lazily():
    """``yolo_ckpt.memory``'s public names each resolve to an object defined in a module of the wing (never a module:
    no public name is also a module's name), importing the face alone loads no torch, and an unknown name raises."""
    code = (
        "import sys, yolo_ckpt.memory as m\n"
        "print('torch' in sys.modules)\n"
        "print(sorted(n for n in m.__all__ if getattr(m, n).__class__.__name__ == 'module'))\n"
        "where = {n: getattr(getattr(m, n), '__module__', None) for n in m.__all__}\n"
        "print(sorted(n for n, w in where.items() if w is not None and not w.startswith('yolo_ckpt.memory.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.splitlines()
    assert out == ["False", "[]", "[]"]
    import yolo_ckpt.memory

    with pytest.raises(AttributeError, match="MemoryModelX"):
        yolo_ckpt.memory.MemoryModelX  # noqa: B018
