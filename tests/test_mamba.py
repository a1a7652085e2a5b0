"""Mamba and Mamba-2 layers on a packed row (trl_padfree/recurrent/mamba.py): each sequence as if alone.

Kernel level: transformers' torch scans (the fallbacks of ``integrations/hub_kernels.py``) wrapped by ``KERNELS``,
on a packed row vs each sequence alone, values and gradients. Model level: one tiny model per family, the
collator's packed row under ``attn_implementation="padfree"`` vs each example alone: loss within 1e-5 and every
gradient within 1e-4 (relative).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

import trl_padfree  # noqa: F401  (registers "padfree")
from trl_padfree.flattening import packed_batch
from trl_padfree.recurrent import mamba

LENGTHS = [7, 5, 9]  # with chunk_size 4: sequences that span chunks and start inside one
SKEWED = [
    13,
    1,
    2,
    1,
]  # two batches of sequences: the 13 with the 2, the two 1s (trl_padfree/recurrent/mamba.py)
VOCAB = 64


def _modeling(family: str) -> Any:
    if family not in CONFIG_MAPPING:
        pytest.skip(f"{family} is not in this transformers")
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def _torch_fallback(function: Callable) -> Callable:
    """transformers' torch function (skip where a kernel package replaced it), also where an earlier test prepared
    its modeling module (``trl_padfree.recurrent`` keeps the function it replaced)."""
    function = getattr(function, "__trl_padfree_original__", function)
    if function.__code__.co_filename.endswith("hub_kernels.py"):
        closure = dict(zip(function.__code__.co_freevars, function.__closure__ or (), strict=True))
        if "is_new_implementation" in closure and closure["is_new_implementation"].cell_contents:
            pytest.skip(f"{function.__name__}: a kernel package is installed")
    return function


def _apply(monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module) -> list[str]:
    """The recurrent mechanism (``trl_padfree.recurrent.prepare_packed_layers``) where it exists; else what it does
    with this module (transformers' torch fallbacks replaced, then ``patch_model``), undone after the test."""
    try:
        from trl_padfree.recurrent import prepare_packed_layers
    except ImportError:
        pass
    else:
        return prepare_packed_layers(model)
    kernels = mamba.KERNELS | mamba._conv_kernels()
    done = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        namespace = sys.modules[name]
        for key, factory in kernels.items():
            original = getattr(namespace, key, None)
            if original is not None and not hasattr(original, "padfree_original"):
                monkeypatch.setattr(namespace, key, factory(_torch_fallback(original)))
                done.append(f"{name}.{key}")
    return done + mamba.patch_model(model)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _seq_idx(lengths: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))[None]


def _compare(
    run: Callable[..., torch.Tensor],
    inputs: dict[str, torch.Tensor],
    time_dims: dict[str, int],
    lengths: list[int] = LENGTHS,
    **packing: torch.Tensor,
) -> None:
    """``run`` on the packed inputs vs on each sequence's slice: outputs and every input's gradient."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
    packed = run(**leaves, **packing)
    weight = torch.randn(packed.shape, generator=torch.Generator().manual_seed(5))
    (packed * weight).sum().backward()
    packed_grads = {k: v.grad.clone() for k, v in leaves.items()}
    for v in leaves.values():
        v.grad = None
    cu = np.concatenate([[0], np.cumsum(lengths)])
    out_dim = time_dims["out"]
    alone_outs = []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        sliced = {
            k: v.narrow(time_dims[k], int(a), int(b - a)) if k in time_dims else v for k, v in leaves.items()
        }
        alone_outs.append(run(**sliced))
    alone = torch.cat(alone_outs, out_dim)
    (alone * weight).sum().backward()
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-6)
    for k, v in leaves.items():
        assert _rel(packed_grads[k], v.grad) < 1e-5, k


def _chunk_inputs(
    lengths: list[int] = LENGTHS, heads: int = 4, head_dim: int = 3, groups: int = 2, state: int = 5
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = sum(lengths)
    return {
        "hidden_states": torch.randn(1, t, heads, head_dim, generator=g),
        "dt": torch.randn(1, t, heads, generator=g),
        "A": -torch.rand(heads, generator=g) - 0.5,
        "B": torch.randn(1, t, groups, state, generator=g),
        "C": torch.randn(1, t, groups, state, generator=g),
        "D": torch.randn(heads, generator=g),
        "dt_bias": torch.randn(heads, generator=g),
    }


CHUNK_TIME = {"hidden_states": 1, "dt": 1, "B": 1, "C": 1, "out": 1}


@pytest.mark.parametrize(
    ("packing", "lengths"),
    [("seq_idx", LENGTHS), ("cu_seqlens", LENGTHS), ("cu_seq_lens_q", LENGTHS), ("seq_idx", SKEWED)],
)
def test_chunk_scan_packed_equals_each_sequence(packing: str, lengths: list[int]) -> None:
    original = _torch_fallback(_modeling("bamba").mamba2_chunk_scan)
    scan = mamba.KERNELS["mamba2_chunk_scan"](original)

    def run(**kw: Any) -> torch.Tensor:
        return scan(**kw, chunk_size=4, dt_softplus=True, dt_limit=(0.0, float("inf")))

    seq_idx = _seq_idx(lengths)
    given = seq_idx if packing == "seq_idx" else torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    _compare(run, _chunk_inputs(lengths), CHUNK_TIME, lengths, **{packing: given})


def test_chunk_scan_without_packing_is_transformers_torch_reference() -> None:
    original = _torch_fallback(_modeling("mamba2").mamba2_chunk_scan)
    scan = mamba.KERNELS["mamba2_chunk_scan"](original)
    inputs = _chunk_inputs()
    kwargs = dict(chunk_size=4, dt_softplus=True, return_final_states=True)
    ours, ours_state = scan(**inputs, **kwargs)
    theirs, their_state = original(**inputs, **kwargs)
    assert torch.equal(ours, theirs) and torch.equal(ours_state, their_state)
    # what the replacement is for: transformers' torch reference refuses packed rows
    with pytest.raises(ValueError, match="can't keep packed sequences apart"):
        original(**inputs, chunk_size=4, seq_idx=_seq_idx(LENGTHS))


def test_chunk_scan_packed_is_not_the_row_scan() -> None:
    """The reset matters: the row scanned whole differs after the first boundary."""
    original = _torch_fallback(_modeling("bamba").mamba2_chunk_scan)
    scan = mamba.KERNELS["mamba2_chunk_scan"](original)
    inputs = _chunk_inputs()
    packed = scan(**inputs, chunk_size=4, seq_idx=_seq_idx(LENGTHS))
    whole = original(**inputs, chunk_size=4)
    torch.testing.assert_close(packed[:, : LENGTHS[0]], whole[:, : LENGTHS[0]])
    assert (packed[:, LENGTHS[0] :] - whole[:, LENGTHS[0] :]).abs().max() > 1e-2


def test_chunk_scan_packed_refuses_a_cache() -> None:
    scan = mamba.KERNELS["mamba2_chunk_scan"](_torch_fallback(_modeling("bamba").mamba2_chunk_scan))
    with pytest.raises(
        ValueError,
        match="mamba2_chunk_scan: a packed row cannot continue or keep a recurrent cache; "
        "pass use_cache=False",
    ):
        scan(**_chunk_inputs(), chunk_size=4, seq_idx=_seq_idx(LENGTHS), return_final_states=True)


def test_layout_of_equal_lengths_has_one_slot_more() -> None:
    layout = mamba.packed_layout({"seq_idx": _seq_idx([3, 3])}, 1, 6)
    assert [index.tolist() for index, _ in layout.groups] == [[[0, 1, 2, 6], [3, 4, 5, 6]]]
    x = torch.arange(6.0).reshape(1, 6)
    assert [part.tolist() for part in layout.unpack(x, 1)] == [[[0.0, 1.0, 2.0, 0.0], [3.0, 4.0, 5.0, 0.0]]]
    assert torch.equal(layout.repack(layout.unpack(x, 1), 1), x)


def test_layout_groups_bound_the_padding() -> None:
    """One long sequence and many short ones: the short ones are not padded to the long one's length."""
    lengths = [64, 3, 5, 2, 4, 60, 1, 7]
    layout = mamba.packed_layout({"seq_idx": _seq_idx(lengths)}, 1, sum(lengths))
    slots = sum(index.numel() for index, _ in layout.groups)
    assert slots <= 2 * sum(lengths) and len(layout.groups) == 2
    x = torch.randn(1, sum(lengths), 3)
    parts = layout.unpack(x, 1)
    assert torch.equal(layout.repack(parts, 1), x)
    cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    sequences = []
    for part, (index, valid) in zip(parts, layout.groups, strict=True):
        for row, slots, real in zip(part, index, valid, strict=True):
            tokens = slots[real].tolist()
            assert tokens == list(
                range(tokens[0], tokens[0] + len(tokens))
            )  # one sequence, in order, from its start
            sequences.append((tokens[0], tokens[-1] + 1))
            assert torch.equal(row[real], x[0, tokens]) and not row[~real].any()  # padding: zeros after it
    assert sorted(sequences) == list(zip(cu[:-1], cu[1:], strict=True))


def test_cu_seqlens_for_another_batch_is_refused() -> None:
    scan = mamba.KERNELS["mamba2_chunk_scan"](_torch_fallback(_modeling("bamba").mamba2_chunk_scan))
    with pytest.raises(ValueError, match=r"cover 20 tokens but the batch has 1x21; pass cu_seq_lens"):
        scan(**_chunk_inputs(), chunk_size=4, cu_seqlens=torch.tensor([0, 7, 20], dtype=torch.int32))


def test_selective_scan_packed_equals_each_sequence() -> None:
    original = _torch_fallback(_modeling("jamba").mamba_selective_scan)
    scan = mamba.KERNELS["mamba_selective_scan"](original)
    g = torch.Generator().manual_seed(1)
    t, channels, state = sum(LENGTHS), 6, 4
    inputs = {
        "hidden_states": torch.randn(1, channels, t, generator=g),
        "dt": torch.randn(1, channels, t, generator=g),
        "A": -torch.rand(channels, state, generator=g) - 0.5,
        "B": torch.randn(1, state, t, generator=g),
        "C": torch.randn(1, state, t, generator=g),
        "D": torch.randn(channels, generator=g),
        "z": torch.randn(1, channels, t, generator=g),
        "delta_bias": torch.randn(channels, generator=g),
    }

    def run(**kw: Any) -> torch.Tensor:
        return scan(**kw, delta_softplus=True)

    time = {"hidden_states": 2, "dt": 2, "B": 2, "C": 2, "z": 2, "out": 2}
    _compare(run, inputs, time, seq_idx=_seq_idx(LENGTHS))
    plain = {k: v for k, v in inputs.items()}
    assert torch.equal(scan(**plain, delta_softplus=True), original(**plain, delta_softplus=True))


def test_causal_conv1d_packed_equals_each_sequence() -> None:
    original = _torch_fallback(_modeling("bamba").causal_conv1d_fn)
    conv = mamba._conv_kernels()["causal_conv1d_fn"](original)
    g = torch.Generator().manual_seed(2)
    inputs = {
        "hidden_states": torch.randn(1, 6, sum(LENGTHS), generator=g),
        "weight": torch.randn(6, 4, generator=g),
        "bias": torch.randn(6, generator=g),
    }

    def run(**kw: Any) -> torch.Tensor:
        return conv(**kw, activation="silu")

    _compare(run, inputs, {"hidden_states": 2, "out": 2}, seq_idx=_seq_idx(LENGTHS))


def test_fused_forms_fall_back_to_the_unfused_path_when_packed() -> None:
    modeling = _modeling("bamba")
    fused = mamba.KERNELS["mamba2_split_conv1d_scan_combined"](
        _torch_fallback(modeling.mamba2_split_conv1d_scan_combined)
    )
    assert fused(torch.zeros(1, 3, 8), None, None, None, None, None, 4, seq_idx=_seq_idx([2, 1])) is None


def test_modeling_signatures_are_the_ones_bound_by_position() -> None:
    """The packed functions name the leading positional parameters of transformers' functions."""
    expected = {
        "mamba2_chunk_scan": ("hidden_states", "dt", "A", "B", "C", "chunk_size"),
        "mamba_selective_scan": (
            "hidden_states",
            "dt",
            "A",
            "B",
            "C",
            "D",
            "z",
            "delta_bias",
            "delta_softplus",
        ),
        "causal_conv1d_fn": ("hidden_states", "weight", "bias", "activation"),
    }
    import inspect

    for family in ("bamba", "falcon_h1", "granitemoehybrid", "jamba", "mamba2", "nemotron_h", "zamba2"):
        if family not in CONFIG_MAPPING:
            continue
        modeling = _modeling(family)
        for name, params in expected.items():
            function = getattr(modeling, name, None)
            if function is not None:
                assert tuple(inspect.signature(function).parameters)[: len(params)] == params, (family, name)


# ---------------------------------------------------------------------------------------------------------------
# Tiny models: packed row vs each example alone

SSM = dict(mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2)
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)
CONFIGS: dict[str, Callable[[], dict[str, Any]]] = {
    "bamba": lambda: COMMON | SSM | dict(num_hidden_layers=4, attn_layer_indices=[1], mamba_chunk_size=4),
    "falcon_h1": lambda: (
        COMMON | SSM | dict(num_hidden_layers=4, mamba_chunk_size=4, head_dim=8, mamba_d_ssm=64)
    ),
    "granitemoehybrid": lambda: (
        COMMON
        | SSM
        | dict(
            num_hidden_layers=4,
            layer_types=["mamba", "attention", "mamba", "mamba"],
            num_local_experts=2,
            num_experts_per_tok=1,
            shared_intermediate_size=64,
            mamba_chunk_size=4,
        )
    ),
    "jamba": lambda: (
        COMMON
        | dict(
            num_hidden_layers=4,
            attn_layer_period=4,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=2,
            num_experts_per_tok=1,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_dt_rank=4,
        )
    ),
    "mamba2": lambda: dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        num_heads=8,
        head_dim=8,
        expand=2,
        state_size=8,
        n_groups=1,
        chunk_size=4,
        conv_kernel=4,
        tie_word_embeddings=False,
    ),
    "nemotron_h": lambda: (
        COMMON
        | dict(
            hybrid_override_pattern="M*M-",
            mamba_num_heads=8,
            mamba_head_dim=8,
            n_groups=1,
            ssm_state_size=8,
            conv_kernel=4,
            expand=2,
            chunk_size=4,
            head_dim=8,
        )
    ),
    "zamba2": lambda: (
        COMMON
        | dict(
            num_key_value_heads=4,
            num_hidden_layers=4,
            layers_block_type=["mamba", "hybrid", "mamba", "mamba"],
            n_mamba_heads=8,
            mamba_headdim=8,
            mamba_ngroups=1,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
            chunk_size=4,
            attention_head_dim=8,
        )
    ),
}
FULL = ("seq_idx", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
NO_SEQ_IDX = FULL[1:]


def _tiny(family: str, monkeypatch: pytest.MonkeyPatch, checkpointing: bool = False) -> torch.nn.Module:
    _modeling(family)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        CONFIG_MAPPING[family](**CONFIGS[family]()), attn_implementation="padfree"
    )
    model.float().train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _apply(monkeypatch, model)
    return model


def _examples(lengths: list[int] = LENGTHS) -> tuple[list[torch.Tensor], dict[str, Any], int]:
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]
    ids = torch.cat(seqs).numpy()
    cu = np.concatenate([[0], np.cumsum(lengths)])
    labels = ids.copy()
    labels[cu[:-1]] = -100
    return seqs, packed_batch(ids, labels, cu), int((labels != -100).sum())


def _packed_vs_alone(model: torch.nn.Module, keys: tuple[str, ...], lengths: list[int] = LENGTHS) -> None:
    seqs, batch, items = _examples(lengths)
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "labels", *keys)}
    out = model(**inputs, use_cache=False, num_items_in_batch=items)
    model.zero_grad()
    out.loss.backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    total = 0
    for seq in seqs:
        labels = seq.clone()
        labels[0] = -100
        total = (
            total
            + model(input_ids=seq[None], labels=labels[None], use_cache=False, num_items_in_batch=items).loss
        )
    total.backward()
    alone = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert abs(out.loss.item() - total.item()) < 1e-5
    assert packed.keys() == alone.keys() and len(alone) > 10
    worst = max(alone, key=lambda n: _rel(packed[n], alone[n]))
    assert _rel(packed[worst], alone[worst]) < 1e-4, worst


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_tiny_model_packed_equals_each_example(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _packed_vs_alone(_tiny(family, monkeypatch), FULL)


@pytest.mark.parametrize("family", ["bamba", "jamba", "mamba2"])
def test_tiny_model_without_seq_idx(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only cu_seq_lens and position_ids in the batch: the boundaries come from cu_seq_lens_q."""
    _packed_vs_alone(_tiny(family, monkeypatch), NO_SEQ_IDX)


@pytest.mark.parametrize("family", ["jamba", "mamba2", "zamba2"])
def test_tiny_model_position_ids_only(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only restarting position_ids: the boundaries come from them (no attention mask)."""
    _packed_vs_alone(_tiny(family, monkeypatch), ("position_ids",))


@pytest.mark.parametrize("family", ["bamba", "jamba"])
@pytest.mark.parametrize("lengths", [[6, 6, 6], SKEWED], ids=["equal", "skewed"])
def test_tiny_model_other_lengths(family: str, lengths: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal lengths (the batch of sequences gets one padding slot more, so it never has the packed row's token
    count) and skewed ones (two batches of sequences)."""
    _packed_vs_alone(_tiny(family, monkeypatch), FULL, lengths=lengths)


@pytest.mark.parametrize("family", ["jamba", "mamba2"])
def test_tiny_model_gradient_checkpointing(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpointed layer recomputes with the same boundaries (they travel as arguments, not as state)."""
    _packed_vs_alone(_tiny(family, monkeypatch, checkpointing=True), FULL)


def test_unpatched_jamba_and_mamba2_are_not_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why patch_model exists: without it these two models scan across the examples of a row (or, where
    "padfree"'s mask builder has made the convolution check packed rows, refuse them)."""
    for family in ("jamba", "mamba2"):
        _modeling(family)
        torch.manual_seed(0)
        config = CONFIG_MAPPING[family](**CONFIGS[family]())
        model = AutoModelForCausalLM.from_config(config, attn_implementation="padfree").float()
        seqs, batch, _ = _examples()
        with torch.no_grad():
            second = model(input_ids=seqs[1][None], use_cache=False).logits
            try:
                packed = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
            except ValueError as refused:
                assert "cannot tell its sequences apart" in str(refused), family
                continue
        first_end = LENGTHS[0]
        gap = (packed[0, first_end : first_end + LENGTHS[1]] - second[0]).abs().max()
        assert gap > 1e-5, family  # patched: < 1e-7


def test_patch_model_is_idempotent_and_names_what_it_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    _modeling("jamba")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIG_MAPPING["jamba"](**CONFIGS["jamba"]()))
    names = mamba.patch_model(model)
    assert "model.layers.0.mamba (JambaMambaMixer: each sequence alone)" in names
    assert "model.layers.0 (JambaMambaDecoderLayer: boundaries for its mixer)" in names
    assert "model (JambaModel: seq_idx for its layers)" in names
    assert "(JambaForCausalLM call: the row boundaries)" in names
    assert mamba.patch_model(model) == []


def test_packed_row_with_a_cache_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _tiny("bamba", monkeypatch)
    _, batch, _ = _examples()
    with pytest.raises(ValueError, match="use_cache=False"):
        model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=True)
