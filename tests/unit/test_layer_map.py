"""The layer map has one source: the import-linter contract in pyproject.toml. The copy in
docs/architecture/modules.md must repeat it, and every module but the base ones lives in a
subsystem folder. The module tree drawn in that chapter (the only drawing of it) must name every
folder and module of the package, and nothing the package does not have."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "docs" / "architecture" / "modules.md"
BASE_MODULES = {
    "__init__.py",
    "errors.py",
    "clock.py",
    "options.py",
    "keys.py",
    "embedded.py",
    "limits.py",
    "pid_liveness.py",
    "process_pool.py",
    "extras.py",
}
# A name in the drawing: a module (`name.py`) or a folder (`name/`).
NAME = re.compile(r"^[A-Za-z0-9_]+(\.py|/)$")


def contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [
        " | ".join(p.strip().removeprefix("tabletstore.") for p in layer.split("|"))
        for layer in layers
    ]


def test_architecture_repeats_the_contract() -> None:
    block = re.search(r"<!-- layers: .*?-->\n```\n(.*?)```", CHAPTER.read_text(), re.S)
    assert block is not None, f"{CHAPTER.relative_to(ROOT)} has lost its layers block"
    assert block.group(1).split("\n")[:-1] == contract_layers()


def test_every_subsystem_folder_is_a_layer_and_no_module_sits_loose() -> None:
    package = ROOT / "tabletstore"
    folders = {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    named = {name for layer in contract_layers() for name in layer.split(" | ")}
    assert folders <= named, f"folders missing from the layer map: {sorted(folders - named)}"
    loose = {p.name for p in package.glob("*.py")} - BASE_MODULES
    assert not loose, f"modules outside a subsystem folder: {sorted(loose)}"


def drawn_tree(text: str) -> set[str]:
    """The paths the drawing names, relative to the package: `engine/`, `engine/tablet.py`.

    A line of names (each `x.py` or `x/`, one space apart, before any two-space gap and its
    description) at indent 2k belongs to the folder drawn last at indent 2k-2; other lines are
    descriptions. The tree ends at the first line back at indent 0 (functions/, infra/...)."""
    block = re.search(r"<!-- module tree: .*?-->\n```\n(.*?)```", text, re.S)
    assert block is not None, f"{CHAPTER.relative_to(ROOT)} has lost its module tree"
    lines = block.group(1).split("\n")
    assert lines[0] == "tabletstore/", "the module tree must start with a line `tabletstore/`"
    folders = {0: ""}
    drawn: set[str] = set()
    for line in lines[1:]:
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            break
        names = line.strip().split("  ")[0].split(" ")
        if not all(NAME.match(n) for n in names) or indent - 2 not in folders:
            continue
        parent = folders[indent - 2]
        for name in names:
            drawn.add(parent + name)
            if name.endswith("/"):
                folders = {d: f for d, f in folders.items() if d < indent}
                folders[indent] = parent + name
    return drawn


def package_tree() -> set[str]:
    package = ROOT / "tabletstore"
    found: set[str] = set()
    for path in package.rglob("*"):
        rel = path.relative_to(package)
        if "__pycache__" in rel.parts:
            continue
        if path.is_dir():
            found.add(f"{rel.as_posix()}/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            found.add(rel.as_posix())
    return found


def test_the_module_tree_drawing_matches_the_package() -> None:
    drawn, actual = drawn_tree(CHAPTER.read_text()), package_tree()
    missing, extra = sorted(actual - drawn), sorted(drawn - actual)
    problems = []
    if missing:
        problems.append("add to the drawing (in the package, not drawn): " + ", ".join(missing))
    if extra:
        problems.append("remove from the drawing (drawn, not in the package): " + ", ".join(extra))
    assert not problems, (
        f"the module tree in {CHAPTER.relative_to(ROOT)} is out of date; "
        "each module goes on the module line under its folder's line\n" + "\n".join(problems)
    )


def test_the_drawing_check_sees_additions_and_removals() -> None:
    text = CHAPTER.read_text()
    assert "    cells.py compaction.py" in text
    assert "engine/cells.py" in drawn_tree(text)
    without = drawn_tree(text.replace("    cells.py compaction.py", "    compaction.py"))
    assert "engine/cells.py" not in without
    with_extra = drawn_tree(
        text.replace("    cells.py compaction.py", "    cells.py bogus.py compaction.py")
    )
    assert "engine/bogus.py" in with_extra
