"""Llama 4's text model (`Llama4ForCausalLM`) imported by convention: its tiny twin (8 layers,
`_tiny.OVERRIDES`: dense MLPs in the even layers, experts in the odd ones; layers 3 and 7
without rotary positions; chunks of 4 positions; a query temperature stepping up every 4
positions) read as ours: `rotary_layers` from `no_rope_layers`, weightless q/k norms after
the rotation in the rotating blocks only (`qk_norm_layers`), chunked local attention in
them (`window_chunked`), the query temperature in the others (`hook_q_tuned`), a sigmoid
router whose weights scale the experts' inputs (`expert_input_weighted`) beside a shared
expert. Compared with `transformers`: logits in float64 and float32, each layer's attention
and MLP writes, greedy generation past several chunk boundaries, a saved directory; and the
residual stream's decomposition by expert sums."""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import (
    assert_saved_twin_loads_like_the_live_model,
    logits_worst,
    relative_worst,
    tiny_twin,
)
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")

# 11 positions: three chunks of 4 (the last partial), the temperature past 1 from position 3.
TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 11, 38],
                       [9, 2, 2, 71, 30, 6, 5, 14, 100, 4, 4]])  # fmt: skip


def twin(seed: int = 0) -> nn.Module:
    """A tiny random Llama 4 text model, as the verification builds one."""
    return tiny_twin("llama4_text", seed)


def test_llama4_pieces_are_read_as_ours():
    cfg = HookedTransformer.from_hf(twin(seed=1)).cfg
    rotating = (True, True, True, False) * 2
    assert cfg.rotary_layers == rotating and cfg.qk_norm_layers == rotating
    # The norms carry no gain, so they commute with the rotation: read before it.
    assert cfg.window_chunked and cfg.window_size == 4
    assert cfg.attn_types == tuple("local" if r else "global" for r in rotating)
    assert (cfg.query_temperature_floor, cfg.query_temperature_scale) == (4, 0.1)
    assert cfg.router_scoring == "sigmoid" and cfg.expert_input_weighted
    assert cfg.moe_layers == (False, True) * 4 and cfg.d_mlp_dense == 96


def test_llama4_logits_are_transformers_in_float64():
    """To float32's rounding: transformers' norms and router compute in float32 even in a
    float64 model."""
    assert logits_worst(twin(seed=2).double(), TOKENS) <= 1e-6


def test_llama4_logits_are_transformers_in_float32():
    assert logits_worst(twin(seed=3), TOKENS) <= 1e-5


@pytest.mark.parametrize(
    "fields",
    [dict(use_qk_norm=False), dict(attn_temperature_tuning=False), dict(attention_chunk_size=None)],
    ids=["no_qk_norm", "no_temperature", "no_chunks"],
)  # fmt: skip
def test_each_piece_left_out_as_a_config_may_is_still_transformers(fields):
    """The 128-expert checkpoint keeps no q/k norm; a config may turn off the temperature
    or the chunks: each imports as such (the fields read say so) and computes the same."""
    reference = tiny_twin("llama4_text", 10, **fields)
    model = HookedTransformer.from_hf(reference)
    cfg = model.cfg
    pieces = {"use_qk_norm": cfg.use_qk_norm,
              "attn_temperature_tuning": cfg.query_temperature_floor is not None,
              "attention_chunk_size": cfg.window_chunked}  # fmt: skip
    assert [name for name, on in pieces.items() if not on] == list(fields)
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= 1e-5


def test_every_layer_writes_what_transformers_writes():
    reference = twin(seed=4).double()
    model = HookedTransformer.from_hf(reference)
    seen = {}
    for i, layer in enumerate(reference.model.layers):
        for name in ("self_attn", "feed_forward"):
            hook = lambda m, args, out, key=(i, name): seen.update({key: out})
            getattr(layer, name).register_forward_hook(hook)
    with torch.no_grad():
        reference(TOKENS)
        _, cache = model.run_with_cache(TOKENS)
    for i in range(model.cfg.n_layers):
        attn, mlp = seen[(i, "self_attn")][0], seen[(i, "feed_forward")]
        mlp = mlp[0].view_as(cache[f"blocks.{i}.hook_mlp_out"]) if isinstance(mlp, tuple) else mlp
        assert relative_worst(cache[f"blocks.{i}.hook_attn_out"], attn) <= 1e-6, i
        assert relative_worst(cache[f"blocks.{i}.hook_mlp_out"], mlp) <= 1e-6, i


@pytest.mark.parametrize(
    "change", [dict(query_temperature_floor=None), dict(window_chunked=False)],
    ids=["no_temperature", "sliding_window"],
)  # fmt: skip
def test_without_a_piece_the_import_would_differ(change):
    """The twin reaches the temperature and the chunks: leaving either out moves the
    logits well past the tolerance (so the verification on load would refuse it)."""
    reference = twin(seed=5).double()
    model = HookedTransformer.from_hf(reference)
    changed = HookedTransformer(model.cfg.replace(**change))
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = reference(TOKENS).logits
        assert relative_worst(changed(TOKENS), expected) > 1e-3


def test_decomposition_by_expert_sums_to_the_stream():
    from analysis import decompose_resid

    model = HookedTransformer.from_hf(twin(seed=6).double())
    _, cache = model.run_with_cache(TOKENS)
    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    decomposition = decompose_resid(model, cache, granularity="expert")
    torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)


def test_llama4_greedy_generation_past_chunk_boundaries_is_transformers():
    """From 3 positions to 13: the chunks of 4 start again at 4, 8 and 12."""
    got, expected = greedy_ours_and_transformers(twin(seed=7), TOKENS[:, :3], max_new_tokens=10)
    assert torch.equal(got, expected)


def test_a_saved_directory_loads_like_the_live_model(tmp_path):
    assert_saved_twin_loads_like_the_live_model(twin(seed=8), tmp_path)


def test_the_cache_over_a_generation_is_run_with_cache_of_its_tokens():
    """Past chunk boundaries and temperature steps, each step's recorded activations (and
    the patterns recomputed for its queries) are those of the forward over the whole. The
    experts' own rows are left out: a generation's cache of any mixture refuses them."""
    model = HookedTransformer.from_hf(twin(seed=9).double())
    rows = lambda name: ".experts." not in name
    out = model.generate(TOKENS[:, :3], 7, stop_at_eos=False, return_cache=True, names_filter=rows)
    _, expected = model.run_with_cache(out.tokens, names_filter=rows)
    assert sorted(out.cache) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(out.cache[name], expected[name], rtol=1e-9, atol=1e-9)
