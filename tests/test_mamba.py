"""Mamba and Mamba-2 layers on a packed row (trl_padfree/recurrent/mamba.py): transformers' torch scans wrapped by
``KERNELS`` vs each sequence alone (values, gradients); tiny models with fewer boundary keys, other lengths,
checkpointing, unpatched, a cache refused."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np
import pytest
import torch
import transformers
from packaging.version import Version
from tiny_models import tiny_family
from transformers import CONFIG_MAPPING

from trl_padfree.families import EXACTNESS_LENGTHS, packed_vs_alone
from trl_padfree.probe import packed_batch, random_sequences
from trl_padfree.recurrent import conv as conv_module
from trl_padfree.recurrent import hub_function, mamba, prepare_packed_config, prepare_packed_layers

LENGTHS = [7, 5, 9]  # with chunk_size 4: sequences that span chunks and start inside one
SKEWED = [13, 1, 2, 1]  # two batches of sequences: the 13 with the 2, the two 1s (trl_padfree/recurrent/mamba.py)


def _kernel(family: str, name: str, kernels: dict | None = None) -> tuple[Callable, Callable]:
    """(transformers' torch function, its packed replacement); skipped where a kernel package replaced it."""
    if family not in CONFIG_MAPPING:
        pytest.skip(f"{family} is not in this transformers")
    function = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name)
    function = getattr(function, "__trl_padfree_original__", function)  # where an earlier test prepared the module
    function = hub_function(function)  # the function under a `kernels` layer, where that package is installed
    if function.__code__.co_filename.endswith("hub_kernels.py"):
        closure = dict(zip(function.__code__.co_freevars, function.__closure__ or (), strict=True))
        if "is_new_implementation" in closure and closure["is_new_implementation"].cell_contents:
            pytest.skip(f"{function.__name__}: a kernel package is installed")
    return function, (kernels or mamba.KERNELS)[name](function)


def _seq_idx(lengths: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))[None]


def _compare(run: Callable, inputs: dict, time_dims: dict[str, int], lengths: list[int] = LENGTHS,
             **packing: torch.Tensor) -> None:
    """``run`` on the packed inputs vs on each sequence's slice: outputs and every input's gradient."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
    packed = run(**leaves, **packing)
    weight = torch.randn(packed.shape, generator=torch.Generator().manual_seed(5))
    (packed * weight).sum().backward()
    packed_grads = {k: v.grad.clone() for k, v in leaves.items()}
    for v in leaves.values():
        v.grad = None
    cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    alone = torch.cat([run(**{k: v.narrow(time_dims[k], a, b - a) if k in time_dims else v for k, v in leaves.items()})
                       for a, b in zip(cu[:-1], cu[1:], strict=True)], time_dims["out"])
    (alone * weight).sum().backward()
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-6)
    for k, v in leaves.items():
        assert (packed_grads[k] - v.grad).norm() / v.grad.norm().clamp_min(1e-12) < 1e-5, k


def _chunk_inputs(lengths: list[int] = LENGTHS, heads: int = 4, head_dim: int = 3, groups: int = 2,
                  state: int = 5) -> dict[str, torch.Tensor]:
    g, t = torch.Generator().manual_seed(0), sum(lengths)
    return {"hidden_states": torch.randn(1, t, heads, head_dim, generator=g), "dt": torch.randn(1, t, heads, generator=g),
            "A": -torch.rand(heads, generator=g) - 0.5, "B": torch.randn(1, t, groups, state, generator=g),
            "C": torch.randn(1, t, groups, state, generator=g), "D": torch.randn(heads, generator=g),
            "dt_bias": torch.randn(heads, generator=g)}


@pytest.mark.parametrize(("packing", "lengths"),
                         [("seq_idx", LENGTHS), ("cu_seqlens", LENGTHS), ("cu_seq_lens_q", LENGTHS), ("seq_idx", SKEWED)])
def test_chunk_scan_packed_equals_each_sequence(packing: str, lengths: list[int]) -> None:
    _, scan = _kernel("bamba", "mamba2_chunk_scan")
    given = _seq_idx(lengths) if packing == "seq_idx" else torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    _compare(lambda **kw: scan(**kw, chunk_size=4, dt_softplus=True, dt_limit=(0.0, float("inf"))),
             _chunk_inputs(lengths), {"hidden_states": 1, "dt": 1, "B": 1, "C": 1, "out": 1}, lengths, **{packing: given})


def test_chunk_scan_without_packing_is_transformers_torch_reference_and_refuses_a_cache_or_other_boundaries() -> None:
    original, scan = _kernel("mamba2", "mamba2_chunk_scan")
    inputs = _chunk_inputs()
    kwargs = dict(chunk_size=4, dt_softplus=True, return_final_states=True)
    (ours, ours_state), (theirs, their_state) = scan(**inputs, **kwargs), original(**inputs, **kwargs)
    assert torch.equal(ours, theirs) and torch.equal(ours_state, their_state)
    with pytest.raises(ValueError, match="can't keep packed sequences apart"):
        original(**inputs, chunk_size=4, seq_idx=_seq_idx(LENGTHS))
    # the reset matters: the row scanned whole differs after the first boundary
    packed, whole = scan(**inputs, chunk_size=4, seq_idx=_seq_idx(LENGTHS)), original(**inputs, chunk_size=4)
    torch.testing.assert_close(packed[:, : LENGTHS[0]], whole[:, : LENGTHS[0]])
    assert (packed[:, LENGTHS[0] :] - whole[:, LENGTHS[0] :]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="mamba2_chunk_scan: a packed row cannot continue or keep a recurrent "
                                         "cache; pass use_cache=False"):
        scan(**_chunk_inputs(), chunk_size=4, seq_idx=_seq_idx(LENGTHS), return_final_states=True)
    with pytest.raises(ValueError, match=r"do not cover the layer's 1 x 21 tokens: pass the cumulative lengths"):
        scan(**_chunk_inputs(), chunk_size=4, cu_seqlens=torch.tensor([0, 7, 20], dtype=torch.int32))


def test_layout_groups_bound_the_padding() -> None:
    """One long sequence and many short ones: the short ones are not padded to the long one's length."""
    lengths = [64, 3, 5, 2, 4, 60, 1, 7]
    layout = mamba.packed_layout({"seq_idx": _seq_idx(lengths)}, 1, sum(lengths))
    assert sum(index.numel() for index, _ in layout.groups) <= 2 * sum(lengths) and len(layout.groups) == 2
    x = torch.randn(1, sum(lengths), 3)
    parts = layout.unpack(x, 1)
    assert torch.equal(layout.repack(parts, 1), x)
    sequences = []
    for part, (index, valid) in zip(parts, layout.groups, strict=True):
        for row, slots, real in zip(part, index, valid, strict=True):
            tokens = slots[real].tolist()
            assert tokens == list(range(tokens[0], tokens[0] + len(tokens)))  # one sequence, in order, from its start
            sequences.append((tokens[0], tokens[-1] + 1))
            assert torch.equal(row[real], x[0, tokens]) and not row[~real].any()  # padding: zeros after it
    cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    assert sorted(sequences) == list(zip(cu[:-1], cu[1:], strict=True))


def test_selective_scan_and_causal_conv1d_packed_equal_each_sequence() -> None:
    original, scan = _kernel("jamba", "mamba_selective_scan")
    g, t, channels, state = torch.Generator().manual_seed(1), sum(LENGTHS), 6, 4
    inputs = {"hidden_states": torch.randn(1, channels, t, generator=g), "dt": torch.randn(1, channels, t, generator=g),
              "A": -torch.rand(channels, state, generator=g) - 0.5, "B": torch.randn(1, state, t, generator=g),
              "C": torch.randn(1, state, t, generator=g), "D": torch.randn(channels, generator=g),
              "z": torch.randn(1, channels, t, generator=g), "delta_bias": torch.randn(channels, generator=g)}
    _compare(lambda **kw: scan(**kw, delta_softplus=True), inputs,
             {"hidden_states": 2, "dt": 2, "B": 2, "C": 2, "z": 2, "out": 2}, seq_idx=_seq_idx(LENGTHS))
    assert torch.equal(scan(**inputs, delta_softplus=True), original(**inputs, delta_softplus=True))
    _, conv = _kernel("bamba", "causal_conv1d_fn", conv_module.KERNELS)
    g = torch.Generator().manual_seed(2)
    inputs = {"hidden_states": torch.randn(1, 6, sum(LENGTHS), generator=g), "weight": torch.randn(6, 4, generator=g),
              "bias": torch.randn(6, generator=g)}
    _compare(lambda **kw: conv(**kw, activation="silu"), inputs, {"hidden_states": 2, "out": 2}, seq_idx=_seq_idx(LENGTHS))


def test_fused_forms_fall_back_to_the_unfused_path_when_packed() -> None:
    _, fused = _kernel("bamba", "mamba2_split_conv1d_scan_combined")
    assert fused(torch.zeros(1, 3, 8), None, None, None, None, None, 4, seq_idx=_seq_idx([2, 1])) is None


def _tiny(family: str, checkpointing: bool = False, prepare: bool = True) -> torch.nn.Module:
    model = tiny_family(family)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if prepare:
        prepare_packed_layers(model)  # what the trainers do: kernels that restart at boundaries, patch_model
    return model


NO_SEQ_IDX = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
MODEL_CASES = {  # family, the batch's keys, lengths, gradient checkpointing
    **{f"{f}-cu_seq_lens": (f, NO_SEQ_IDX, EXACTNESS_LENGTHS, False) for f in ("bamba", "jamba", "mamba2")},
    **{f"{f}-position_ids": (f, ("position_ids",), EXACTNESS_LENGTHS, False) for f in ("jamba", "mamba2", "zamba2")},
    # equal lengths (one padding slot more: never the row's token count) and skewed ones (two batches of sequences)
    **{f"{f}-{n}": (f, None, lengths, False) for f in ("bamba", "jamba")
       for n, lengths in (("equal", (6, 6, 6)), ("skewed", (19, 2, 3, 2)))},
    # a checkpointed layer recomputes with the same boundaries (arguments, not state)
    **{f"{f}-checkpointing": (f, None, EXACTNESS_LENGTHS, True) for f in ("jamba", "mamba2")},
}


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_tiny_model_packed_equals_each_example_alone(case: str) -> None:
    """Packed vs each example alone, loss and every gradient (the packed batch reduced to the case's keys)."""
    family, keys, lengths, checkpointing = MODEL_CASES[case]
    batch = None
    if keys is not None:
        full = packed_batch(random_sequences(lengths, 128, 0, 0))
        batch = {k: full[k] for k in ("input_ids", "labels", "use_cache", *keys)}
    result = packed_vs_alone(_tiny(family, checkpointing=checkpointing), lengths, batch=batch)
    assert result.exact(), result


@pytest.mark.parametrize("family", ["jamba", "mamba2"])
def test_unpatched_jamba_and_mamba2_are_not_exact(family: str) -> None:
    """Kernels replaced but no patch_model: these scan across a row's examples (or refuse the row); from
    transformers 5.25 on, Mamba2ForCausalLM passes the collator's ``seq_idx`` down to its mixers, so its kernels
    alone suffice. The kernels are replaced here, as "padfree"'s mask builder does (Mamba-2 has no attention to call
    it), not left to whether an earlier test prepared the modeling module (a module global, kept)."""
    model = _tiny(family, prepare=False)
    prepare_packed_config(model.config)
    try:
        result = packed_vs_alone(model)
    except ValueError as refused:
        assert "cannot tell its sequences apart" in str(refused)
    else:
        if family == "mamba2" and Version(transformers.__version__) >= Version("5.25"):
            assert result.loss_diff < 1e-5, result
        else:
            assert result.loss_diff > 1e-5, result  # patched: < 1e-7


def test_patch_model_is_idempotent_and_names_what_it_patched() -> None:
    model = _tiny("jamba", prepare=False)
    names = mamba.patch_model(model)
    assert "model.layers.0.mamba (JambaMambaMixer: each sequence alone)" in names
    assert "model.layers.0 (JambaMambaDecoderLayer: boundaries for its mixer)" in names
    assert "model (JambaModel: seq_idx for its layers)" in names
    assert "(JambaForCausalLM call: the row boundaries)" in names
    assert mamba.patch_model(model) == []


def test_packed_row_with_a_cache_is_refused() -> None:
    batch = packed_batch(random_sequences(EXACTNESS_LENGTHS, 128, 0, 0))
    with pytest.raises(ValueError, match="use_cache=False"):
        _tiny("bamba")(**{k: v for k, v in batch.items() if k != "labels"} | {"use_cache": True})
