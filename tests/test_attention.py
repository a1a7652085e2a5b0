"""The "padfree" attention (CPU, fp32, tiny models): packed == padded sdpa (loss, logits, every gradient), exactly sdpa
without boundaries and in generation, the mask builder, the function vs a textbook, the kernel choice."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from tiny_models import decoder_config
from transformers import AttentionInterface, AutoModelForCausalLM, DataCollatorWithFlattening
from transformers import masking_utils as mu

import trl_padfree.attention as attention
from trl_padfree.attention_backends import decide_backend, run_varlen_attention, scores_attention

VOCAB = 101
LENGTHS = [7, 23, 3, 31, 12, 23]  # unequal and equal lengths; 31 > the Mistral window below
KINDS = ["llama", "mistral", "qwen2"]  # full attention; every layer windowed; the first layer full, the others windowed


def tiny_config(kind: str, **extra):
    return decoder_config(kind, sliding_window=8, vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,  # GQA
                          max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=2, **extra)


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
        examples.append({"input_ids": ids, "labels": [-100] * (length // 3) + ids[length // 3 :]})
    return examples


def packed_batch(examples, with_cu_seq_lens: bool = True) -> dict:
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(examples)
    if not with_cu_seq_lens:
        batch = {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    return batch | {"use_cache": False}


def padded_batch(examples) -> dict:
    longest = max(len(example["input_ids"]) for example in examples)
    ids, labels = torch.zeros(len(examples), longest, dtype=torch.long), torch.full((len(examples), longest), -100)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n], labels[row, :n], mask[row, :n] = torch.tensor(example["input_ids"]), torch.tensor(example["labels"]), 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "use_cache": False}


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str = "") -> None:
    error = (actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12)
    assert error <= rel, f"{what}: max relative difference {error.item():.3g} > {rel}"


def assert_rows_equal(packed_logits: torch.Tensor, padded_logits: torch.Tensor) -> None:
    """Each example's logits in the packed row equal its padded row's."""
    start = 0
    for row, length in enumerate(LENGTHS):
        assert_rel_close(packed_logits[0, start : start + length], padded_logits[row, :length], 1e-5, f"logits {row}")
        start += length


def test_registered_with_transformers_and_selectable_four_ways(tmp_path):
    assert AttentionInterface._global_mapping["padfree"] is attention.padfree_attention_forward
    assert mu.ALL_MASK_ATTENTION_FUNCTIONS["padfree"] is attention.padfree_mask
    attention.register()  # idempotent
    assert AttentionInterface._global_mapping["padfree"] is attention.padfree_attention_forward
    other, model = make_models("llama")  # sdpa, then "padfree", the same weights
    assert model.config._attn_implementation == "padfree"
    batch = packed_batch(make_examples())
    expected = model(**batch).logits
    other.config._attn_implementation = "padfree"
    torch.testing.assert_close(other(**batch).logits, expected, rtol=0, atol=0)
    other.set_attn_implementation("padfree")
    torch.testing.assert_close(other(**batch).logits, expected, rtol=0, atol=0)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="padfree")
    assert loaded.config._attn_implementation == "padfree"
    torch.testing.assert_close(loaded(**batch).logits, expected, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_cu_seq_lens", [True, False], ids=["cu_seq_lens", "position_ids_only"])
def test_packed_padfree_equals_padded_sdpa(kind, with_cu_seq_lens):
    reference, padfree = make_models(kind)
    padded, packed = padded_batch(make_examples()), packed_batch(make_examples(), with_cu_seq_lens)
    sums, counts, logits = [], [], []
    for model, batch in ((reference, padded), (padfree, packed)):  # the sums of token losses: no normalisation
        out = model(**{k: v for k, v in batch.items() if k != "labels"})
        targets = batch["labels"][:, 1:]
        sums.append(F.cross_entropy(out.logits[:, :-1].flatten(0, 1), targets.flatten(), reduction="sum"))
        counts.append(int((targets != -100).sum()))
        logits.append(out.logits)
    assert counts[0] == counts[1]  # the first label of each packed example is -100: no cross-example target
    assert_rel_close(sums[1], sums[0], 1e-5, "sum of token losses")
    # the models' own (token-weighted mean) losses agree too
    assert_rel_close(padfree(**packed).loss, reference(**padded).loss, 1e-5, "mean loss")
    assert_rows_equal(logits[1], logits[0])
    sums[0].backward()
    sums[1].backward()
    ref_grads = dict(reference.named_parameters())
    for name, parameter in padfree.named_parameters():
        assert_rel_close(parameter.grad, ref_grads[name].grad, 1e-4, f"grad {name}")
    if kind == "llama" and not with_cu_seq_lens:  # without use_cache=False (the cache trap) sdpa leaks, padfree not
        trapped = {k: v for k, v in packed.items() if k != "use_cache"}
        assert_rows_equal(padfree(**trapped).logits, logits[0])
        assert (reference(**trapped).logits - logits[1]).abs().max() > 1e-3
    if kind != "llama":  # guard: the same weights without a window give other logits, so the window binds here
        config = tiny_config(kind)
        config.sliding_window, config.layer_types = None, ["full_attention"] * config.num_hidden_layers
        no_window = AutoModelForCausalLM.from_config(config, attn_implementation="padfree")
        no_window.load_state_dict(padfree.state_dict())
        assert (logits[1] - no_window(**packed).logits).abs().max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_padded_batch_and_generation_through_padfree_equal_sdpa(kind):
    reference, padfree = make_models(kind)
    padded = padded_batch(make_examples())
    ref, got = reference(**padded), padfree(**padded)
    torch.testing.assert_close(got.logits, ref.logits, rtol=0, atol=0)
    ref.loss.backward()
    got.loss.backward()
    ref_grads = dict(reference.named_parameters())
    for name, parameter in padfree.named_parameters():
        torch.testing.assert_close(parameter.grad, ref_grads[name].grad, rtol=0, atol=0, msg=name)
    if kind != "qwen2":  # B > 1 rows of one example each and no attention_mask (Mistral: the window binds inside)
        ids = torch.randint(3, VOCAB, (3, 20), generator=torch.Generator().manual_seed(3))
        assert_rel_close(padfree(input_ids=ids).logits, reference(input_ids=ids).logits, 1e-5, "logits")
    # generation with a cache
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    ids[1, :5], mask[1, :5] = 0, 0  # left-padded prompts, one longer than the sliding window
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                  output_scores=True, return_dict_in_generate=True)
    expected, got = reference.generate(**kwargs), padfree.generate(**kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), rtol=0, atol=0)
    # One unpadded prompt (the mask builder gets an all-ones mask and the prefill runs without a dense mask).
    single = dict(kwargs, input_ids=ids[:1], attention_mask=mask[:1])
    torch.testing.assert_close(torch.stack(padfree.generate(**single).scores),
                               torch.stack(reference.generate(**single).scores), rtol=1e-5, atol=1e-5)


def test_mask_builder():
    assert attention.padfree_mask(batch_size=2, q_length=9, kv_length=9) is None  # plain causal: no mask
    # a packed pattern: cu_seq_lens, also from position_ids
    sequence_ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2]])
    pattern = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(sequence_ids))
    cu = attention.padfree_mask(batch_size=1, q_length=9, kv_length=9, mask_function=pattern)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 9] and cu.padfree_max_length == 4
    assert attention.cu_seq_lens_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])).tolist() == [0, 3, 5, 9]
    # padding: sdpa's mask
    padding = torch.tensor([[True, True, True, False], [True, True, True, True]])
    got = attention.padfree_mask(batch_size=2, q_length=4, kv_length=4, attention_mask=padding)
    assert torch.equal(got, mu.sdpa_mask(batch_size=2, q_length=4, kv_length=4, attention_mask=padding))

    def bidirectional_first_two(batch_idx, head_idx, q_idx, kv_idx):
        return (q_idx < 2) & (kv_idx < 2)

    # an overlay (transformers passes allow_is_causal_skip=False with it): a dense mask, sdpa's business
    got = attention.padfree_mask(batch_size=1, q_length=4, kv_length=4, allow_is_causal_skip=False,
                       mask_function=mu.or_masks(mu.causal_mask_function, bidirectional_first_two))
    assert got.shape == (1, 1, 4, 4) and bool(got[0, 0, 0, 1])
    # with a cache offset (decoding) the sdpa mask is used as well
    got = attention.padfree_mask(batch_size=1, q_length=1, kv_length=5, q_offset=4, attention_mask=torch.ones(1, 5).bool())
    assert got is None or got.shape[-1] == 5


class _Attention(torch.nn.Module):
    def __init__(self, num_key_value_groups: int = 2, is_causal: bool = True):
        super().__init__()
        self.num_key_value_groups = num_key_value_groups
        self.is_causal = is_causal


def textbook(q, k, v, lengths, scale=None, causal=True, window=None, softcap=None, sinks=None) -> torch.Tensor:
    """Attention per sequence in float64: q ``(T, H, D)``, k/v ``(T, H_kv, D)`` in, ``(T, H, D)`` out."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups, out, start = q.shape[1] // k.shape[1], [], 0
    for n in lengths:
        qs, ks, vs = (x[start : start + n].double().transpose(0, 1) for x in (q, k, v))
        logits = qs @ ks.repeat_interleave(groups, 0).transpose(-1, -2) * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        allowed = (distance >= 0 if causal else distance > -(window or n)) & (distance < (window or n))
        weights = logits.masked_fill(~allowed, float("-inf")).exp()
        denominator = weights.sum(-1, keepdim=True) + (0 if sinks is None else sinks.double().exp()[:, None, None])
        out.append(((weights / denominator) @ vs.repeat_interleave(groups, 0)).transpose(0, 1))
        start += n
    return torch.cat(out)


def random_qkv(lengths, heads=4, kv_heads=2, dim=8, seed=0):
    """Leaf q, k, v of shape ``(1, H, T, D)`` (transformers' attention-function layout)."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, sum(lengths), dim, generator=generator, requires_grad=True)
                 for h in (heads, kv_heads, kv_heads))


def cu_of(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize(("window", "causal", "softcap", "sinks"), [
    (None, True, None, False), (3, True, None, False), (None, False, None, False), (3, False, None, False),
    (None, True, 0.7, True), (3, True, 0.7, False), (3, True, None, True),
])  # fmt: skip
def test_attention_function_matches_the_textbook_per_sequence(window, causal, softcap, sinks):
    """Values and the gradients of q, k, v and the sinks (GQA, a sequence of one token, one longer than the rest)."""
    lengths = [5, 17, 16, 1, 9, 17, 30]
    q, k, v = random_qkv(lengths)
    s_aux = torch.randn(4, requires_grad=True) if sinks else None
    out, weights = attention.padfree_attention_forward(
        _Attention(is_causal=causal), q, k, v, None, scaling=0.4, sliding_window=window, softcap=softcap, s_aux=s_aux,
        cu_seq_lens_q=cu_of(lengths), cu_seq_lens_k=cu_of(lengths), max_length_q=30, max_length_k=30)
    assert weights is None and out.shape == (1, sum(lengths), 4, 8)
    expected = textbook(*(x[0].transpose(0, 1) for x in (q, k, v)), lengths, 0.4, causal, window, softcap, s_aux)
    assert_rel_close(out[0].double(), expected, 1e-5, "output")
    leaves = [x for x in (q, k, v, s_aux) if x is not None]
    weight = expected.detach().cos()
    grads = torch.autograd.grad((out[0] * weight).sum(), leaves)
    expected_grads = torch.autograd.grad((expected * weight).sum(), leaves)
    for name, got, want in zip("qkvs"[: len(leaves)], grads, expected_grads, strict=True):
        assert_rel_close(got.double(), want.double(), 1e-4, f"grad {name}")


def test_scores_attention_exact_values():
    # all logits 0: each of the 3 keys and the sink (logit log 2) get weights 1:1:1:2, the sink's dropped
    q, k = torch.zeros(1, 1, 1, 4), torch.randn(1, 1, 3, 4)
    v = torch.tensor([1.0, 2.0, 6.0]).reshape(1, 1, 3, 1).expand(1, 1, 3, 4)
    out = scores_attention(q, k, v, None, sinks=torch.tensor([math.log(2.0)]))
    torch.testing.assert_close(out, torch.full((1, 1, 1, 4), 9.0 / 5.0))
    # soft-capping at 1: logits 100 and 0 become tanh(100) = 1 and 0, so the weights are e : 1
    q, k, v = torch.tensor([[[[10.0]]]]), torch.tensor([[[[10.0], [0.0]]]]), torch.tensor([[[[1.0], [0.0]]]])
    out = scores_attention(q, k, v, None, scale=1.0, softcap=1.0)
    torch.testing.assert_close(out, torch.tensor([[[[math.e / (math.e + 1)]]]]))
    # a masked key gets no weight, whatever its logit
    assert scores_attention(q, k, v, torch.tensor([[False, True]]), scale=1.0).item() == 0.0


def test_boundaries_from_position_ids_kwarg():
    """Models whose mask builder never sees position_ids still get boundaries via the attention kwargs."""
    lengths = [4, 9, 6]
    q, k, v = random_qkv(lengths)
    qkv = [x[0].transpose(0, 1) for x in (q, k, v)]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    out, _ = attention.padfree_attention_forward(_Attention(), q, k, v, None, position_ids=position_ids)
    assert_rel_close(out[0].double(), textbook(*qkv, lengths), 1e-5, "output")
    # Consecutive position_ids: one sequence, delegated to sdpa.
    plain, _ = attention.padfree_attention_forward(_Attention(), q, k, v, None, position_ids=torch.arange(19)[None])
    assert_rel_close(plain[0].double(), textbook(*qkv, [19]), 1e-5, "output")


def test_dropout_is_applied_only_when_requested_and_by_the_model_in_training_only():
    lengths = [6, 11]
    q, k, v = random_qkv(lengths)
    kwargs = dict(cu_seq_lens_q=cu_of(lengths), cu_seq_lens_k=cu_of(lengths), max_length_q=11, max_length_k=11)
    plain, _ = attention.padfree_attention_forward(_Attention(), q, k, v, None, dropout=0.0, **kwargs)
    dropped = []
    for _ in range(2):
        torch.manual_seed(0)
        dropped.append(attention.padfree_attention_forward(_Attention(), q, k, v, None, dropout=0.5, **kwargs)[0])
    assert (dropped[0] - plain).abs().max() > 1e-2
    torch.testing.assert_close(dropped[0], dropped[1], rtol=0, atol=0)  # seeded: reproducible

    model = AutoModelForCausalLM.from_config(tiny_config("llama", attention_dropout=0.3),
                                             attn_implementation="padfree").eval()
    packed = packed_batch(make_examples())
    eval_logits = model(**packed).logits
    torch.testing.assert_close(model(**packed).logits, eval_logits, rtol=0, atol=0)
    assert (model.train()(**packed).logits - eval_logits).abs().max() > 1e-3


def test_bad_input_is_reported():
    q, k, v = random_qkv([4, 5])
    with pytest.raises(ValueError, match="cover 8/8 tokens but the batch has 1x9"):
        attention.padfree_attention_forward(_Attention(), q, k, v, None, cu_seq_lens_q=cu_of([4, 4]),
                                  cu_seq_lens_k=cu_of([4, 4]), max_length_q=4)
    with pytest.raises(ValueError, match="must be 1-D"):
        attention.padfree_attention_forward(_Attention(), q, k, v, None, cu_seq_lens_q=cu_of([4, 5])[None], max_length_q=5,
                                  max_length_k=5)
    q, cu = torch.zeros(3, 1, 4), cu_of([3])
    with pytest.raises(ValueError, match="Unknown varlen attention backend 'triton'"):
        run_varlen_attention("triton", q, q, q, cu, cu, 3, 3)
    with pytest.raises(ValueError, match="torch_varlen backend has no dropout"):
        run_varlen_attention("torch_varlen", q, q, q, cu, cu, 3, 3, dropout=0.1)
    with pytest.raises(ValueError, match="torch_varlen backend has no softcap or sinks"):
        run_varlen_attention("torch_varlen", q, q, q, cu, cu, 3, 3, softcap=1.0)


BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
H100 = {"flash_attn_installed": False, "torch_varlen_installed": True, "cuda_capability": (9, 0)}
BOTH = {**H100, "flash_attn_installed": True}


@pytest.mark.parametrize(("device", "dtype", "options", "backend", "reason"), [
    ("cpu", F32, {}, "sdpa_loop", None),  # on other devices the loop is the kernel: no reason to warn
    ("cpu", BF16, BOTH, "sdpa_loop", None),
    ("cpu", F32, {"softcap": True, "sinks": True}, "sdpa_loop", None),
    ("mps", F16, {"flash_attn_installed": True}, "sdpa_loop", None),
    ("cuda", BF16, {"flash_attn_installed": True}, "flash_attn", None),
    ("cuda:1", F16, {"flash_attn_installed": True, "dropout": 0.1}, "flash_attn", None),
    ("cuda", BF16, {**H100, "cuda_capability": (8, 0)}, "torch_varlen", None),
    ("cuda", F32, {"flash_attn_installed": True}, "sdpa_loop", "^torch.float32 inputs"),
    ("cuda", F32, H100, "sdpa_loop", r"^torch\.float32 inputs: the varlen kernels take float16/bfloat16 only.*"
                                     r"train in bf16 \(e\.g\. bf16=True, or load the model with dtype=torch\.bfloat16\)$"),
    ("cuda", BF16, {"flash_attn_installed": True, "head_dim": 512}, "sdpa_loop", "^head dimension 512"),
    ("cuda", BF16, {**H100, "head_dim": 512}, "sdpa_loop", r"^head dimension 512.*above the flash kernels' limit of 256$"),
    ("cuda", BF16, {**H100, "dropout": 0.1}, "sdpa_loop", r"^attention dropout 0\.1: torch's varlen_attn has none.*"
                                                          r"pip install flash-attn, or set the model's attention_dropout to 0$"),
    ("cuda", BF16, {**H100, "torch_varlen_installed": False}, "sdpa_loop",
     r"^no varlen kernel: flash-attn is not installed.*pip install flash-attn, or upgrade torch$"),
    ("cuda", F16, {**H100, "cuda_capability": (7, 5)}, "sdpa_loop",
     r"^this GPU \(compute capability 7\.5\) is older than.*and flash-attn is not installed$"),
    ("cuda", BF16, {**BOTH, "softcap": True, "flash_attn_features": frozenset({"softcap"})}, "flash_attn", None),
    ("cuda", BF16, {**BOTH, "sinks": True, "flash_attn_features": frozenset({"softcap"})}, "sdpa_loop",
     r"^attention sinks: .*`s_aux`"),
    ("cuda", BF16, {**BOTH, "sinks": True, "softcap": True, "flash_attn_features": frozenset({"softcap", "sinks"})},
     "flash_attn", None),
    ("cuda", BF16, {**H100, "softcap": True}, "sdpa_loop", "^attention logit soft-capping: torch's varlen_attn has none"),
])  # fmt: skip
def test_backend_choice_and_why_a_cuda_call_takes_the_loop(device, dtype, options, backend, reason):
    assert attention.select_backend(device, dtype, **options) == decide_backend(device, dtype, **options)[0] == backend
    why = decide_backend(device, dtype, **options)[1]
    assert why is None if reason is None else re.search(reason, why), why


def test_pick_attn_implementation_on_this_machine():
    assert attention.pick_attn_implementation("cpu") == attention.pick_attn_implementation(torch.device("cpu")) == "padfree"
    cuda_flash = torch.cuda.is_available() and attention.flash_attn_available()
    assert attention.pick_attn_implementation() == ("flash_attention_2" if cuda_flash else "padfree")


def test_the_slow_cuda_warning_is_given_once_per_reason():
    reason = "a test reason (not a real GPU)"
    with pytest.warns(UserWarning, match=r'attn_implementation="padfree" runs a per-sequence sdpa loop .*a test reason'):
        attention._warn_slow_cuda(reason)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attention._warn_slow_cuda(reason)  # the second time: silent


def _cuda_backends(feature: str | None) -> list[str]:
    if feature is not None:  # whichever kernel decide_backend picks on this GPU (flash-attn or the loop)
        backend = decide_backend("cuda", torch.bfloat16, softcap=feature == "softcap", sinks=feature == "sinks")[0]
        assert backend != "torch_varlen"
        return [backend]
    backends = ["flash_attn"] if attention.flash_attn_available() else []
    if attention.torch_varlen_available() and torch.cuda.get_device_capability() >= (8, 0):
        backends.append("torch_varlen")
    return backends


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("feature", [None, "softcap", "sinks"])
@pytest.mark.parametrize("window", [None, 6])
def test_cuda_bf16_kernels_match_the_fp32_loop(feature, window):
    lengths = [5, 17, 40, 1, 9]
    cu = cu_of(lengths).cuda()
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), h, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
               for h in (8, 2, 2))
    extra = {None: {}, "softcap": {"softcap": 2.0}, "sinks": {"sinks": torch.randn(8, device="cuda")}}[feature]
    expected = run_varlen_attention("sdpa_loop", q.float(), k.float(), v.float(), cu, cu, 40, 40,
                                    sliding_window=window, **extra)
    for backend in _cuda_backends(feature):
        got = run_varlen_attention(backend, q, k, v, cu, cu, 40, 40, sliding_window=window, **extra)
        torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2, msg=backend)
