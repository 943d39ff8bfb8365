"""Gemma 4 (`hf/_gemma4.py`): `Gemma4ForCausalLM`, `Gemma4UnifiedForCausalLM` and their
multimodal `...ForConditionalGeneration` (imported as their language models) import
exactly. Each tiny twin (6 blocks: 5 local, heads 32 wide, then a global one, heads 64 wide
and rotated by "proportional" RoPE on a quarter of its pairs; Gemma 4's with per-layer
inputs 16 wide) is built here and compared with `transformers`: logits in float64
throughout and float32, greedy generation, and each piece (the value norms, the global
blocks' still pairs, the local blocks' own rotary width, the blocks' scalars, the per-layer
inputs, the global blocks' keys serving as values) left out moving the logits. What is not
imported is refused by name before any weight is read. The blocks sharing keys and values
are tested in `test_hf_gemma4_kv_sharing.py`, the mixture of experts beside the MLP in
`test_hf_gemma4_moe.py`.
"""

import pytest
import torch
from helpers.float64_hf import InFloat64Throughout
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import assert_saved_twin_loads_like_the_live_model, relative_worst, tiny_twin
from torch import nn

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.hf import _gemma4
from hookedattn.testing import assert_residual_identities, published_constants

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 11], [9, 2, 2, 71, 30, 6, 5, 14, 100, 4]])
IMPORTED = ("gemma4_text", "gemma4", "gemma4_unified_text", "gemma4_unified")


@pytest.fixture(autouse=True)
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: each test verifies afresh."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def twin(model_type: str = "gemma4_unified_text", seed: int = 0, scalars: bool = True, **fields):
    """The tiny twin of `model_type`, each block's `layer_scalar` (a buffer, 1 as built)
    drawn away from 1 unless `scalars` is False."""
    model = tiny_twin(model_type, seed=seed, **fields)
    if scalars:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in model.get_decoder().layers:
                layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=generator))
    return model


def _refusal(model_type: str, **fields) -> str:
    with pytest.raises(ValueError) as refused:
        HookedTransformer.from_hf(tiny_twin(model_type, **fields))
    return str(refused.value)


def test_the_blocks_are_read_as_ours():
    cfg = HookedTransformer.from_hf(twin()).cfg
    assert cfg.d_head_layers == (32, 32, 32, 32, 32, 64) and cfg.attn_scale == 1.0
    assert cfg.attn_types == ("local",) * 5 + ("global",)
    assert (cfg.rotary_dim, cfg.rotary_pairs, cfg.rotary_base) == (64, 8, 1e6)
    assert (cfg.rotary_dim_local, cfg.rotary_base_local) == (32, 1e4)
    assert cfg.use_v_norm and cfg.resid_post_scale


@pytest.mark.parametrize("model_type", IMPORTED)
def test_logits_are_transformers_in_float64_throughout(model_type):
    reference = twin(model_type, seed=1).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
        assert relative_worst(model(TOKENS), expected) <= 1e-10


@pytest.mark.parametrize("model_type", IMPORTED)
def test_logits_are_transformers_in_float32(model_type):
    reference = twin(model_type, seed=2)
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= 1e-5


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4_unified_text"])
def test_greedy_generation_past_the_window_is_transformers(model_type):
    reference = twin(model_type, seed=3)
    got, expected = greedy_ours_and_transformers(reference, TOKENS[:, :3], max_new_tokens=8)
    assert torch.equal(got, expected)


def test_the_block_scalar_scales_the_sum_of_the_writes():
    # The decomposition: resid_post = w * (resid_mid + mlp_out), the sum at resid_scale.hook_in.
    model = HookedTransformer.from_hf(twin(seed=4).double())
    _, cache = model.run_with_cache(TOKENS)
    for i, block in enumerate(model.blocks):
        unscaled = cache[f"blocks.{i}.resid_scale.hook_in"]
        summed = cache[f"blocks.{i}.hook_resid_mid"] + cache[f"blocks.{i}.hook_mlp_out"]
        torch.testing.assert_close(unscaled, summed, rtol=0, atol=0)
        scaled = block.resid_scale.w * unscaled
        torch.testing.assert_close(cache[f"blocks.{i}.hook_resid_post"], scaled, rtol=0, atol=0)


def test_the_value_norm_is_transformers_v_norm():
    # The values the heads read (v_norm's output) against HF's v_norm of its v_proj.
    reference = twin(seed=5).double()
    model = HookedTransformer.from_hf(reference)
    seen = {}
    v_norm = reference.model.layers[5].self_attn.v_norm
    v_norm.register_forward_hook(lambda m, args, out: seen.setdefault("v", out))
    with torch.no_grad():
        InFloat64Throughout(reference)(TOKENS)
    _, cache = model.run_with_cache(TOKENS)
    got = cache["blocks.5.attn.v_norm.hook_out"]
    assert got.shape[-1] == 64
    assert relative_worst(got, seen["v"]) <= 1e-12


def _without(model: HookedTransformer, piece: str) -> HookedTransformer:
    """`model` with one of Gemma 4's pieces left out."""
    state, cfg = model.state_dict(), model.cfg
    if piece == "v_norm":
        cfg = cfg.replace(use_v_norm=False)
    elif piece == "still_pairs":  # every pair of the global heads turning
        cfg = cfg.replace(rotary_pairs=None)
    elif piece == "local_rotary_width":  # the local heads rotating half their width
        cfg = cfg.replace(rotary_dim_local=16)
    else:  # the blocks' scalars, each 1
        state = {n: torch.ones_like(t) if n.endswith("resid_scale.w") else t
                 for n, t in state.items()}  # fmt: skip
    changed = HookedTransformer(cfg)
    changed.load_state_dict(state)
    return changed


@pytest.mark.parametrize("piece", ["v_norm", "still_pairs", "local_rotary_width", "scalars"])
def test_without_a_piece_the_import_would_differ(piece):
    reference = twin(seed=6).double()
    changed = _without(HookedTransformer.from_hf(reference), piece)
    with torch.no_grad():
        assert relative_worst(changed(TOKENS), reference(TOKENS).logits) > 1e-3


def test_the_per_layer_write_is_what_transformers_adds():
    # Block L's third write, against HF's stream after that layer less its stream before
    # the per-layer sublayer (the MLP's add), both before the layer's scalar.
    reference = twin("gemma4_text", seed=8, scalars=False).double()
    model = HookedTransformer.from_hf(reference)
    seen = {}
    for i, layer in enumerate(reference.model.layers):
        hook = lambda m, args, out, i=i: seen.update({i: out})
        layer.post_per_layer_input_norm.register_forward_hook(hook)
    with torch.no_grad():
        InFloat64Throughout(reference)(TOKENS)
    _, cache = model.run_with_cache(TOKENS)
    for i in range(model.cfg.n_layers):
        assert relative_worst(cache[f"blocks.{i}.hook_per_layer_out"], seen[i]) <= 1e-12, i
        summed = (cache[f"blocks.{i}.hook_resid_mid"] + cache[f"blocks.{i}.hook_mlp_out"]
                  + cache[f"blocks.{i}.hook_per_layer_out"])  # fmt: skip
        torch.testing.assert_close(cache[f"blocks.{i}.resid_scale.hook_in"], summed)


def test_without_the_per_layer_inputs_the_import_would_differ():
    reference = twin("gemma4_text", seed=9).double()
    model = HookedTransformer.from_hf(reference)
    state = {n: t for n, t in model.state_dict().items() if "per_layer_input" not in n}
    changed = HookedTransformer(model.cfg.replace(d_per_layer_input=None))
    changed.load_state_dict(state)
    with torch.no_grad():
        assert relative_worst(changed(TOKENS), reference(TOKENS).logits) > 1e-3


def test_from_a_residual_stream_the_per_layer_inputs_need_the_tokens():
    model = HookedTransformer.from_hf(twin("gemma4_text", seed=10).double())
    logits, cache = model.run_with_cache(TOKENS)
    resid = cache["blocks.2.hook_resid_pre"]
    with pytest.raises(ValueError, match=r"d_per_layer_input=16\): with start_at_layer"):
        model(resid, start_at_layer=2)
    torch.testing.assert_close(model(resid, start_at_layer=2, tokens=TOKENS), logits)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"use_bidirectional_attention": "all"},
         "bidirectional attention (use_bidirectional_attention='all')"),
    ],
)  # fmt: skip
def test_what_is_not_imported_is_named(fields, named):
    assert named in _refusal("gemma4_unified_text", **fields)


def test_a_per_layer_setting_not_read_is_named():
    config = transformers.Gemma4UnifiedTextConfig(
        num_hidden_layers=6, per_layer_config={5: {"head_dim": 512, "sliding_window": 8}}
    )
    with pytest.raises(ValueError, match=r"per_layer_config setting \['sliding_window'\]"):
        _gemma4.gemma4_fields(config)


def test_a_released_sized_config_shares_keys_as_transformers_does():
    # The E2B model's sharing (its last 20 layers reusing, their MLPs twice as wide) on
    # the default 30 layers: each layer's source and store as `kv_sharing_modes` says.
    config = transformers.Gemma4TextConfig(num_kv_shared_layers=20, use_double_wide_mlp=True)
    cfg = HookedTransformerConfig(**_gemma4.gemma4_fields(config))
    assert (cfg.n_kv_shared_layers, cfg.d_mlp_kv_shared) == (20, 2 * config.intermediate_size)
    ours = ["reuse" if cfg.kv_source_layer(i) is not None else "store" if cfg.layer_stores_kv(i)
            else None for i in range(cfg.n_layers)]  # fmt: skip
    assert ours == config.kv_sharing_modes


def keys_as_values(model_type: str = "gemma4_text", seed: int = 0) -> nn.Module:
    """A twin whose global block reads its values by its keys' map (no `v_proj`), with one
    key/value head there (the larger sizes' `num_global_key_value_heads`)."""
    return twin(model_type, seed=seed, attention_k_eq_v=True, num_global_key_value_heads=1)


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4_unified_text"])
def test_keys_serving_as_values_are_transformers_in_float64_throughout(model_type):
    reference = keys_as_values(model_type, seed=11).double()
    assert reference.model.layers[5].self_attn.v_proj is None
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.n_key_value_heads_layers == (2, 2, 2, 2, 2, 1)
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
        assert relative_worst(model(TOKENS), expected) <= 1e-10
    _, cache = model.run_with_cache(TOKENS)
    torch.testing.assert_close(cache["blocks.5.attn.hook_v"], cache["blocks.5.attn.hook_k"])


def test_keys_serving_as_values_load_from_a_saved_directory(tmp_path):
    reference = keys_as_values(seed=12)
    reference.save_pretrained(tmp_path / "model")
    loaded = HookedTransformer.from_hf(tmp_path / "model")
    with torch.no_grad():
        assert relative_worst(loaded(TOKENS), reference(TOKENS).logits) <= 1e-5


def test_without_the_keys_as_values_the_import_would_differ():
    # The global block's values read by a map of their own (its keys' map, redrawn).
    reference = keys_as_values(seed=13).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        model.blocks[5].attn._W_V.normal_(0, 0.125, generator=torch.Generator().manual_seed(0))
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) > 1e-3


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4"])
def test_a_saved_directory_loads_like_the_live_model(tmp_path, model_type):
    # Its block scalars and per-layer inputs read from the files (a composite's under its
    # language model's prefix).
    assert_saved_twin_loads_like_the_live_model(twin(model_type, seed=14), tmp_path)


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4_unified_text"])
def test_every_residual_stream_identity_holds(model_type):
    # With the constants Gemma 4 states: scores unscaled, its norms' epsilon, its bases.
    model = HookedTransformer.from_hf(twin(model_type, seed=15).double())
    _, cache = model.run_with_cache(TOKENS)
    c = model.cfg
    constants = published_constants(c.d_head, attn_scale=1.0, eps=c.eps, rotary_base=c.rotary_base)
    assert_residual_identities(model, cache, constants=constants)
