"""Tests of the "padfree" attention implementation (CPU, fp32, tiny models built from configs)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from tiny_models import decoder_config
from transformers import (
    AttentionInterface,
    AutoModelForCausalLM,
    DataCollatorWithFlattening,
)
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    and_masks,
    causal_mask_function,
    or_masks,
    packed_sequence_mask_function,
    sdpa_mask,
)

import trl_padfree.attention as attention
from trl_padfree.attention import (
    cu_seq_lens_from_position_ids,
    padfree_attention_forward,
    padfree_mask,
    pick_attn_implementation,
    select_backend,
    slow_cuda_reason,
)
from trl_padfree.attention_backends import run_varlen_attention, window_mask

VOCAB = 101
LENGTHS = [7, 23, 3, 31, 12, 23]  # unequal and equal lengths; 31 > the Mistral window below
SLIDING_WINDOW = 8


def tiny_config(kind: str):
    return decoder_config(
        kind,
        sliding_window=SLIDING_WINDOW,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )


def make_models(kind: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same random weights under "sdpa" and "padfree"."""
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation="sdpa")
    padfree = AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation="padfree")
    padfree.load_state_dict(reference.state_dict())
    return reference, padfree


def make_examples(seed: int = 1) -> list[dict[str, list[int]]]:
    """Examples with a masked prompt (completion-only labels), like the project's collator produces."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for length in LENGTHS:
        ids = torch.randint(3, VOCAB, (length,), generator=generator).tolist()
        prompt = length // 3
        examples.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return examples


def packed_batch(examples, with_cu_seq_lens: bool = True) -> dict:
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(examples)
    if not with_cu_seq_lens:
        batch = {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    batch["use_cache"] = False
    return batch


def padded_batch(examples, pad_id: int = 0) -> dict:
    longest = max(len(example["input_ids"]) for example in examples)
    ids = torch.full((len(examples), longest), pad_id)
    labels = torch.full((len(examples), longest), -100)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n] = torch.tensor(example["input_ids"])
        labels[row, :n] = torch.tensor(example["labels"])
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "use_cache": False}


def token_loss_sum(model, batch) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(sum of token losses, number of predicted tokens, logits): the normalisation-free comparison."""
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    targets = batch["labels"][:, 1:]
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), reduction="sum")
    return losses, int((targets != -100).sum()), logits


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str = "") -> None:
    scale = expected.abs().max().clamp_min(1e-12)
    error = (actual - expected).abs().max() / scale
    assert error <= rel, f"{what}: max relative difference {error.item():.3g} > {rel}"


# --------------------------------------------------------------------------------------------- registration


def test_registered_with_transformers():
    assert AttentionInterface._global_mapping["padfree"] is padfree_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["padfree"] is padfree_mask
    attention.register()  # idempotent
    assert AttentionInterface._global_mapping["padfree"] is padfree_attention_forward


def test_attn_implementation_selectable_four_ways(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama"), attn_implementation="padfree")
    assert model.config._attn_implementation == "padfree"
    batch = packed_batch(make_examples())
    expected = model(**batch).logits
    other = AutoModelForCausalLM.from_config(tiny_config("llama"), attn_implementation="sdpa")
    other.load_state_dict(model.state_dict())
    other.config._attn_implementation = "padfree"
    torch.testing.assert_close(other(**batch).logits, expected, rtol=0, atol=0)
    other.set_attn_implementation("padfree")
    torch.testing.assert_close(other(**batch).logits, expected, rtol=0, atol=0)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="padfree")
    assert loaded.config._attn_implementation == "padfree"
    torch.testing.assert_close(loaded(**batch).logits, expected, rtol=0, atol=0)


# ------------------------------------------------------------------------------- packed == padded sdpa (train)


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("with_cu_seq_lens", [True, False], ids=["cu_seq_lens", "position_ids_only"])
def test_packed_padfree_equals_padded_sdpa(kind, with_cu_seq_lens):
    reference, padfree = make_models(kind)
    examples = make_examples()
    padded, packed = padded_batch(examples), packed_batch(examples, with_cu_seq_lens)

    ref_sum, ref_count, ref_logits = token_loss_sum(reference, padded)
    pf_sum, pf_count, pf_logits = token_loss_sum(padfree, packed)
    assert pf_count == ref_count  # the first label of each packed example is -100: no cross-example target
    assert_rel_close(pf_sum, ref_sum, 1e-5, "sum of token losses")
    # The models' own (token-weighted mean) losses agree too.
    assert_rel_close(padfree(**packed).loss, reference(**padded).loss, 1e-5, "mean loss")

    start = 0
    for row, length in enumerate(LENGTHS):
        assert_rel_close(
            pf_logits[0, start : start + length], ref_logits[row, :length], 1e-5, f"logits {row}"
        )
        start += length

    ref_sum.backward()
    pf_sum.backward()
    ref_grads = dict(reference.named_parameters())
    for name, parameter in padfree.named_parameters():
        assert parameter.grad is not None, name
        assert_rel_close(parameter.grad, ref_grads[name].grad, 1e-4, f"grad {name}")


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_sliding_window_really_binds(kind):
    """Guard for the test above: the same weights without a window give other logits, so it is exercised."""
    _, padfree = make_models(kind)
    config = tiny_config(kind)
    config.sliding_window = None
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    no_window = AutoModelForCausalLM.from_config(config, attn_implementation="padfree")
    no_window.load_state_dict(padfree.state_dict())
    packed = packed_batch(make_examples())
    assert (padfree(**packed).logits - no_window(**packed).logits).abs().max() > 1e-3


def test_padfree_fixes_the_cache_trap():
    """Packed position_ids without use_cache=False: sdpa leaks across examples, padfree does not."""
    reference, padfree = make_models("llama")
    packed = packed_batch(make_examples(), with_cu_seq_lens=False)
    del packed["use_cache"]
    padded = padded_batch(make_examples())
    expected = reference(**padded).logits
    got = padfree(**packed).logits
    leaked = reference(**packed).logits
    start = 0
    for row, length in enumerate(LENGTHS):
        assert_rel_close(got[0, start : start + length], expected[row, :length], 1e-5, f"logits {row}")
        start += length
    assert (leaked - got).abs().max() > 1e-3


# ------------------------------------------------------------------------- without boundaries: exactly sdpa


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_padded_batch_through_padfree_equals_sdpa(kind):
    reference, padfree = make_models(kind)
    padded = padded_batch(make_examples())
    ref = reference(**padded)
    got = padfree(**padded)
    torch.testing.assert_close(got.logits, ref.logits, rtol=0, atol=0)
    ref.loss.backward()
    got.loss.backward()
    ref_grads = dict(reference.named_parameters())
    for name, parameter in padfree.named_parameters():
        torch.testing.assert_close(parameter.grad, ref_grads[name].grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_unpadded_batch_without_mask_equals_sdpa(kind):
    """B > 1 rows of one example each and no attention_mask (Mistral: the window binds inside each row)."""
    reference, padfree = make_models(kind)
    ids = torch.randint(3, VOCAB, (3, 20), generator=torch.Generator().manual_seed(3))
    assert_rel_close(padfree(input_ids=ids).logits, reference(input_ids=ids).logits, 1e-5, "logits")


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_generation_with_cache_equals_sdpa(kind):
    reference, padfree = make_models(kind)
    generator = torch.Generator().manual_seed(5)
    # Left-padded prompts, one longer than the sliding window.
    ids = torch.randint(3, VOCAB, (2, 12), generator=generator)
    mask = torch.ones_like(ids)
    ids[1, :5], mask[1, :5] = 0, 0
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    expected = reference.generate(**kwargs)
    got = padfree.generate(**kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    for got_scores, expected_scores in zip(got.scores, expected.scores, strict=True):
        torch.testing.assert_close(got_scores, expected_scores, rtol=0, atol=0)
    # One unpadded prompt (the mask builder gets an all-ones mask and the prefill runs without a dense mask).
    single = dict(kwargs, input_ids=ids[:1], attention_mask=mask[:1])
    torch.testing.assert_close(
        torch.stack(padfree.generate(**single).scores),
        torch.stack(reference.generate(**single).scores),
        rtol=1e-5,
        atol=1e-5,
    )


# ------------------------------------------------------------------------------------ mask builder


def test_mask_builder_plain_causal_gives_no_mask():
    assert padfree_mask(batch_size=2, q_length=9, kv_length=9) is None


def test_mask_builder_packed_pattern_gives_cu_seq_lens():
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    sequence_ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2]])
    pattern = and_masks(causal_mask_function, packed_sequence_mask_function(sequence_ids))
    cu = padfree_mask(batch_size=1, q_length=9, kv_length=9, mask_function=pattern)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 9]
    assert cu.padfree_max_length == 4
    assert cu_seq_lens_from_position_ids(position_ids).tolist() == [0, 3, 5, 9]


def test_mask_builder_padding_and_overlays_match_sdpa():
    padding = torch.tensor([[True, True, True, False], [True, True, True, True]])
    got = padfree_mask(batch_size=2, q_length=4, kv_length=4, attention_mask=padding)
    assert torch.equal(got, sdpa_mask(batch_size=2, q_length=4, kv_length=4, attention_mask=padding))

    def bidirectional_first_two(batch_idx, head_idx, q_idx, kv_idx):
        return (q_idx < 2) & (kv_idx < 2)

    pattern = or_masks(causal_mask_function, bidirectional_first_two)
    # transformers passes allow_is_causal_skip=False together with an overlay.
    got = padfree_mask(
        batch_size=1, q_length=4, kv_length=4, mask_function=pattern, allow_is_causal_skip=False
    )
    assert got.shape == (1, 1, 4, 4) and bool(got[0, 0, 0, 1])  # a dense mask: sdpa's business
    # With a cache offset (decoding) the sdpa mask is used as well.
    got = padfree_mask(
        batch_size=1, q_length=1, kv_length=5, q_offset=4, attention_mask=torch.ones(1, 5).bool()
    )
    assert got is None or got.shape[-1] == 5


# ---------------------------------------------------------------------------- attention function directly


class _Attention(torch.nn.Module):
    def __init__(self, num_key_value_groups: int = 2, is_causal: bool = True):
        super().__init__()
        self.num_key_value_groups = num_key_value_groups
        self.is_causal = is_causal


def reference_attention(q, k, v, lengths, causal=True, window=None):
    """Per-sequence attention from first principles (explicit softmax), (B=1, H, T, D) in, (T, H, D) out."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    outputs, start = [], 0
    for length in lengths:
        sl = slice(start, start + length)
        scores = q[0, :, sl] @ k[0, :, sl].transpose(-1, -2) / q.shape[-1] ** 0.5
        allowed = window_mask(length, length, window, causal, q.device)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        outputs.append((weights @ v[0, :, sl]).transpose(0, 1))
        start += length
    return torch.cat(outputs)


def random_qkv(lengths, heads=4, kv_heads=2, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(1, heads, total, dim, generator=generator, requires_grad=True)
    k = torch.randn(1, kv_heads, total, dim, generator=generator, requires_grad=True)
    v = torch.randn(1, kv_heads, total, dim, generator=generator, requires_grad=True)
    return q, k, v


def cu_of(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_function_matches_first_principles(window, causal):
    lengths = [5, 17, 16, 1, 9, 17, 30]
    q, k, v = random_qkv(lengths)
    module = _Attention(is_causal=causal)
    out, weights = padfree_attention_forward(
        module,
        q,
        k,
        v,
        None,
        sliding_window=window,
        cu_seq_lens_q=cu_of(lengths),
        cu_seq_lens_k=cu_of(lengths),
        max_length_q=max(lengths),
        max_length_k=max(lengths),
    )
    assert weights is None and out.shape == (1, sum(lengths), 4, 8)
    expected = reference_attention(q, k, v, lengths, causal, window)
    assert_rel_close(out[0], expected, 1e-5, "output")
    grads = torch.autograd.grad((out[0] * expected.detach().cos()).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * expected.detach().cos()).sum(), (q, k, v))
    for name, got, want in zip("qkv", grads, expected_grads, strict=True):
        assert_rel_close(got, want, 1e-4, f"grad {name}")


def test_boundaries_from_position_ids_kwarg():
    """Models whose mask builder never sees position_ids still get boundaries via the attention kwargs."""
    lengths = [4, 9, 6]
    q, k, v = random_qkv(lengths)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    out, _ = padfree_attention_forward(_Attention(), q, k, v, None, position_ids=position_ids)
    assert_rel_close(out[0], reference_attention(q, k, v, lengths), 1e-5, "output")
    # Consecutive position_ids: one sequence, delegated to sdpa.
    plain, _ = padfree_attention_forward(_Attention(), q, k, v, None, position_ids=torch.arange(19)[None])
    assert_rel_close(plain[0], reference_attention(q, k, v, [19]), 1e-5, "output")


def test_dropout_is_applied_only_when_requested():
    lengths = [6, 11]
    q, k, v = random_qkv(lengths)
    kwargs = dict(
        cu_seq_lens_q=cu_of(lengths), cu_seq_lens_k=cu_of(lengths), max_length_q=11, max_length_k=11
    )
    plain, _ = padfree_attention_forward(_Attention(), q, k, v, None, dropout=0.0, **kwargs)
    torch.manual_seed(0)
    dropped, _ = padfree_attention_forward(_Attention(), q, k, v, None, dropout=0.5, **kwargs)
    torch.manual_seed(0)
    again, _ = padfree_attention_forward(_Attention(), q, k, v, None, dropout=0.5, **kwargs)
    assert (dropped - plain).abs().max() > 1e-2
    torch.testing.assert_close(dropped, again, rtol=0, atol=0)  # seeded: reproducible


def test_model_dropout_honoured_in_training_only():
    config = tiny_config("llama")
    config.attention_dropout = 0.3
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="padfree")
    packed = packed_batch(make_examples())
    model.eval()
    eval_a, eval_b = model(**packed).logits, model(**packed).logits
    torch.testing.assert_close(eval_a, eval_b, rtol=0, atol=0)
    model.train()
    assert (model(**packed).logits - eval_a).abs().max() > 1e-3


def test_bad_cu_seq_lens_are_reported():
    q, k, v = random_qkv([4, 5])
    with pytest.raises(ValueError, match="cover 8/8 tokens but the batch has 1x9"):
        padfree_attention_forward(
            _Attention(),
            q,
            k,
            v,
            None,
            cu_seq_lens_q=cu_of([4, 4]),
            cu_seq_lens_k=cu_of([4, 4]),
            max_length_q=4,
        )
    with pytest.raises(ValueError, match="must be 1-D"):
        padfree_attention_forward(
            _Attention(), q, k, v, None, cu_seq_lens_q=cu_of([4, 5])[None], max_length_q=5, max_length_k=5
        )


# ------------------------------------------------------------------------------ soft-capping and attention sinks
# (once refused; now computed exactly: tests/test_attention_features.py)


def test_softcap_and_sinks_are_computed_not_refused():
    q, k, v = random_qkv([3, 4])
    sinks = torch.zeros(4)
    cu = cu_of([3, 4])
    out, _ = padfree_attention_forward(_Attention(), q, k, v, None, softcap=1.0, s_aux=sinks, cu_seq_lens_q=cu,
                                       cu_seq_lens_k=cu, max_length_q=4, max_length_k=4)
    # per sequence, the explicit-scores kernel on the same sequence alone
    first = run_varlen_attention("sdpa_loop", *(t[0, :, :3].transpose(0, 1) for t in (q, k, v)),
                                 cu_of([3]), cu_of([3]), 3, 3, softcap=1.0, sinks=sinks)
    torch.testing.assert_close(out[0, :3], first)


# ---------------------------------------------------------------------------------------- backend selection


@pytest.mark.parametrize(
    ("device", "dtype", "options", "expected"),
    [
        ("cpu", torch.float32, {}, "sdpa_loop"),
        ("cpu", torch.bfloat16, {"flash_attn_installed": True, "torch_varlen_installed": True}, "sdpa_loop"),
        ("cuda", torch.bfloat16, {"flash_attn_installed": True}, "flash_attn"),
        ("cuda:1", torch.float16, {"flash_attn_installed": True, "dropout": 0.1}, "flash_attn"),
        ("cuda", torch.float32, {"flash_attn_installed": True}, "sdpa_loop"),
        (
            "cuda",
            torch.bfloat16,
            {"flash_attn_installed": False, "torch_varlen_installed": True, "cuda_capability": (8, 0)},
            "torch_varlen",
        ),
        (
            "cuda",
            torch.bfloat16,
            {"flash_attn_installed": False, "torch_varlen_installed": True, "cuda_capability": (7, 5)},
            "sdpa_loop",
        ),
        (
            "cuda",
            torch.bfloat16,
            {
                "flash_attn_installed": False,
                "torch_varlen_installed": True,
                "cuda_capability": (9, 0),
                "dropout": 0.1,
            },
            "sdpa_loop",
        ),
        (
            "cuda",
            torch.bfloat16,
            {"flash_attn_installed": False, "torch_varlen_installed": False, "cuda_capability": (9, 0)},
            "sdpa_loop",
        ),
        ("cuda", torch.bfloat16, {"flash_attn_installed": True, "head_dim": 512}, "sdpa_loop"),
        ("mps", torch.float16, {"flash_attn_installed": True}, "sdpa_loop"),
    ],
)
def test_select_backend(device, dtype, options, expected):
    assert select_backend(device, dtype, **options) == expected
    reason = slow_cuda_reason(device, dtype, **options)
    # A reason exactly when a CUDA call falls back to the loop; none on other devices, where the loop is the kernel.
    assert (reason is not None) == (expected == "sdpa_loop" and device.startswith("cuda"))


H100 = {"flash_attn_installed": False, "torch_varlen_installed": True, "cuda_capability": (9, 0)}


@pytest.mark.parametrize(
    ("dtype", "options", "cause", "fix"),
    [
        (torch.float32, H100, "torch.float32 inputs: the varlen kernels take float16/bfloat16 only",
         "train in bf16 (e.g. bf16=True, or load the model with dtype=torch.bfloat16)"),
        (torch.bfloat16, {**H100, "head_dim": 512}, "head dimension 512",
         "above the flash kernels' limit of 256"),
        (torch.bfloat16, {**H100, "dropout": 0.1}, "attention dropout 0.1: torch's varlen_attn has none",
         "pip install flash-attn, or set the model's attention_dropout to 0"),
        (torch.bfloat16, {**H100, "torch_varlen_installed": False}, "no varlen kernel: flash-attn is not installed",
         "pip install flash-attn, or upgrade torch"),
        (torch.float16, {**H100, "cuda_capability": (7, 5)}, "this GPU (compute capability 7.5) is older than",
         "and flash-attn is not installed"),
    ],
)  # fmt: skip
def test_slow_cuda_reason_names_the_cause_and_the_fix(dtype, options, cause, fix):
    reason = slow_cuda_reason("cuda", dtype, **options)
    assert reason.startswith(cause) and reason.endswith(fix), reason


def test_pick_attn_implementation_on_this_machine():
    assert pick_attn_implementation("cpu") == "padfree"
    assert pick_attn_implementation(torch.device("cpu")) == "padfree"
    expected = "padfree"
    if torch.cuda.is_available() and attention.flash_attn_available():
        expected = "flash_attention_2"
    assert pick_attn_implementation() == expected


def test_run_varlen_attention_rejects_unknown_backend_and_dropout_on_torch_varlen():
    q, k, v = (torch.zeros(3, 1, 4),) * 3
    cu = cu_of([3])
    with pytest.raises(ValueError, match="Unknown varlen attention backend 'triton'"):
        run_varlen_attention("triton", q, k, v, cu, cu, 3, 3)
    with pytest.raises(ValueError, match="torch_varlen backend has no dropout"):
        run_varlen_attention("torch_varlen", q, k, v, cu, cu, 3, 3, dropout=0.1)


# ------------------------------------------------------------------------ CUDA kernels (skipped without a GPU)


def _cuda_backends() -> list[str]:
    if not torch.cuda.is_available():
        return []
    backends = []
    if attention.flash_attn_available():
        backends.append("flash_attn")
    if attention.torch_varlen_available() and torch.cuda.get_device_capability() >= (8, 0):
        backends.append("torch_varlen")
    return backends


@pytest.mark.skipif(not _cuda_backends(), reason="needs CUDA with flash-attn or torch varlen_attn (sm80+)")
@pytest.mark.parametrize("window", [None, 5])
def test_cuda_varlen_kernels_match_the_sdpa_loop(window):
    lengths = [5, 17, 16, 1, 9, 40]
    cu = cu_of(lengths).cuda()
    generator = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(sum(lengths), 8, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
    k = torch.randn(sum(lengths), 2, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
    v = torch.randn(sum(lengths), 2, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
    expected = run_varlen_attention(
        "sdpa_loop", q.float(), k.float(), v.float(), cu, cu, 40, 40, sliding_window=window
    )
    for backend in _cuda_backends():
        got = run_varlen_attention(backend, q, k, v, cu, cu, 40, 40, sliding_window=window)
        torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2, msg=backend)


def test_the_slow_cuda_warning_is_given_once_per_reason():
    reason = "a test reason (not a real GPU)"
    with pytest.warns(UserWarning, match=r'attn_implementation="padfree" runs a per-sequence sdpa loop .*a test reason'):
        attention._warn_slow_cuda(reason)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attention._warn_slow_cuda(reason)  # the second time: silent
