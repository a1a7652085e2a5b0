"""attn_implementation auto's fall-back, one home for `trl-padfree check` and `trl-padfree train`."""

from __future__ import annotations

import pytest
from tiny_models import GPT_NEO, MPT, save_tiny_model

from trl_padfree.attn_fallback import ModelLoadError, load_with_fallback
from trl_padfree.check import main as check_main
from trl_padfree.testing import tiny_llama

CPU32 = ["--dtype", "float32", "--device", "cpu"]


def _recording(results: dict[str | None, object]):  # noqa: ANN202
    calls: list[str | None] = []

    def load(name: str | None) -> object:
        calls.append(name)
        result = results[name]
        if isinstance(result, Exception):
            raise result
        return result

    return load, calls


def test_a_model_is_loaded_again_with_its_default_only_when_it_never_calls_padfree_or_fails_to_load() -> None:
    import trl_padfree.attention  # noqa: F401  (registers "padfree")

    calls_it, ignores_it, default = tiny_llama(attn_implementation="padfree"), tiny_llama(attn_implementation="sdpa"), object()
    load, calls = _recording({"padfree": calls_it})
    whys: list[str] = []
    assert load_with_fallback(load, "padfree", auto=True, on_fallback=whys.append) is calls_it
    assert (calls, whys) == (["padfree"], [])
    load, calls = _recording({"padfree": ignores_it, None: default})
    assert load_with_fallback(load, "padfree", auto=True, on_fallback=whys.append) is default
    assert calls == ["padfree", None]
    assert whys == ["its attention code does not go through transformers' AttentionInterface"]
    # a process without the real weights (inspect false) keeps what it loaded
    load, calls = _recording({"padfree": ignores_it})
    assert load_with_fallback(load, "padfree", auto=True, on_fallback=whys.append, inspect=lambda m: False) is ignores_it
    # a failing second load is a ModelLoadError with its own reason
    load, calls = _recording({"padfree": KeyError("padfree"), None: OSError("no\n config.json")})
    with pytest.raises(ModelLoadError, match="^no config.json$"):
        load_with_fallback(load, "padfree", auto=True, on_fallback=whys.append)
    assert calls == ["padfree", None] and whys[-1].startswith("it fails to load with it (its modeling code has no")


@pytest.mark.parametrize(("attn", "auto"), [("padfree", False), ("sdpa", True), (None, True)])
def test_no_fall_back_unless_auto_picked_padfree(attn: str | None, auto: bool) -> None:
    load, calls = _recording({attn: KeyError("padfree")})
    whys: list[str] = []
    with pytest.raises(ModelLoadError, match="has no attention class" if attn == "padfree" else "'padfree'"):
        load_with_fallback(load, attn, auto=auto, on_fallback=whys.append)
    assert (calls, whys) == ([attn], [])


@pytest.mark.parametrize(("model_type", "sizes", "code", "why", "verdict"), [
    ("gpt_neo", GPT_NEO, 0, "it fails to load with it (its modeling code has no attention", "SAFE"),
    ("mpt", MPT, 1, "its attention code does not go through transformers' ", "LEAKS"),  # eager mixes examples
])
def test_check_auto_falls_back_for_a_model_that_cannot_use_padfree(tmp_path, capsys, model_type, sizes, code, why,
                                                                  verdict) -> None:  # noqa: ANN001
    path = str(save_tiny_model(tmp_path / model_type, model_type, sizes))
    assert check_main(["--model", path, *CPU32]) == code
    out = capsys.readouterr().out
    assert f"note: {path} cannot use 'padfree' ({why}" in out and f"{verdict}: {model_type} (attn_implementation='eager'" in out
