"""MiMo-V2-Flash (`MiMoV2FlashForCausalLM`): its full-attention and sliding-window blocks
shaped apart (twice the key/value heads and attention sinks in the sliding ones: our
`n_key_value_heads_layers`, `attn_sinks_layers`), value heads narrower than the query/key
heads (`d_head_v`) scaled by `attention_value_scale`, a rotary base per layer type on a
third of each head, DeepSeek V3's router. Its tiny twin here has 4 blocks (full, sliding,
sliding, full; a window of 3) so that a full block follows sliding ones. Compared with
`transformers`: logits in float64 and float32, each block's attention write, greedy
generation past the window, a saved directory; and each piece left out moving the logits."""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import (
    assert_saved_twin_loads_like_the_live_model,
    attn_out_worsts,
    relative_worst,
)
from torch import nn

from hookedattn import HookedTransformer
from hookedattn.core.hf import _tiny

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 11], [9, 2, 2, 71, 30, 6, 5, 14, 100, 4]])
TYPES = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]


def twin(seed: int = 0) -> nn.Module:
    """A tiny random MiMo-V2-Flash of 4 blocks, its sinks away from zero."""
    config = _tiny.tiny_config(transformers.AutoConfig.for_model("mimo_v2_flash"))
    # The shrink keeps the 2 blocks the default pattern needs: 4 set after it.
    config.num_hidden_layers, config.layer_types, config.sliding_window = 4, TYPES, 3
    config.mlp_layer_types = ["dense", "sparse", "sparse", "dense"]
    model = _tiny.random_hf_model(transformers.MiMoV2FlashForCausalLM, config, seed=seed)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.self_attn.sinks is not None:
                layer.self_attn.sinks.normal_(generator=torch.Generator().manual_seed(seed))
    return model


def test_mimo_pieces_are_read_as_ours():
    reference = twin(seed=1)
    cfg = HookedTransformer.from_hf(reference).cfg
    c = reference.config
    sliding = (False, True, True, False)
    assert cfg.n_key_value_heads_layers == tuple(
        c.num_key_value_heads * (2 if s else 1) for s in sliding
    )
    assert cfg.use_attn_sinks and cfg.attn_sinks_layers == sliding
    assert cfg.attn_types == tuple("local" if s else "global" for s in sliding)
    assert (cfg.d_head, cfg.d_head_v) == (c.head_dim, c.v_head_dim) and cfg.d_head != cfg.d_head_v
    assert cfg.rotary_dim == int(c.head_dim * 0.334)
    assert cfg.rotary_base == 5_000_000.0 and cfg.rotary_base_local == 10_000.0
    assert cfg.moe_layers == (False, True, True, False) and cfg.router_scoring == "sigmoid"


def test_mimo_logits_are_transformers_in_float64():
    """To float32's rounding: transformers' norms and router compute in float32 even in a
    float64 model."""
    reference = twin(seed=2).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= 1e-6


def test_mimo_logits_are_transformers_in_float32():
    reference = twin(seed=3)
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= 1e-5


def test_every_block_writes_what_transformers_writes():
    reference = twin(seed=4).double()
    worsts = attn_out_worsts(reference, TOKENS)
    _, cache = HookedTransformer.from_hf(reference).run_with_cache(TOKENS)
    for i in range(4):
        assert worsts[i] <= 1e-6, i
        assert cache[f"blocks.{i}.attn.hook_k"].shape[2] == (4 if i in (1, 2) else 2), i


def _without(model: HookedTransformer, piece: str) -> HookedTransformer:
    """`model` with one of MiMo's pieces left out: the sinks, the sliding blocks' own
    rotary base, or the value scale (W_V, b_V unscaled)."""
    state = model.state_dict()
    if piece == "sinks":
        cfg = model.cfg.replace(use_attn_sinks=False, attn_sinks_layers=None)
        state = {name: t for name, t in state.items() if not name.endswith(".sinks")}
    elif piece == "local_rotary":
        cfg = model.cfg.replace(rotary_base_local=None)
    else:
        cfg = model.cfg
        state = {name: t / 0.707 if name.split(".")[-1] in ("_W_V", "_b_V") else t
                 for name, t in state.items()}  # fmt: skip
    changed = HookedTransformer(cfg)
    changed.load_state_dict(state)
    return changed


@pytest.mark.parametrize("piece", ["sinks", "local_rotary", "value_scale"])
def test_without_a_piece_the_import_would_differ(piece):
    """Each piece moves the twin's logits well past the tolerance (so the verification on
    load would refuse an import that left it out)."""
    reference = twin(seed=5).double()
    changed = _without(HookedTransformer.from_hf(reference), piece)
    with torch.no_grad():
        assert relative_worst(changed(TOKENS), reference(TOKENS).logits) > 1e-3


def test_mimo_greedy_generation_past_the_window_is_transformers():
    got, expected = greedy_ours_and_transformers(twin(seed=6), TOKENS[:, :3], max_new_tokens=8)
    assert torch.equal(got, expected)


def test_a_saved_directory_loads_like_the_live_model(tmp_path):
    assert_saved_twin_loads_like_the_live_model(twin(seed=7), tmp_path)
