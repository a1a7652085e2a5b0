"""The package as a user installs it: the licence, the demo from an installed wheel outside the repository, the core
without the launch and without matplotlib."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from paths import DEMO, ROOT

from trl_padfree import cli


def test_pyproject_declares_the_apache_2_licence_text_and_puts_matplotlib_in_the_bench_extra():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    dependencies = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "matplotlib" not in dependencies
    assert re.search(r'^bench = \["matplotlib>=3\.7"\]', pyproject, re.M)
    assert re.search(r'^dev = \[.*"matplotlib>=3\.7".*\]', pyproject, re.M)
    assert 'include = ["trl_padfree*"]' in pyproject  # benchmarks/ is not a package of the wheel
    assert re.findall(r'^license = "(.*)"$', pyproject, re.M) == ["Apache-2.0"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "9. Accepting Warranty or Additional Liability." in text and "END OF TERMS AND CONDITIONS" in text
    assert len(text.split()) > 1500  # the full text (about 1,580 words), not a notice pointing at it


@pytest.mark.parametrize("name", ["demo", "demo-chat", "demo-dpo"])
def test_the_packaged_demo_configs_are_the_repository_ones(name):
    packaged = (DEMO / "configs" / f"{name}.yaml").read_bytes()
    assert packaged == (ROOT / "configs" / f"{name}.yaml").read_bytes(), (
        f"configs/{name}.yaml changed: copy it to trl_padfree/demo/configs/{name}.yaml (the installed demo)")


def test_the_installed_wheel_runs_the_demo_from_any_directory(tmp_path):
    # `pip wheel --no-deps` of a copy of the package (the repository itself gets no build/ or egg-info)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "trl_padfree", src / "trl_padfree", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(src)], check=True, timeout=300)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("trl_padfree-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"trl_padfree/demo/configs/demo.yaml", "trl_padfree/demo/model/model.safetensors",
            "trl_padfree/demo/data/train.jsonl"} <= names  # fmt: skip
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith(("benchmarks/", "trl_padfree/bench/"))]  # the bench stays out

    # a fresh venv that sees the test environment's dependencies (torch, transformers, ...) but not this checkout:
    # a .pth line adds their site-packages after its own, without running the editable install's hook there
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = (venv / "lib").glob("python*/site-packages")
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz_test_dependencies.pth").write_text("\n".join(deps) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)  # fmt: skip

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import trl_padfree; print(trl_padfree.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    assert where.stdout.strip().startswith(str(site)), where.stdout  # the wheel's copy, not the checkout
    bench = subprocess.run(["trl-padfree", "bench", "--task", "sft"], cwd=work, env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert (bench.returncode, bench.stdout) == (2, "")
    assert bench.stderr == cli.BENCH_MISSING + "\n"  # one line: how to get the benchmark

    run = subprocess.run(["trl-padfree", "train", "--config", "demo", "--max_steps", "3", "--max_train_examples", "32",
                          "--max_eval_examples", "8", "--eval_steps", "3", "--eval_on_start", "false",
                          "--logging_steps", "1", "--output_dir", "run"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "steps: 3/3" in run.stdout and "model saved to run" in run.stdout
    assert "eval loss: " in run.stdout  # the eval file, too, came from the package
    assert (work / "run" / "model.safetensors").is_file() and (work / "run" / "launch_summary.json").is_file()
    assert not (ROOT / "run").exists()


NO_MATPLOTLIB = """
import importlib.abc, sys

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"{name} is blocked: the package must not need it")
        return None

sys.meta_path.insert(0, Blocker())
try:
    import matplotlib  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the blocker let matplotlib through")
# every module of the core loads without the layers on top (the command line, the launch, the bench)
import importlib, pkgutil, trl_padfree
top = ("trl_padfree.cli", "trl_padfree.check", "trl_padfree.launch", "trl_padfree.bench")
for module in pkgutil.iter_modules(trl_padfree.__path__, "trl_padfree."):
    if not module.name.startswith(top):
        importlib.import_module(module.name)
assert not [m for m in sys.modules if m.startswith(top)], "the core imported a layer on top"
from trl_padfree.cli import main
code = main(sys.argv[1:])
assert not [m for m in sys.modules if m.split(".")[0] in ("matplotlib", "benchmarks")], "imported"
sys.exit(code)
"""


def test_the_package_imports_and_trains_without_matplotlib(tmp_path):
    """matplotlib is the ``bench`` extra's: every core module (loading no layer on top) and two SFT steps run with
    ``import matplotlib`` refused by a meta-path blocker (checked to block)."""
    run = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, "train", "--config", "demo", "--max_steps", "2",
                          "--max_train_examples", "16", "--max_eval_examples", "4", "--eval_steps", "2",
                          "--eval_on_start", "false", "--logging_steps", "1", "--output_dir", str(tmp_path / "run")],
                         cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "steps: 2/2" in run.stdout and (tmp_path / "run" / "model.safetensors").is_file()
