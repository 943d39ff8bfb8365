"""TL's attention components built by hand: their internals, inputs and run-time flags.

`IGNORE`, the rotary tables with `apply_rotary` / `calculate_sin_cos_rotary`,
`apply_causal_mask`, legacy buffers on load; three separate inputs; `attn.cfg.<flag> = ...`
on a component; `ungroup_grouped_query_attention` on a component.
"""

import pytest
import torch
from einops import einsum, repeat
from torch.testing import assert_close

from hookedattn_tl.components import Attention, GroupedQueryAttention
from hookedattn_tl.config import HookedTransformerConfig

SIZES = dict(n_layers=1, d_model=8, d_head=4, n_heads=2, act_fn="relu", dtype=torch.float64)


def rotary_attention(n_ctx: int = 4096, **changes) -> Attention:
    cfg = HookedTransformerConfig(**{**SIZES, "n_ctx": n_ctx}, positional_embedding_type="rotary")
    return Attention(cfg.replace(**changes) if changes else cfg)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_rotary_tables_start_at_2048_positions_and_grow_to_twice_that():
    attn = rotary_attention(n_ctx=8192)
    assert attn.rotary_sin.shape == attn.rotary_cos.shape == (2048, attn.cfg.rotary_dim)
    attn.apply_rotary(randn(1, 1, 2, 4), past_kv_pos_offset=2048)
    assert attn.rotary_cos.shape == (4096, attn.cfg.rotary_dim)
    assert rotary_attention(n_ctx=128).rotary_cos.shape[0] == 128


def test_apply_rotary_is_the_forward_s_rotation():
    attn, x = rotary_attention(), randn(2, 5, 2, 4)
    positions = torch.arange(3, 8).expand(2, 5)
    assert_close(attn.apply_rotary(x, past_kv_pos_offset=3), attn.rotary(x, positions))


def test_apply_rotary_with_padding_counts_real_tokens_only():
    attn, x = rotary_attention(), randn(1, 4, 2, 4)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    positions = torch.tensor([[0, 1, 2, 3]])  # the two padding positions do not count
    assert_close(attn.apply_rotary(x, 2, mask), attn.rotary(x, positions))


def test_apply_rotary_past_n_ctx_names_it():
    with pytest.raises(ValueError, match="exceed the model's n_ctx=16"):
        rotary_attention(n_ctx=16).apply_rotary(randn(1, 2, 2, 4), past_kv_pos_offset=15)


def test_a_local_layer_s_tables_use_its_own_base():
    cfg = HookedTransformerConfig(
        **SIZES, n_ctx=64, positional_embedding_type="rotary", rotary_base=1_000_000,
        rotary_base_local=10_000, window_size=8,
    )  # fmt: skip
    local = Attention(cfg, attn_type="local")
    sin, cos = local.calculate_sin_cos_rotary(cfg.rotary_dim, 64, base=10_000, dtype=cfg.dtype)
    assert_close((local.rotary_sin, local.rotary_cos), (sin, cos))
    assert not torch.allclose(Attention(cfg).rotary_sin, sin)


def test_apply_causal_mask_blocks_what_the_forward_s_pattern_leaves_at_zero():
    attn = Attention(HookedTransformerConfig(**SIZES, n_ctx=16, window_size=2), attn_type="local")
    x = randn(1, 5, 8)
    pattern = []
    attn.hook_pattern.add_hook(lambda p, hook: pattern.append(p))
    attn(x, x, x)
    masked = attn.apply_causal_mask(torch.zeros(1, 2, 5, 5))
    assert torch.equal(torch.isfinite(masked), pattern[0] > 0)


def test_apply_causal_mask_blocks_a_padding_query_s_own_key_as_tl_does():
    attn = Attention(HookedTransformerConfig(**SIZES, n_ctx=16))
    masked = attn.apply_causal_mask(torch.zeros(1, 1, 2, 2), 0, torch.tensor([[0, 1]]))
    assert torch.isfinite(masked[0, 0]).tolist() == [[False, False], [False, True]]
    assert attn.IGNORE.item() == -torch.inf


def test_legacy_full_mask_and_rotary_tables_load_strictly_and_are_not_kept():
    attn = rotary_attention(n_ctx=4096)
    state = attn.state_dict()
    state["mask"] = torch.ones(4096, 4096, dtype=torch.bool)
    state["rotary_sin"], state["rotary_cos"] = randn(4096, 4), randn(4096, 4, seed=1)
    loaded = attn.load_state_dict(state, strict=True)
    assert loaded.missing_keys == loaded.unexpected_keys == []
    assert attn.mask.shape == (0, 0) and attn.rotary_sin.shape == (2048, 4)


def test_three_separate_inputs_are_each_projected():
    attn = Attention(HookedTransformerConfig(**SIZES, n_ctx=16))
    q_in, k_in, v_in = randn(1, 3, 8), randn(1, 3, 8, seed=1), randn(1, 3, 8, seed=2)
    q = einsum(q_in, attn.W_Q, "b p d, h d e -> b p h e") + attn.b_Q
    k = einsum(k_in, attn.W_K, "b p d, h d e -> b p h e") + attn.b_K
    v = einsum(v_in, attn.W_V, "b p d, h d e -> b p h e") + attn.b_V
    scores = einsum(q, k, "b q h e, b k h e -> b h q k") / attn.cfg.attn_scale
    scores = scores.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), -torch.inf)
    z = einsum(scores.softmax(-1), v, "b h q k, b k h e -> b q h e")
    expected = einsum(z, attn.W_O, "b q h e, h e d -> b q d") + attn.b_O
    assert_close(attn(q_in, k_in, v_in), expected)


def test_attention_ignores_n_key_value_heads_as_tl_s_does():
    sizes = {**SIZES, "n_heads": 4, "d_head": 2, "n_ctx": 16}
    cfg = HookedTransformerConfig(**sizes, n_key_value_heads=2)
    attn = Attention(cfg)
    assert attn.W_K.shape == (4, 8, 2) and attn.group == 1
    assert attn.cfg.n_key_value_heads == 2


def test_a_flag_assigned_on_a_component_rebuilds_it_keeping_weights_and_hooks():
    attn = Attention(HookedTransformerConfig(**SIZES, n_ctx=16))
    x, W_Q, cfg, seen = randn(1, 3, 8), attn.W_Q, attn.cfg, []
    before = attn(x, x, x)
    attn.hook_z.add_hook(lambda z, hook: seen.append(z.shape))
    attn.cfg.use_split_qkv_input = True
    copies = repeat(x, "b p d -> b p h d", h=2)
    assert_close(attn(copies, copies, copies), before)
    assert attn.W_Q is W_Q and attn.cfg is cfg and cfg.use_split_qkv_input
    assert seen == [(1, 3, 2, 4)]


def test_a_grouped_component_built_ungrouped_has_a_key_per_query_head():
    sizes = {**SIZES, "n_heads": 4, "d_head": 2, "n_ctx": 16}
    cfg = HookedTransformerConfig(**sizes, n_key_value_heads=2)
    grouped = GroupedQueryAttention(cfg)
    ungrouped = GroupedQueryAttention(cfg.replace(ungroup_grouped_query_attention=True))
    ungrouped.load_state_dict(grouped.state_dict())
    keys = []
    ungrouped.hook_k.add_hook(lambda k, hook: keys.append(k.shape[2]))
    x = randn(1, 3, 8)
    assert_close(ungrouped(x, x, x), grouped(x, x, x))
    assert keys == [4]


def test_an_int_for_a_float_field_is_read_as_its_float():
    cfg = HookedTransformerConfig(**SIZES, n_ctx=16, rotary_base=1_000_000, eps=1)
    assert isinstance(cfg.rotary_base, float) and cfg.rotary_base == 1e6
    assert isinstance(cfg.eps, float) and cfg.eps == 1.0


def test_ungrouping_a_grouped_component_by_assignment_and_back():
    sizes = {**SIZES, "n_heads": 4, "d_head": 2, "n_ctx": 16}
    attn = GroupedQueryAttention(HookedTransformerConfig(**sizes, n_key_value_heads=2))
    keys, x = [], randn(1, 3, 8)
    attn.hook_k.add_hook(lambda k, hook: keys.append(k.shape[2]))
    before = attn(x, x, x)
    attn.cfg.ungroup_grouped_query_attention = True
    assert_close(attn(x, x, x), before)
    attn.cfg.ungroup_grouped_query_attention = False
    assert_close(attn(x, x, x), before)
    assert keys == [2, 4, 2] and type(attn) is GroupedQueryAttention
