"""Tiny hybrid models for the mixer tests (short convolution, Mamba-1, Mamba-2, gated delta
net): a config whose blocks hold the given kinds, the context of an unpadded batch, and
every parameter of a module drawn at random."""

from typing import Any

import torch

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kernels import attention_context
from hookedattn.core.mixer_config import MixerConfig

D_MODEL = 12
# Mamba-2 / gated delta settings small enough to check against loops, grouped (2 groups).
SETTINGS = dict(d_conv=3, n_ssm_heads=4, d_ssm_head=6, d_state=5, n_ssm_groups=2)
# Each mixer kind, with the changes to `SETTINGS` its module accepts (Mamba-1's heads are its
# channels; Kimi's decay is low-rank; lightning attention has one key head per value head).
KIND_SETTINGS = {
    "short_conv": {},
    "mamba2": {},
    "gated_delta": {},
    "mamba": dict(n_ssm_heads=10, d_ssm_head=1, n_ssm_groups=1, d_state=5, dt_rank=3),
    "rg_lru": {},
    "kimi_delta": dict(dt_rank=3),
    "lightning": dict(n_ssm_heads=3, d_ssm_head=4, n_ssm_groups=1),
}


def hybrid_cfg(
    kinds: tuple[str, ...], dtype: torch.dtype = torch.float64, **mixer: Any
) -> HookedTransformerConfig:
    """A model of `len(kinds)` blocks, block `i` holding `kinds[i]` ("attention" or a mixer
    kind), the mixers' settings `SETTINGS` changed by `mixer`."""
    return HookedTransformerConfig(
        n_layers=len(kinds), d_model=D_MODEL, n_ctx=32, d_vocab=23, n_heads=3, d_mlp=20,
        normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
        act_fn="silu", seed=0, dtype=dtype,
        mixers=MixerConfig(layers=kinds, **SETTINGS | mixer),
    )  # fmt: skip


def beside_attention_cfg(dtype: torch.dtype = torch.float64) -> HookedTransformerConfig:
    """Falcon-H1's layout: 2 attention blocks, each with a Mamba-2 mixer beside it."""
    mixers = MixerConfig(layers=("attention",) * 2, beside_attention="mamba2", **SETTINGS)
    return hybrid_cfg(("attention",) * 2, dtype).replace(mixers=mixers)


def one_sublayer_cfg(dtype: torch.dtype = torch.float64) -> HookedTransformerConfig:
    """Nemotron-H's layout: blocks of one sublayer, Mamba-2, an MLP, attention, an MLP."""
    kinds = ("mamba2", "none", "attention", "none")
    mixers = MixerConfig(layers=kinds, mlp_layers=(False, True, False, True), **SETTINGS)
    return hybrid_cfg(kinds, dtype).replace(mixers=mixers)


def unpadded_context(x: torch.Tensor) -> Any:
    """The context of an unpadded batch like `x` (no KV cache, no window)."""
    return attention_context(x.shape[1], x.shape[0], x.shape[1], None, None, None, "cpu")


def randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn at random (biases, gains, A_log, D, dt_bias included)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)
    return module


def random_hybrid(cfg: HookedTransformerConfig, seed: int) -> Any:
    """A model of `cfg` whose blocks' parameters are all drawn at random (`randomised`)."""
    from hookedattn import HookedTransformer

    model = HookedTransformer(cfg)
    for block in model.blocks:
        randomised(block, seed)
    return model


def assert_causal_and_float32_close(
    mixer: torch.nn.Module, single: torch.nn.Module, x: torch.Tensor
) -> None:
    """`mixer` (float64) gives its first 6 positions the same whatever comes after them, and
    `single`, the same module in float32 with `mixer`'s weights, is within 1e-5 of it."""
    context = unpadded_context(x)
    changed = x.clone()
    changed[:, 6:] += 1.0
    torch.testing.assert_close(
        mixer(changed, context)[:, :6], mixer(x, context)[:, :6], rtol=0, atol=0
    )
    single.load_state_dict({k: v.float() for k, v in mixer.state_dict().items()})
    with torch.no_grad():
        got, expected = single(x.float(), context).double(), mixer(x, context)
    assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max())


def assert_padding_reaches_no_real_token(model: Any, side: str) -> None:
    """A row of 3 real tokens padded on `side` to 6, batched with a row of 6: each row's
    real positions give what the row gives alone (to 1e-10)."""
    short, long = [3, 9, 4], [7, 1, 2, 8, 5, 6]
    pad = [0] * (len(long) - len(short))
    row = pad + short if side == "left" else short + pad
    real_row = [0] * len(pad) + [1] * 3 if side == "left" else [1] * 3 + [0] * len(pad)
    batched = model(torch.tensor([row, long]), attention_mask=torch.tensor([real_row, [1] * 6]))
    real = slice(len(pad), None) if side == "left" else slice(0, 3)
    alone = model(torch.tensor([short]))[0]
    torch.testing.assert_close(batched[0, real], alone, rtol=0, atol=1e-10)
    torch.testing.assert_close(batched[1], model(torch.tensor([long]))[0], rtol=0, atol=1e-10)


def assert_generation_reruns_the_prefix(model: Any, prompt: torch.Tensor) -> None:
    """Greedy generation of 5 tokens after `prompt` equals a loop of plain forwards of the
    whole sequence (a mixer keeps no cache between steps)."""
    generated = model.generate(prompt, max_new_tokens=5, stop_at_eos=False)
    tokens = prompt
    for _ in range(5):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, tokens)


def assert_processing_keeps_the_log_probs(model: Any, tokens: torch.Tensor) -> Any:
    """`process_weights(model)` gives the same log-probabilities on `tokens` (to 1e-10);
    the processed model, for checks of its own."""
    from hookedattn.core import processing

    processed = processing.process_weights(model)
    expected = model(tokens).log_softmax(-1)
    torch.testing.assert_close(processed(tokens).log_softmax(-1), expected, rtol=0, atol=1e-10)
    return processed
