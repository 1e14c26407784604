"""The error tree drawn in soul_runtime/errors.py is the tree of ``SoulError`` subclasses, no more, no less."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import actors
import soul_runtime
from soul_runtime import errors


def drawn_tree(doc: str) -> dict[str, str | None]:
    """{class name: its parent in the drawing} from the docstring's box drawing."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (column of the name, name)
    for line in doc.splitlines():
        m = re.match(r"(    [│├└─ ]*)([A-Z]\w*)\b", line)  # the drawing is the docstring's indented block
        if m is None:
            continue
        col, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= col:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((col, name))
    return parents


def real_tree() -> dict[str, str | None]:
    """{class name: its parent} for every public subclass of SoulError defined in soul_runtime or actors."""
    for pkg in (soul_runtime, actors):
        for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(mod.name)
    found: dict[str, str | None] = {"SoulError": None}
    todo: list[type] = [errors.SoulError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__name__.startswith("_") or not sub.__module__.startswith(("soul_runtime.", "actors.")):
                continue
            bases = [b for b in sub.__bases__ if issubclass(b, errors.SoulError)]
            assert len(bases) == 1, f"{sub.__name__} has {len(bases)} parents in the tree"
            assert found.setdefault(sub.__name__, bases[0].__name__) == bases[0].__name__, f"two {sub.__name__}"
            todo.append(sub)
    return found


def test_the_drawing_parses() -> None:
    tree = drawn_tree(errors.__doc__ or "")
    assert tree["SoulError"] is None and tree["ConfigError"] == "InvalidInput" and tree["AuthError"] == (
        "RuntimeUnavailable")
    assert tree["StorageError"] == "SoulError" and tree["Moved"] == "StaleOwner"


def test_the_drawn_tree_is_the_real_one() -> None:
    assert drawn_tree(errors.__doc__ or "") == real_tree()


def test_a_class_left_out_of_the_drawing_is_noticed() -> None:
    doc = (errors.__doc__ or "").replace("    │   └── ModelTimeout           ... by taking too long\n", "")
    assert "ModelTimeout" not in drawn_tree(doc) and drawn_tree(doc) != real_tree()


def fenced_drawing(text: str, first: str) -> str:
    """The box drawing that starts with the line ``first`` in a document, indented as the docstring's is."""
    lines = text.splitlines()
    start = lines.index(first)
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].strip() or lines[i].startswith("```"))
    return "\n".join("    " + ln for ln in lines[start:end])


def test_the_docs_and_the_typescript_client_draw_the_same_tree() -> None:
    root = Path(__file__).resolve().parents[1]
    docs = (root / "docs" / "python-api.md").read_text()
    assert drawn_tree(fenced_drawing(docs, "SoulError")) == real_tree()
    ts = (root / "clients" / "typescript" / "src" / "errors.ts").read_text()
    ts_lines = "\n".join(ln.removeprefix(" * ") for ln in ts.splitlines())
    drawing = fenced_drawing(ts_lines, next(ln for ln in ts_lines.splitlines() if ln.startswith("SoulError ")))
    assert drawn_tree(drawing) == real_tree()
    exported = set(re.findall(r"^export class (\w+) extends (\w+)", ts, re.M))
    assert {(name, parent) for name, parent in real_tree().items() if parent} == exported - {("SoulError", "Error")}
