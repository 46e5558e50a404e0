"""Every file, folder and rkstudy module README.md names exists: a reader who follows a name finds it.
Outputs a run makes (build/, a board's results/board/ rows, the environments) and the board's system
paths are not in the repository, so they are not looked for."""

import importlib
import re

from rkstudy.paths import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
TOP = ("rkstudy", "notebooks", "results", "tests", "data", "research")
# written by a run, a board or make: not in a clone
MADE = ("build/", "results/board/", ".venv", "results/benchmarks/reproduce_diff.md")


def named_paths() -> set[str]:
    top = "|".join(TOP)
    words = re.findall(rf"(?<![\w./-])((?:{top})/[\w./<>*-]*[\w/])", README)
    return {w for w in words if not w.startswith(MADE)}


def named_modules() -> set[str]:
    return set(re.findall(r"(?<![\w./-])(rkstudy(?:\.\w+)+)", README)) | {
        "research." + m for m in re.findall(r"python -m research\.(\w+)", README)}


def test_every_path_the_readme_names_exists():
    paths = named_paths()
    assert len(paths) >= 20
    missing = []
    for path in sorted(paths):
        if "<" in path or "*" in path:  # a pattern: its folder must exist
            path = path.split("<")[0].split("*")[0].rsplit("/", 1)[0]
        if not (REPO / path).exists():
            missing.append(path)
    assert missing == []


def test_every_rkstudy_name_the_readme_uses_resolves():
    names = named_modules()
    assert len(names) >= 15
    unresolved = []
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes on it
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                unresolved.append(name)
            break
        else:
            unresolved.append(name)
    assert unresolved == []
