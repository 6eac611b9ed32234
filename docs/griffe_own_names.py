"""A griffe extension for the API reference (mkdocs.yml, mkdocstrings' python handler). The package is inspected (its
public names are lazy, PEP 562), and inspection reads a module's namespace: what it imports reads as its own, and a
constant reads its type's docstring (``int([x]) -> integer``). Here a module of the wings keeps only the names its source
defines (and its submodules), an inspected attribute loses its type's docstring, and a module constant is described by
its own comment (the comment lines right above it, then the one on its line). The package's root keeps its public
names, which its modules define."""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from functools import cache
from pathlib import Path

import griffe

ROOT = "yolo_ckpt"  # its public names (yolo_ckpt.__all__) are defined in the wings' modules: kept as they are


def _statements(body: list[ast.stmt]):
    """The module-level statements of ``body``, those inside its top-level ``if`` and ``try`` blocks included."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try)):
                yield from _statements(getattr(node, block, []))
        for handler in getattr(node, "handlers", []):
            yield from _statements(handler.body)


@cache
def defined_names(path: Path) -> frozenset[str]:
    """The names the Python file ``path`` defines at module level: its functions, classes and assigned names, not the
    names it imports (``try: import fcntl`` / ``except ImportError: fcntl = None`` imports ``fcntl``)."""
    names, imported = set(), set()
    for node in _statements(ast.parse(path.read_text()).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names.update(n.id for t in targets for n in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(n, ast.Name))
    return frozenset(names - imported)


@cache
def constant_comments(path: Path) -> dict[str, str]:
    """``{name: comment}`` of the module-level assignments in the Python file ``path`` that have a comment: the
    comment lines right above the assignment, then the one on its first line, joined with a space."""
    source = path.read_text()
    comments = {t.start[0]: t.string.lstrip("#").strip() for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT}
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names = [n.id for t in targets for n in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(n, ast.Name)]
        above, line = [], node.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        trailing = node.lineno in comments and not lines[node.lineno - 1].lstrip().startswith("#")
        text = " ".join([*above, *([comments[node.lineno]] if trailing else [])])
        found.update(dict.fromkeys(names, text) if text else {})
    return found


class OwnNames(griffe.Extension):
    """A module of the wings with only the names it defines; attributes without their type's docstring; a module
    constant described by its comment."""

    def on_attribute_instance(self, *, node, attr: griffe.Attribute, agent, **kwargs) -> None:
        if not isinstance(node, griffe.ObjectNode):
            return
        type_doc = type(node.obj).__doc__
        if attr.docstring is not None and isinstance(type_doc, str) and attr.docstring.value == inspect.cleandoc(type_doc):
            attr.docstring = None
        if not attr.parent or not attr.parent.is_module:
            return
        path = attr.parent.filepath
        if attr.docstring is None and isinstance(path, Path) and path.suffix == ".py":
            comment = constant_comments(path).get(attr.name)
            if comment:
                attr.docstring = griffe.Docstring(comment, parent=attr, parser=agent.docstring_parser,
                                                  parser_options=agent.docstring_options)

    def on_module_members(self, *, node, mod: griffe.Module, agent, **kwargs) -> None:
        path = mod.filepath
        if mod.path == ROOT or not isinstance(path, Path) or path.suffix != ".py":
            return
        own, child = defined_names(path), f"{mod.path}."
        for name, member in list(mod.members.items()):
            submodule = (member.target_path if member.is_alias else member.path) == child + name and member.is_module
            if name not in own and not submodule:
                mod.del_member(name)
