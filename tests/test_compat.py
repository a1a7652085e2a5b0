"""The supported TRL / transformers window: declared the same everywhere."""

from __future__ import annotations

import re

from paths import ROOT

from trl_padfree import _compat


def test_declared_window_is_the_one_the_code_and_the_lowest_run_use():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"trl>={_compat.MIN_TRL},<2",' in pyproject
    cap = re.search(rf'"transformers>={re.escape(_compat.MIN_TRANSFORMERS)},<5\.(\d+)",', pyproject)
    assert cap, "transformers is capped below its first untested minor release"
    newest = f"5.{int(cap[1]) - 1}"  # the newest tested release
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(rf"LOWEST_PINS\s*:=.*trl=={re.escape(_compat.MIN_TRL)}\.0 "
                     rf"transformers=={re.escape(_compat.MIN_TRANSFORMERS)}\.0", makefile)
    readme = f"trl ≥ {_compat.MIN_TRL}, < 2, transformers {_compat.MIN_TRANSFORMERS}–{newest}"
    usage = f"trl ≥ {_compat.MIN_TRL}, < 2 with transformers ≥ {_compat.MIN_TRANSFORMERS}, < 5.{cap[1]}"
    assert readme in (ROOT / "README.md").read_text(encoding="utf-8")
    assert usage in (ROOT / "docs/usage.md").read_text(encoding="utf-8")
    assert _compat.TRL_VERSION >= _compat.Version(_compat.MIN_TRL)
    assert _compat.TRANSFORMERS_VERSION >= _compat.Version(_compat.MIN_TRANSFORMERS)
