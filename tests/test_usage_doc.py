"""docs/usage.md's minimal config, run as shown: it trains the demo model visibly, with the losses the page gives."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
import yaml
from paths import CONFIGS, ROOT

from trl_padfree.launch import main

USAGE = ROOT / "docs" / "usage.md"


@pytest.mark.parametrize("rate", [None, "2e-5"])
def test_the_minimal_config_trains_with_the_losses_the_page_shows(rate, tmp_path, in_root):
    section = USAGE.read_text(encoding="utf-8").split("## A config of your own", 1)[1]  # its yaml block
    text = re.search(r"```yaml\n(.*?)```", section, re.S)[1].replace("output_dir: outputs/mine",
                                                                    f"output_dir: {tmp_path / 'out'}")
    config = tmp_path / "mine.yaml"
    config.write_text(text, encoding="utf-8")
    extra = ["--learning_rate", rate] if rate else []
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["--config", str(config), *extra])
    assert code == 0, out.getvalue()[-3000:]
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text(encoding="utf-8"))["log_history"]
    logged = {e["step"]: e["loss"] for e in history if "loss" in e}
    shown = re.search(r"with it the loss logged after 10 and 30\s+steps of this config is ([\d.]+) and ([\d.]+), "
                      r"with 1e-3 \(the demo's rate\) ([\d.]+) and ([\d.]+)\.", USAGE.read_text(encoding="utf-8"))
    default_10, default_30, demo_10, demo_30 = map(float, shown.groups())
    expected = (default_10, default_30) if rate else (demo_10, demo_30)
    assert (logged[10], logged[30]) == pytest.approx(expected, abs=0.02)
    if not rate:  # the shown config sets the demo's rate, visibly trains; TRL's default rate barely does
        assert yaml.safe_load(text)["learning_rate"] == yaml.safe_load((CONFIGS / "demo.yaml").read_text())["learning_rate"] == 1e-3
        assert logged[30] < 6.0 < default_30
