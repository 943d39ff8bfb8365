"""Gemma 4's blocks reading earlier blocks' keys and values (`num_kv_shared_layers`, the
released E2B and E4B models'; `components.shared_kv_attention`) import exactly.

Each twin has 8 blocks, local but for the global blocks 3 and 7, the last 3 sharing: blocks
5 and 6 read block 4's keys and values, block 7 block 3's; with `use_double_wide_mlp` the
shared blocks' MLPs are twice as wide. Checked against `transformers`: logits in float64
throughout and float32, greedy generation (with our KV cache and without), an edit of a
source block's `hook_k` reaching the blocks that read it, and leaving the sharing out (each
shared block computing its own keys and values by its source's weights) moving the logits.
"""

import pytest
import torch
from einops import rearrange
from helpers.float64_hf import InFloat64Throughout
from helpers.generation import greedy_ours_and_transformers, greedy_with_and_without_cache
from helpers.twins import assert_files_read_as_the_live_model, relative_worst, tiny_twin

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.hf import _tiny
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn.testing import assert_residual_identities, published_constants

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 11], [9, 2, 2, 71, 30, 6, 5, 14, 100, 4]])
TYPES = ("gemma4_text", "gemma4_unified_text")
S, F = "sliding_attention", "full_attention"


@pytest.fixture(autouse=True)
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: each test verifies afresh."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def shared(model_type: str = "gemma4_text", seed: int = 0, wide: bool = False) -> torch.nn.Module:
    """The 8-block twin of `model_type` (module docstring), its blocks' scalars drawn."""
    small = tiny_twin(model_type, seed=seed)
    fields = small.config.to_dict()
    text = fields.get("text_config", fields)  # a composite's language model's
    text |= {
        "num_hidden_layers": 8,
        "layer_types": [S, S, S, F, S, S, S, F],
        "per_layer_config": {3: {"head_dim": 64}, 7: {"head_dim": 64}},
        "num_kv_shared_layers": 3,
        "use_double_wide_mlp": wide,
    }
    model = _tiny.random_hf_model(type(small), type(small.config).from_dict(fields), seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.get_decoder().layers:
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=generator))
    return model


def test_the_shared_blocks_are_read_as_ours():
    reference = shared(wide=True)
    assert reference.config.kv_sharing_modes[3:] == ["store", "store", "reuse", "reuse", "reuse"]
    model = HookedTransformer.from_hf(reference)
    cfg = model.cfg
    assert (cfg.n_kv_shared_layers, cfg.d_mlp_kv_shared) == (3, 256)
    assert [cfg.kv_source_layer(i) for i in range(8)] == [None] * 5 + [4, 4, 3]
    assert [model.blocks[i].mlp.W_in.shape[1] for i in (4, 5)] == [128, 256]
    own = {name.rpartition(".")[2] for name in model.hook_dict if name.startswith("blocks.5.")}
    assert {"hook_q", "hook_rot_q", "hook_attn_scores", "hook_pattern", "hook_z"} <= own
    assert not {"hook_k", "hook_v", "hook_rot_k"} & own


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("model_type", TYPES)
def test_logits_are_transformers_in_float64_throughout(model_type, wide):
    reference = shared(model_type, seed=1, wide=wide).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
        assert relative_worst(model(TOKENS), expected) <= 1e-10


@pytest.mark.parametrize("model_type", TYPES)
def test_logits_are_transformers_in_float32(model_type):
    reference = shared(model_type, seed=2, wide=True)
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= 1e-5


@pytest.mark.parametrize("model_type", TYPES)
def test_greedy_generation_past_the_window_is_transformers(model_type):
    reference = shared(model_type, seed=3, wide=True)
    got, expected = greedy_ours_and_transformers(reference, TOKENS[:, :3], max_new_tokens=8)
    assert torch.equal(got, expected)
    cached, recomputed = greedy_with_and_without_cache(
        HookedTransformer.from_hf(reference), TOKENS[:, :3], max_new_tokens=8
    )
    assert torch.equal(cached, recomputed) and torch.equal(cached, expected)


def test_the_shared_blocks_read_their_sources_cache_entries():
    # A prompt in two forwards through our KV cache: the shared blocks' own entries stay
    # empty, and the logits are the whole forward's.
    model = HookedTransformer.from_hf(shared(seed=4).double())
    cache = KeyValueCache.empty(model.cfg, batch=2, capacity=10)
    with torch.no_grad():
        first, second = (
            model(TOKENS[:, :6], past_kv_cache=cache),
            model(TOKENS[:, 6:], past_kv_cache=cache),
        )
        whole = model(TOKENS)
    assert [entry.past_keys.shape[1] for entry in cache.entries] == [10] * 5 + [0] * 3
    assert [entry.capacity for entry in cache.entries[5:]] == [0] * 3
    assert relative_worst(torch.cat([first, second], dim=1), whole) <= 1e-12


def _shifted(k: torch.Tensor, hook=None) -> torch.Tensor:
    """Key head 0 at positions 2.. shifted by 1 (ours: `[batch pos kv_head d_head]`; a
    shift, as the key norm undoes a scale)."""
    k = k.clone()
    k[:, 2:, 0] += 1.0
    return k


def test_an_edit_of_the_source_keys_reaches_the_blocks_reading_them():
    # Block 4's keys edited at its hook_k, and HF's layer 4 k_proj output edited alike.
    reference = shared(seed=5).double()
    model = HookedTransformer.from_hf(reference)
    hf_shifted = lambda m, args, out: rearrange(
        _shifted(rearrange(out, "b p (h d) -> b p h d", d=32)), "b p h d -> b p (h d)"
    )
    reference.model.layers[4].self_attn.k_proj.register_forward_hook(hf_shifted)
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
    _, plain = model.run_with_cache(TOKENS)
    with model.hooks(fwd_hooks=[("blocks.4.attn.hook_k", _shifted)]):
        logits, edited = model.run_with_cache(TOKENS)
    assert relative_worst(logits, expected) <= 1e-10
    pattern = lambda layer: f"blocks.{layer}.attn.hook_pattern"
    moved = lambda layer: float((edited[pattern(layer)] - plain[pattern(layer)]).abs().max())
    assert moved(4) > 1e-3 and moved(5) > 1e-3 and moved(6) > 1e-3


def test_without_the_sharing_the_import_would_differ():
    # Each shared block computing its own keys and values, by its source's weights.
    reference = shared(seed=6).double()
    model = HookedTransformer.from_hf(reference)
    own = HookedTransformer(model.cfg.replace(n_kv_shared_layers=0))
    state = model.state_dict()
    for layer, source in ((5, 4), (6, 4), (7, 3)):
        for name in ("_W_K", "_W_V", "_b_K", "_b_V", "k_norm.w"):
            state[f"blocks.{layer}.attn.{name}"] = state[f"blocks.{source}.attn.{name}"]
    own.load_state_dict(state)
    with torch.no_grad():
        assert relative_worst(own(TOKENS), reference(TOKENS).logits) > 1e-3


def test_every_residual_stream_identity_holds_through_the_shared_keys():
    # The heads' writes sum to each block's attention output, the shared blocks' scores
    # are their queries against their sources' keys, their z the pattern over their values.
    model = HookedTransformer.from_hf(shared(seed=7, wide=True).double())
    per_head = HookedTransformer(model.cfg.replace(use_attn_result=True))
    per_head.load_state_dict(model.state_dict())
    _, cache = per_head.run_with_cache(TOKENS)
    c = model.cfg
    constants = published_constants(c.d_head, attn_scale=1.0, eps=c.eps, rotary_base=c.rotary_base)
    assert_residual_identities(per_head, cache, constants=constants)
    for i in range(c.n_layers):
        summed = (cache[f"blocks.{i}.hook_resid_mid"] + cache[f"blocks.{i}.hook_mlp_out"]
                  + cache[f"blocks.{i}.hook_per_layer_out"])  # fmt: skip
        torch.testing.assert_close(cache[f"blocks.{i}.resid_scale.hook_in"], summed)


def test_what_a_shared_block_does_not_have_is_named():
    model = HookedTransformer.from_hf(shared(seed=8).double())
    with pytest.raises(ValueError, match=r"keys and values of block 4 .* no W_K"):
        model.blocks[5].attn.W_K
    with pytest.raises(ValueError, match=r"keys and values of block 4 .* no W_K"):
        model.key_value_weights(6)
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match=r"block 3 .* start at block 3 or earlier"):
        model(cache["blocks.4.hook_resid_pre"], start_at_layer=4, tokens=TOKENS)
    torch.testing.assert_close(
        model(cache["blocks.3.hook_resid_pre"], start_at_layer=3, tokens=TOKENS),
        model(TOKENS),
    )


def one_shape(**fields) -> HookedTransformer:
    """A random model of 4 blocks of one attention shape, global, in float64."""
    cfg = HookedTransformerConfig(
        n_layers=4, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=128, n_ctx=32,
        act_fn="gelu", normalization_type="RMS", positional_embedding_type="rotary",
        seed=0, dtype="float64", **fields,
    )  # fmt: skip
    return HookedTransformer(cfg)


def test_folding_value_biases_folds_the_sources_into_the_blocks_reading_them():
    from hookedattn import fold_value_biases

    model = one_shape(n_kv_shared_layers=2, n_key_value_heads=2)  # blocks 2, 3 read block 1
    with torch.no_grad():
        for block in model.blocks[:2]:
            block.attn._b_V.normal_(generator=torch.Generator().manual_seed(0))
        folded = fold_value_biases(model)
        assert relative_worst(folded(TOKENS), model(TOKENS)) <= 1e-12
    assert not folded.blocks[1].attn._b_V.any()


def test_the_patching_sweep_refuses_by_name():
    from analysis.patching import activation_patch

    # A model of one attention shape (the twin's blocks differ, refused before the sweep).
    model = one_shape(n_kv_shared_layers=1)
    metric = lambda logits: logits[:, -1, 0]
    with pytest.raises(ValueError, match=r"n_kv_shared_layers=1"):
        activation_patch(model, "resid_pre", clean_tokens=TOKENS,
                         corrupted_tokens=TOKENS.flip(1), metric=metric)  # fmt: skip


def test_every_layer_reusing_keys_is_named():
    config = transformers.Gemma4TextConfig(num_hidden_layers=4, num_kv_shared_layers=4)
    from hookedattn.core.hf import _gemma4

    with pytest.raises(ValueError, match=r"every layer reusing .*num_kv_shared_layers=4"):
        _gemma4.gemma4_fields(config)


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4"])
def test_a_saved_directory_loads_verified_like_the_live_model(tmp_path, model_type):
    # Verified on load by a twin of its own config, shrunk with its shared layers kept.
    reference = shared(model_type, seed=10, wide=True)
    reference.save_pretrained(tmp_path / "model")
    loaded = HookedTransformer.from_hf(tmp_path / "model")
    assert loaded.verification is not None and loaded.verification.worst <= 1e-10
    assert loaded.cfg.n_kv_shared_layers == 3
    assert_files_read_as_the_live_model(reference, tmp_path / "model")


def test_a_shared_blocks_head_values_are_its_sources():
    from analysis import head_values

    model = HookedTransformer.from_hf(shared(seed=11).double())
    _, cache = model.run_with_cache(TOKENS)
    torch.testing.assert_close(head_values(model, cache, 6), head_values(model, cache, 4))
    assert not torch.equal(head_values(model, cache, 4), head_values(model, cache, 2))


def test_the_cache_over_a_generation_is_run_with_cache_of_its_tokens():
    # The shared blocks' patterns recorded step by step, over their sources' cache entries.
    model = HookedTransformer.from_hf(shared(seed=12).double())
    out = model.generate(TOKENS[:, :4], 5, stop_at_eos=False, return_cache=True)
    _, expected = model.run_with_cache(out.tokens)
    assert sorted(out.cache) == sorted(expected)
    for name in ("blocks.5.attn.hook_pattern", "blocks.7.attn.hook_z", "blocks.7.hook_resid_post"):
        torch.testing.assert_close(out.cache[name], expected[name], rtol=1e-10, atol=1e-12)


def test_tensor_parallelism_refuses_by_name():
    from hookedattn.core.parallel import check_tp_size

    with pytest.raises(ValueError, match=r"read earlier blocks' keys .*n_kv_shared_layers"):
        check_tp_size(one_shape(n_kv_shared_layers=1).cfg, 2)
