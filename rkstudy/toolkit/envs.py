"""The converter environments (host): the toolkit installed here, and any other rknn-toolkit2 version's
own environment (`.venv-rknn-<version>`), which a board with an older runtime needs engines from.

Kept apart from the build because the engine cache keys every engine by the toolkit that built it, and the
lever studies and doctor ask which toolkits exist without building anything.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

from ..errors import NeedsConverter
from ..paths import REPO
from ..tables.results import toolkit_version


def toolkit_available() -> bool:
    """rknn-toolkit2 is importable here (checked without importing it: it pulls torch)."""
    try:
        return importlib.util.find_spec("rknn") is not None and importlib.util.find_spec("rknn.api") is not None
    except (ImportError, ValueError):
        return False


def require_toolkit() -> None:
    if not toolkit_available():
        raise NeedsConverter("the RKNN toolkit (rknn-toolkit2) is not installed here: run `make toolkit` "
                             "(or pip install --no-deps rknn-toolkit2==2.5.0) on the host")


@dataclass(frozen=True)
class Toolkit:
    """A converter environment: the interpreter a build child runs, and the toolkit it imports
    ('rknn-toolkit2 2.3.2'; what keys the engine cache and what BuildReport.toolkit_version says)."""

    python: str
    version: str


def toolkit_env(version: str | None = None) -> Toolkit:
    """The environment that builds with rknn-toolkit2 `version`: this one when it is None or the
    version installed here, else `.venv-rknn-<version>` beside the code (made by `make toolkit-venv
    TOOLKIT=<version>`), whose toolkit is read from its installed metadata, not assumed from its name."""
    here = toolkit_version()
    if version is None or here == f"rknn-toolkit2 {version}":
        return Toolkit(sys.executable, here)
    venv = REPO / f".venv-rknn-{version}"
    found = sorted(venv.glob("lib/python*/site-packages/rknn_toolkit2-*.dist-info"))
    python = venv / "bin" / "python"
    if not found or not python.exists():
        raise NeedsConverter(f"rknn-toolkit2 {version} has no environment here ({venv.name} is missing): run "
                             f"`make toolkit-venv TOOLKIT={version}` ([tool.rkstudy] toolkits lists the versions)")
    return Toolkit(str(python), f"rknn-toolkit2 {found[-1].name.removesuffix('.dist-info').split('-', 1)[1]}")
