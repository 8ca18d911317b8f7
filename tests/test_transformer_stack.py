"""The transformer block stack of `qbench switchback --model` / `--train-check`: each linear-layer
variant against the 16-bit stack from the same weights (output, loss, gradients within the bench's
bounds), causal attention, the variant registry, and the training step's check in eager and compiled
form. On the CPU the int8 / fp8 kernels run through the Triton interpreter, so sizes are tiny."""

from __future__ import annotations

import pytest
import torch

from qbench.benches.block import config as bench
from qbench.benches.block import steps as ms
from qbench.benches.block.sweep import REL_ERROR
from qbench.commands.switchback_options import BLOCK_VARIANTS
from qbench.layers import transformer as tf

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPE = tf.StackShape(width=32, mlp=96, heads=2, layers=2)  # odd token count and MLP width below


def _stack(variant: str, state=None, shape=SHAPE):
    return tf.build(lambda v: tf.BlockStack(shape, v, device=DEVICE, dtype=torch.bfloat16), variant, state)


def _one_step(model, x, target) -> dict:
    out: dict = {}
    ms.train_step(ms.objective(model, "eager"), ms.optimizer_of(model, DEVICE), x, target, out)()
    return ms.results(model, out)


def test_variant_names_agree_everywhere():
    assert tuple(tf.LINEARS) == tf.VARIANTS == bench.VARIANTS == BLOCK_VARIANTS and set(REL_ERROR) == set(tf.VARIANTS)


@pytest.mark.parametrize("variant", ["switchback", "fp8", "fp8_all"])
def test_low_precision_stack_matches_16bit_within_its_bound(variant):
    torch.manual_seed(0)
    ref = _stack("16bit")
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    tokens = 9  # odd: fp8_all's grad-weight product runs over the tokens, an unaligned inner dimension
    x, target = (torch.randn(2, tokens, 32, device=DEVICE).bfloat16() for _ in range(2))
    want = _one_step(ref, x, target)
    model = _stack(variant, state)
    assert sum(type(m) is not torch.nn.Linear for m in tf.block_linears(model)) == 8  # 4 per block, all swapped
    errors = ms.relative_errors(_one_step(model, x, target), want)
    assert all(0 < e <= REL_ERROR[variant] for e in errors.values()), errors  # > 0: the variant really quantizes


def test_attention_is_causal_only_when_asked():
    torch.manual_seed(1)
    causal = tf.StackShape(32, 64, 4, 1, causal=True)
    x = torch.randn(1, 7, 32)
    for shape, same in ((causal, True), (tf.StackShape(32, 64, 4, 1), False)):
        stack = tf.BlockStack(shape)
        later = x.clone()
        later[:, 4:] += 1.0  # change tokens 4..6 only
        with torch.no_grad():
            y, y2 = stack(x), stack(later)
        assert torch.equal(y[:, :4], y2[:, :4]) == same


def test_attention_splits_heads_as_the_fused_qkv_layout_says():
    """qkv's output [B, T, 3C] is (q, k, v) x (head, dim): the split-based forward gives the output and the
    gradients of the plain reading, a select of the [3, B, H, T, D] permutation."""
    torch.manual_seed(2)
    attn = tf.Attention(tf.StackShape(32, 64, 4, 1), torch.nn.Linear)
    x = torch.randn(2, 5, 32, requires_grad=True)

    def plain(x):
        B, T, C = x.shape
        q, k, v = attn.qkv(x).reshape(B, T, 3, 4, C // 4).permute(2, 0, 3, 1, 4)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return attn.proj(out.transpose(1, 2).reshape(B, T, C))

    results = []
    for forward in (attn, plain):
        x.grad = None
        attn.zero_grad()
        y = forward(x)
        y.square().sum().backward()
        results.append([y.detach(), x.grad.clone(), attn.qkv.weight.grad.clone(), attn.qkv.bias.grad.clone()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_tiny_lm_logits_and_head_stays_16bit():
    model = tf.TinyLM(vocab=11, seq=6, shape=tf.StackShape(16, 32, 2, 1, causal=True), variant="switchback")
    logits = model(torch.randint(0, 11, (3, 6)))
    assert logits.shape == (3, 6, 11)
    assert type(model.head) is torch.nn.Linear and len(tf.block_linears(model)) == 4


def test_torchao_is_skipped_with_a_reason_when_it_cannot_run():
    try:
        import torchao  # noqa: F401
    except ImportError:
        assert "not installed" in tf.unavailable("torchao", DEVICE)
    if DEVICE == "cpu":
        assert tf.unavailable("torchao", "cpu") is not None
    assert tf.unavailable("switchback", DEVICE) is None and tf.unavailable("16bit", DEVICE) is None


def test_width_must_split_into_heads():
    with pytest.raises(ValueError, match="multiple of 3 heads"):
        tf.StackShape(32, 64, 3, 1)


def test_memory_estimate_of_the_gpu_target_fits_an_h200():
    """vit-h, 4 blocks, batch 256 (65792 tokens): ~11 GiB of saved activations, well under 141 GB."""
    case = bench.Case(preset_name="vit-h", batch_size=256, layers=4)
    need = bench.memory_estimate_bytes(case)
    activations = 65792 * (9 * 1280 + 2 * 5120) * 2 * 4
    assert activations < need < 1.5 * activations and need < 30 * 2**30
    assert bench.step_flop(case) == pytest.approx(4 * (6 * 65792 * 19660800 + 12 * 256 * 257**2 * 1280))


@pytest.mark.parametrize("variant", ["16bit", "switchback"])
def test_compiled_training_step_matches_eager(variant):
    """The bench's compiled step (fullgraph, compiled before any eager step of the model ran) gives the eager
    step's loss, output and gradients, within the bound the bench checks (a compiled 16-bit step only
    reorders sums)."""
    torch.manual_seed(1)
    state = {k: v.clone() for k, v in _stack("16bit").state_dict().items()}
    x, target = (torch.randn(2, 9, 32, device=DEVICE).bfloat16() for _ in range(2))
    compiled = _stack(variant, state)
    out: dict = {}
    ms.train_step(ms.objective(compiled, "compile"), ms.optimizer_of(compiled, DEVICE), x, target, out)()
    got = ms.results(compiled, out)
    want = _one_step(_stack(variant, state), x, target)
    errors = ms.relative_errors(got, want)
    assert all(e <= REL_ERROR["16bit"] for e in errors.values()), errors
