"""Pattern-preserving ablation = the clean logits minus every path through the ablated head.

The reference carries a head's clean result forward by hand: through each later head's OV
circuit with its clean pattern and its norm's clean scale, then through the final norm
and W_U, with no bias anywhere (a bias is no path through the head).
"""

import pytest
import torch

from analysis import Component, frozen_pattern_hooks, pattern_preserving_ablation
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model, random_tokens


def _model(norm=None, dtype=torch.float64, attn_only=True, **extra):
    return random_tiny_model(
        n_layers=3, n_ctx=8, d_vocab=20, d_mlp=24, attn_only=attn_only, normalization_type=norm,
        dtype=dtype, **extra,
    )  # fmt: skip


TOKENS = random_tokens(20, batch=2, pos=7, seed=2)


def _linear_norm(model, module, x, scale):
    """The norm with its scale fixed and its bias dropped: the part a path goes through."""
    kind = model.cfg.normalization_type
    if kind is None:
        return x
    if kind == "LN":
        x = x - x.mean(-1, keepdim=True)
    return x / scale * module.w.detach()


def _paths_through(model, cache, layer, heads):
    """The logits carried by every path that starts at `heads` of `layer`."""
    W_O = model.blocks[layer].attn.W_O.detach()
    delta = sum(cache["z", layer][:, :, h] @ W_O[h] for h in heads)
    for later in range(layer + 1, model.cfg.n_layers):
        block = model.blocks[later]
        scale = cache["scale", later, "ln1"] if model.cfg.normalization_type else None
        x = _linear_norm(model, block.ln1, delta, scale)
        written = torch.zeros_like(delta)
        for h in range(model.cfg.n_heads):
            moved = cache["pattern", later][:, h] @ x  # [batch query_pos d_model]
            written += moved @ block.attn.W_V[h].detach() @ block.attn.W_O[h].detach()
        delta = delta + written
    scale = cache["scale"] if model.cfg.normalization_type else None
    return _linear_norm(model, model.ln_final, delta, scale) @ model.W_U.detach()


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
@pytest.mark.parametrize("norm", (None, "LN", "RMS"))
@pytest.mark.parametrize(("layer", "heads"), [(0, [1]), (1, [3]), (0, [0, 2]), (2, [1])])
def test_equals_subtracting_every_path_through_the_heads(norm, dtype, layer, heads):
    model = _model(norm, dtype)
    logits, cache = model.run_with_cache(TOKENS)
    ablated = pattern_preserving_ablation(
        model,
        TOKENS,
        [f"L{layer}H{h}" for h in heads],
        clean_cache=cache,
        freeze_norm_scales=norm is not None,
    )
    expected = logits - _paths_through(model, cache, layer, heads)
    # Without norms the logits of random weights reach ~100: rounding scales with them.
    tol = tolerance(dtype)
    atol = tol.atol * max(1.0, float(logits.detach().abs().max()))
    torch.testing.assert_close(ablated, expected, rtol=tol.rtol, atol=atol)


def test_the_paths_are_not_all_direct():
    """The reference matters: later heads carry part of the ablated head's write."""
    model = _model(None)
    logits, cache = model.run_with_cache(TOKENS)
    ablated = pattern_preserving_ablation(model, TOKENS, (0, 1), clean_cache=cache)
    direct = cache["z", 0][:, :, 1] @ model.blocks[0].attn.W_O[1].detach() @ model.W_U.detach()
    assert not torch.allclose(ablated, logits - direct, rtol=1e-3, atol=1e-3)


def test_patterns_stay_those_of_the_clean_run():
    model = _model("LN", attn_only=False, use_attn_result=True)
    _, clean = model.run_with_cache(TOKENS)
    hooks = frozen_pattern_hooks(model, clean)
    with model.hooks([*hooks, ("blocks.0.attn.hook_z", lambda z, hook: z * 0)]):
        _, ablated = model.run_with_cache(TOKENS)
    for layer in range(3):
        assert torch.equal(ablated["pattern", layer], clean["pattern", layer])
    assert not torch.equal(ablated["resid_pre", 2], clean["resid_pre", 2])
    assert model.attached_hooks() == []


def test_a_plain_ablation_would_move_the_patterns():
    model = _model(None)
    preserved = pattern_preserving_ablation(model, TOKENS, "L0H1")
    plain = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_z", _zero_head_1)])
    assert not torch.allclose(preserved, plain, rtol=1e-3, atol=1e-3)


def _zero_head_1(z, hook):
    z = z.clone()
    z[:, :, 1] = 0
    return z


def test_bad_heads_are_refused():
    model = _model(None)
    with pytest.raises(ValueError, match="L<layer>H<head>"):
        pattern_preserving_ablation(model, TOKENS, "head 3")
    with pytest.raises(ValueError, match="out of range"):
        pattern_preserving_ablation(model, TOKENS, (0, 4))
    with pytest.raises(ValueError, match="no heads"):
        pattern_preserving_ablation(model, TOKENS, [])


def test_a_head_is_named_the_same_way_everywhere():
    model, tokens = _model(), TOKENS
    by_label = pattern_preserving_ablation(model, tokens, ["L1H2", "L2H0"])
    by_pair = pattern_preserving_ablation(model, tokens, [(1, 2), (-1, 0)])
    by_component = pattern_preserving_ablation(
        model, tokens, [Component("z", 1, head=2), Component("z", 2, head=0)]
    )
    torch.testing.assert_close(by_pair, by_label, rtol=0, atol=0)
    torch.testing.assert_close(by_component, by_label, rtol=0, atol=0)
    assert Component("z", 1, head=2).label() == "z L1H2"
