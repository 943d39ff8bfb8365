"""MiniMax (`_minimax`): lightning attention layers (`components.lightning`) between softmax
attention layers, as `layer_types` says, each block's skips carrying its normed input times
`*_alpha_factor` (`NormedSkipBlock`), its writes times `*_beta_factor` (folded into the
output maps), Mixtral's experts. Compared with `transformers` on a tiny random twin of two
layers (lightning, then softmax attention) whose alphas and betas are not 1: the logits and
every residual stream in float32 and in float64, greedy generation, the checkpoint's files.

`transformers` makes the lightning layers' decay tables (`query_decay`, `key_decay`,
`diagonal_decay`) in float32 when it builds the model; `.double()` keeps their float32
values, and so does the import (`lightning_decay_float32`): within one of its blocks of
`block_size` positions the two then agree in float64. Across blocks `transformers`
multiplies entries of two float32 tables; there (`block_size=4`, so that the state carried
from block to block is exercised) the float64 reference is the same model with its tables
rebuilt in float64 from the same `slope_rate` (`_decay_tables_in_float64`), and the
import's decays float64 too.
"""

import dataclasses

import pytest
import torch
from helpers.float64_hf import InFloat64Throughout
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import (
    assert_files_read_as_the_live_model,
    relative_worst,
    streams_worst,
    tiny_twin,
)

import hookedattn
from hookedattn import HookedTransformer

pytest.importorskip("transformers")

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)
# The lightning layer first: its decay, a function of the layer's index, is then strongest.
KINDS = ["linear_attention", "full_attention"]
SCALES = dict(
    full_attn_alpha_factor=1.7, linear_attn_alpha_factor=1.7, full_attn_beta_factor=0.6,
    linear_attn_beta_factor=1.3, mlp_alpha_factor=2.1, mlp_beta_factor=0.8,
)  # fmt: skip


@pytest.fixture(autouse=True)
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: each test verifies afresh."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def twin(seed: int = 0, **fields) -> torch.nn.Module:
    """A tiny random MiniMax (module docstring)."""
    fields = dict(num_hidden_layers=2, layer_types=KINDS, **SCALES) | fields
    return tiny_twin("minimax", seed=seed, **fields)


def _decay_tables_in_float64(reference: torch.nn.Module) -> torch.nn.Module:
    """`reference` (float64) with each lightning layer's decay tables rebuilt in float64."""
    for layer in reference.model.layers:
        attention = layer.self_attn
        if hasattr(attention, "slope_rate"):
            default = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
            try:
                tables = attention.decay_factors(attention.slope_rate.double())
            finally:
                torch.set_default_dtype(default)
            names = ("query_decay", "key_decay", "diagonal_decay")
            for name, table in zip(names, tables, strict=True):
                getattr(attention, name).copy_(table)
    return reference


def test_the_layers_are_read_as_transformers_builds_them():
    reference = twin(seed=1)
    cfg = HookedTransformer.from_hf(reference).cfg
    assert cfg.mixers.layers == ("lightning", "attention")
    assert (cfg.mixers.n_ssm_heads, cfg.mixers.d_ssm_head) == (cfg.n_heads, cfg.d_head)
    assert cfg.normed_skip and (cfg.attn_skip_scale, cfg.mlp_skip_scale) == (1.7, 2.1)
    assert cfg.num_experts == reference.config.num_local_experts


@pytest.mark.parametrize("block_size", [256, 4])
def test_logits_and_every_residual_stream_are_transformers_in_float32(block_size):
    reference = twin(seed=3, block_size=block_size)
    assert streams_worst(HookedTransformer.from_hf(reference), reference, TOKENS) <= 1e-5


def test_logits_and_every_residual_stream_are_transformers_in_float64():
    reference = twin(seed=4).double()
    model = HookedTransformer.from_hf(reference)
    assert streams_worst(model, InFloat64Throughout(reference), TOKENS) <= 1e-10


def test_across_blocks_they_are_transformers_with_float64_decays():
    reference = _decay_tables_in_float64(twin(seed=4, block_size=4).double())
    model = _changed(HookedTransformer.from_hf(reference), lightning_decay_float32=False)
    assert streams_worst(model, InFloat64Throughout(reference), TOKENS) <= 1e-10


def test_decays_computed_in_float64_part_from_transformers_tables():
    # The float32 decays left out, a float64 import parts from transformers' float64 model.
    reference = twin(seed=4).double()
    model = _changed(HookedTransformer.from_hf(reference), lightning_decay_float32=False)
    assert streams_worst(model, InFloat64Throughout(reference), TOKENS) > 1e-9


def test_a_sliding_window_slides_in_the_attention_layers():
    reference = twin(seed=13, sliding_window=4)
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.window_size == 4
    assert streams_worst(model, reference, TOKENS) <= 1e-5


def test_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=6), TOKENS[:, :5]))


def _changed(model: HookedTransformer, **mixers) -> HookedTransformer:
    """`model`'s weights in a model whose mixer settings `mixers` changes."""
    cfg = dataclasses.replace(model.cfg, mixers=dataclasses.replace(model.cfg.mixers, **mixers))
    changed = HookedTransformer(cfg)
    changed.load_state_dict(model.state_dict())
    return changed


def _moved(model: HookedTransformer, expected: torch.Tensor, **changes) -> float:
    """How far the logits of `model`'s weights under `changes` to its config are from
    `expected`."""
    changed = HookedTransformer(dataclasses.replace(model.cfg, **changes))
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        return relative_worst(changed(TOKENS), expected)


def test_each_piece_left_out_moves_the_logits():
    # The normed skips (a plain stream skip instead), each skip's scale (1 instead) and the
    # lightning layers' decay (none) each part the logits from transformers'.
    reference = twin(seed=5).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
        assert relative_worst(model(TOKENS), expected) <= 1e-10
        state = {n: t.zero_() if n.endswith("decay_rate") else t
                 for n, t in model.state_dict().items()}  # fmt: skip
        model.load_state_dict(state)
        without_decay = model(TOKENS)
    assert relative_worst(without_decay, expected) > 1e-3
    model = HookedTransformer.from_hf(reference)
    assert _moved(model, expected, normed_skip=False, attn_skip_scale=1.0,
                  mlp_skip_scale=1.0) > 1e-2  # fmt: skip
    assert _moved(model, expected, attn_skip_scale=1.0) > 1e-2
    assert _moved(model, expected, mlp_skip_scale=1.0) > 1e-2


def test_the_betas_are_folded_into_the_output_maps():
    # The same weights with every beta 1: the import's output maps differ by each beta.
    plain = HookedTransformer.from_hf(twin(seed=7, **{k: 1 for k in SCALES if "beta" in k}))
    scaled = HookedTransformer.from_hf(twin(seed=7))
    weights = plain.state_dict()
    for name, beta in (("blocks.1.attn.W_O", 0.6), ("blocks.0.mixer.W_out", 1.3),
                       ("blocks.1.mlp.W_out", 0.8)):  # fmt: skip
        torch.testing.assert_close(scaled.state_dict()[name], weights[name] * beta)


def test_each_stream_is_the_sum_of_its_skip_and_its_write():
    model = HookedTransformer.from_hf(twin(seed=8).double())
    _, cache = model.run_with_cache(TOKENS)
    for i in range(model.cfg.n_layers):
        b = f"blocks.{i}"
        for stream, skip, write in (("resid_mid", "attn_skip", "attn_out"),
                                    ("resid_post", "mlp_skip", "mlp_out")):  # fmt: skip
            summed = cache[f"{b}.hook_{skip}"] + cache[f"{b}.hook_{write}"]
            torch.testing.assert_close(summed, cache[f"{b}.hook_{stream}"], rtol=0, atol=0)


def test_the_decomposition_of_an_import_sums_to_the_stream():
    from analysis import decompose_resid

    model = HookedTransformer.from_hf(twin(seed=9).double())
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    decomposition = decompose_resid(model, cache, granularity="sublayer")
    torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)


def test_the_files_are_read_as_the_live_model(tmp_path):
    reference = twin(seed=10)
    reference.save_pretrained(tmp_path)
    assert_files_read_as_the_live_model(reference, tmp_path)


def test_attention_alphas_that_differ_are_refused_by_name():
    with pytest.raises(ValueError, match="full_attn_alpha_factor=1.7 differs"):
        HookedTransformer.from_hf(twin(seed=11, linear_attn_alpha_factor=2.5))


def test_folding_the_norms_is_refused():
    model = HookedTransformer.from_hf(twin(seed=12))
    with pytest.raises(ValueError, match="normed_skip"):
        hookedattn.fold_layer_norm(model)
