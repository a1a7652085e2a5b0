"""Paths of the source checkout that the tests read (module-level constants, so that ``parametrize`` lists and
helper modules can use them too; fixtures are in ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
PACKAGE = ROOT / "trl_padfree"
DEMO = PACKAGE / "demo"  # the shipped demo assets
DEMO_MODEL = DEMO / "model"
CONFIGS = ROOT / "configs"
