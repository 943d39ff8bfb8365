"""Attention shaped per block (`n_heads_layers`, `d_head_layers`, `n_key_value_heads_layers`,
`attn_sinks_layers`; values `d_head_v` wide): each block built from its own config
(`cfg.attention_config`), checked against a brute-force float64 loop over heads and
positions written from the attention's equations, the stream's decomposition, generation
with and without the KV cache, and the views that need one shape for every block refusing
by name."""

import math

import pytest
import torch
from helpers.generation import greedy_with_and_without_cache

from hookedattn import FactoredMatrix, HookedTransformer, HookedTransformerConfig

# Three blocks: 4 query heads over 2 key/value heads 8 wide; 2 query heads over 1, 12 wide,
# windowed, with sinks; 6 query heads over 3, 8 wide, with sinks. Values 6 wide in all.
SHAPES = dict(
    n_layers=3, d_model=32, n_ctx=32, d_vocab=50, n_heads=4, d_head=8, d_mlp=48,
    n_heads_layers=(4, 2, 6), d_head_layers=(8, 12, 8), n_key_value_heads_layers=(2, 1, 3),
    d_head_v=6, use_attn_sinks=True, attn_sinks_layers=(False, True, True),
    positional_embedding_type="rotary", rotary_dim=8, window_size=3,
    attn_types=("global", "local", "global"), normalization_type="RMS", gated_mlp=True,
    act_fn="silu", seed=0, dtype="float64",
)  # fmt: skip
HEADS = {0: (4, 2, 8), 1: (2, 1, 12), 2: (6, 3, 8)}  # query heads, key/value heads, d_head
TOKENS = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7], [2, 7, 18, 28, 18, 28, 4, 5, 9, 0]])


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    model = HookedTransformer(HookedTransformerConfig(**SHAPES))
    with torch.no_grad():  # sinks and biases away from their zero initialisation
        for block in model.blocks:
            for name in ("sinks", "b_Q", "b_O"):
                tensor = getattr(block.attn, name, None)
                if tensor is not None:
                    tensor.normal_(generator=torch.Generator().manual_seed(len(name)))
    return model


def test_each_block_records_its_own_head_shapes(model):
    _, cache = model.run_with_cache(TOKENS)
    for layer, (n_q, n_kv, d_head) in HEADS.items():
        a = f"blocks.{layer}.attn"
        assert cache[f"{a}.hook_q"].shape == (2, 10, n_q, d_head)
        assert cache[f"{a}.hook_k"].shape == (2, 10, n_kv, d_head)
        assert cache[f"{a}.hook_v"].shape == (2, 10, n_kv, 6)
        assert cache[f"{a}.hook_z"].shape == (2, 10, n_q, 6)
        assert cache[f"{a}.hook_pattern"].shape == (2, n_q, 10, 10)
        assert (model.blocks[layer].attn.sinks is None) == (layer == 0)


def _brute_force_block(model, cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block `layer`'s queries, keys and values from its normed input (rotated as the cache
    recorded them), then z and the write, one head, query and key at a time."""
    attn, x = model.blocks[layer].attn, cache[f"blocks.{layer}.ln1.hook_normalized"]
    n_q, n_kv, _ = HEADS[layer]
    scale = math.sqrt(SHAPES["d_head"])
    q, k = cache[f"blocks.{layer}.attn.hook_rot_q"], cache[f"blocks.{layer}.attn.hook_rot_k"]
    batch, n_pos = x.shape[:2]
    z = torch.zeros(batch, n_pos, n_q, 6, dtype=torch.float64)
    for b in range(batch):
        for h in range(n_q):
            kv = h // (n_q // n_kv)
            v = x[b] @ attn.W_V[h] + attn.b_V[h]  # W_V repeats key/value head `kv` for `h`
            for i in range(n_pos):
                keys = [j for j in range(i + 1) if layer != 1 or i - j < 3]
                # One scale for every block (`attn_scale`, sqrt of the config's d_head).
                scores = [float(q[b, i, h] @ k[b, j, kv]) / scale for j in keys]
                sink = [float(attn.sinks[h].detach())] if attn.sinks is not None else []
                top = max(scores + sink)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights) + sum(math.exp(s - top) for s in sink)
                for j, w in zip(keys, weights, strict=True):
                    z[b, i, h] += w / total * v[j]
    out = sum(z[:, :, h] @ attn.W_O[h] for h in range(n_q)) + attn.b_O
    return z, out


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_each_block_is_its_brute_force_attention(model, layer):
    _, cache = model.run_with_cache(TOKENS)
    attn, x = model.blocks[layer].attn, cache[f"blocks.{layer}.ln1.hook_normalized"]
    for h in range(HEADS[layer][0]):
        expected_q = x @ attn.W_Q[h] + attn.b_Q[h]
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_q"][:, :, h], expected_q)
    z, out = _brute_force_block(model, cache, layer)
    torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_z"], z, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache[f"blocks.{layer}.hook_attn_out"], out, rtol=0, atol=1e-12)


def test_the_heads_results_and_the_writes_sum_to_the_stream(model):
    per_head = HookedTransformer(model.cfg.replace(use_attn_result=True))
    per_head.load_state_dict(model.state_dict())
    _, cache = per_head.run_with_cache(TOKENS)
    stream = cache["hook_embed"]
    for layer in range(3):
        result = cache[f"blocks.{layer}.attn.hook_result"]
        assert result.shape[2] == HEADS[layer][0]
        written = result.sum(2) + per_head.blocks[layer].attn.b_O
        attn_out = cache[f"blocks.{layer}.hook_attn_out"]
        torch.testing.assert_close(written, attn_out, rtol=0, atol=1e-12)
        stream = stream + attn_out + cache[f"blocks.{layer}.hook_mlp_out"]
    torch.testing.assert_close(stream, cache["blocks.2.hook_resid_post"], rtol=0, atol=1e-12)


def test_generation_with_the_kv_cache_is_generation_without(model):
    with_cache, without = greedy_with_and_without_cache(model, TOKENS[:, :4], max_new_tokens=8)
    assert torch.equal(with_cache, without)


def test_each_blocks_ov_circuit_is_its_dense_product(model):
    for layer in range(3):
        attn = model.blocks[layer].attn
        ov = FactoredMatrix(attn.W_V, attn.W_O)
        dense = attn.W_V @ attn.W_O
        assert ov.AB.shape == (HEADS[layer][0], 32, 32)
        torch.testing.assert_close(ov.AB, dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "read",
    [lambda m, c: m.W_Q, lambda m, c: m.OV, lambda m, c: c.stack("z")],
    ids=["W_Q", "OV", "cache.stack"],
)
def test_a_stack_over_blocks_of_different_shapes_is_refused_by_name(model, read):
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match=r"block 0: \[.*block 1: .*blocks\[L\]|\('z', L\)"):
        read(model, cache)


def test_head_labels_follow_each_blocks_heads(model):
    labels = model.all_head_labels
    assert len(labels) == 4 + 2 + 6 and labels[4:6] == ["L1H0", "L1H1"] and labels[-1] == "L2H5"


def test_tensor_parallel_refuses_blocks_of_different_shapes():
    from hookedattn.core.parallel import check_tp_size

    cfg = HookedTransformerConfig(**{**SHAPES, "n_heads_layers": (4, 4, 4),
                                     "n_key_value_heads_layers": (2, 2, 4)})  # fmt: skip
    with pytest.raises(ValueError, match=r"blocks differ in their attention's heads"):
        check_tp_size(cfg, 2)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(n_heads_layers=(4, 2)), r"n_heads_layers must be 3 ints"),
        (dict(d_head_layers=(8, 0, 8)), r"d_head_layers must be 3 ints \(positive\)"),
        (dict(use_attn_sinks=False), r"attn_sinks_layers .* needs use_attn_sinks=True"),
        (dict(n_key_value_heads_layers=(2, 1, 4)), r"block 2's attention.*n_key_value_heads=4"),
        (dict(d_head_layers=(8, 6, 8)), r"block 1's attention.*rotary_dim"),
    ],
)
def test_a_block_shape_that_cannot_be_built_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        HookedTransformerConfig(**{**SHAPES, **changes})


def test_a_config_with_block_shapes_round_trips_through_json():
    cfg = HookedTransformerConfig(**SHAPES)
    assert HookedTransformerConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.attention_config(1).n_heads == 2 and not cfg.attention_config(0).use_attn_sinks


def test_the_decomposition_by_head_has_each_blocks_heads_and_sums_to_the_stream(model):
    from analysis import decompose_resid

    _, cache = model.run_with_cache(TOKENS)
    decomposition = decompose_resid(model, cache, granularity="head")
    heads = [label for label in decomposition.labels if "H" in label and label[0] == "L"]
    assert heads == [f"L{layer}H{h}" for layer in range(3) for h in range(HEADS[layer][0])]
    final = cache["blocks.2.hook_resid_post"]
    torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-12)


def test_analyses_of_one_layer_head_shape_refuse_blocks_of_different_heads(model):
    from analysis import composition_scores

    with pytest.raises(ValueError, match=r"differ \(n_heads, d_head: block 0: \(4, 8\)"):
        composition_scores(model, "V")


def test_the_cache_over_a_generation_is_run_with_cache_of_its_tokens(model):
    """Each step's recorded activations, every block's heads its own, are those of the
    forward over the whole sequence."""
    out = model.generate(TOKENS[:, :4], 6, stop_at_eos=False, return_cache=True)
    _, expected = model.run_with_cache(out.tokens)
    assert sorted(out.cache) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(out.cache[name], expected[name], rtol=1e-9, atol=1e-9)


def test_a_saved_model_loads_with_each_blocks_shapes(model, tmp_path):
    model.save(tmp_path / "model")
    loaded = HookedTransformer.load(tmp_path / "model")
    assert loaded.cfg == model.cfg
    torch.testing.assert_close(loaded(TOKENS), model(TOKENS), rtol=0, atol=0)


def test_each_blocks_fused_weight_holds_its_own_shapes(model):
    """The q/k/v parameters of every block are views of its one side-by-side weight
    (`kernels.FusedQKV.tie`), values narrower than keys included: an in-place edit of a
    value weight is what the next forward multiplies."""
    edited = model.copy()
    attn = edited.blocks[1].attn
    _, before = edited.run_with_cache(TOKENS, names_filter="blocks.1.attn.hook_v")
    with torch.no_grad():
        attn._W_V.mul_(2.0)
        attn._b_V.mul_(2.0)
    _, after = edited.run_with_cache(TOKENS, names_filter="blocks.1.attn.hook_v")
    v = "blocks.1.attn.hook_v"
    torch.testing.assert_close(after[v], 2 * before[v], rtol=0, atol=1e-12)


def test_per_head_input_copies_follow_each_blocks_heads(model):
    split = HookedTransformer(model.cfg.replace(use_split_qkv_input=True))
    split.load_state_dict(model.state_dict())
    _, cache = split.run_with_cache(TOKENS)
    assert [cache[f"blocks.{layer}.hook_q_input"].shape[2] for layer in range(3)] == [4, 2, 6]
    assert [cache[f"blocks.{layer}.hook_k_input"].shape[2] for layer in range(3)] == [2, 1, 3]
    torch.testing.assert_close(split(TOKENS), model(TOKENS), rtol=0, atol=1e-12)
