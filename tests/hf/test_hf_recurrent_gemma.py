"""RecurrentGemma imported by convention: Griffin's recurrent blocks (`components.rg_lru`) in
attention's place in two of every three layers, local attention in the third, a dense gated
MLP whose gate has a bias (`mlp_gate_bias`) and half `intermediate_size` wide, the embedding
scaled by `sqrt(hidden_size)` rounded to bfloat16. Each is compared with `transformers` on a
tiny random twin: the logits, every residual stream and the sublayers' writes, greedy
generation, and the checkpoint's files against the live model.

`transformers` runs its RMSNorms and the RG-LRU's scan in float32 whatever the model's dtype,
so a float64 twin agrees with our float64 import to float32's rounding only: on seed 3, with
a window of 4, the logits are 2.9e-7 of their scale apart in float64 (8.2e-7 in float32), the
residual streams 2.2e-7; the bound is 1e-5. The float64 exactness of the recurrent block
itself is checked against its recurrence in `tests/core/test_rg_lru.py`.
"""

import pytest
import torch
from helpers.float64_hf import InFloat64Throughout
from helpers.generation import greedy_ours_and_transformers
from helpers.saving import assert_saves_and_loads
from helpers.twins import (
    assert_decomposition_sums,
    assert_files_read_as_the_live_model,
    relative_worst,
    streams_worst,
    tiny_twin,
    write_worst,
)

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _tiny  # noqa: E402

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)
ROUNDING = 1e-5  # of each tensor's largest value (module docstring)


def twin(seed: int = 0, **fields) -> torch.nn.Module:
    """A tiny random RecurrentGemma (recurrent, recurrent, attention)."""
    return tiny_twin("recurrent_gemma", seed=seed, **fields)


def test_the_layers_are_read_as_transformers_builds_them():
    reference = twin(seed=1)
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.mixers.layers == ("rg_lru", "rg_lru", "attention")
    assert model.cfg.mlp_gate_bias and model.cfg.gated_mlp
    assert model.cfg.d_mlp == reference.config.intermediate_size // 2
    mixer = model.blocks[0].mixer
    assert mixer.W_a.shape == (reference.config.num_attention_heads, 16, 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logits_and_every_residual_stream_are_transformers(dtype):
    reference = twin(seed=3, attention_window_size=4).to(dtype)  # the window reached
    model = HookedTransformer.from_hf(reference)
    assert streams_worst(model, reference, TOKENS) <= ROUNDING


def test_an_embedding_scale_that_bfloat16_rounds_is_transformers():
    # sqrt(48) = 6.928 is held as 6.9375; the tiny twin's sqrt(64) = 8 rounds to itself.
    config = transformers.AutoConfig.for_model(
        "recurrent_gemma", hidden_size=48, lru_width=48, num_attention_heads=4,
        num_key_value_heads=1, head_dim=12, intermediate_size=96, vocab_size=128,
    )  # fmt: skip
    reference = _tiny.random_hf_model(transformers.RecurrentGemmaForCausalLM, config, seed=4)
    assert float(reference.model.normalizer) == 6.9375
    model = HookedTransformer.from_hf(reference.double())
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= ROUNDING


def test_float64_logits_are_transformers_in_float64_throughout():
    reference = twin(seed=3, attention_window_size=4).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
        assert relative_worst(model(TOKENS), expected) <= 1e-10


def test_the_logits_soft_cap_is_read_and_bites():
    # A cap near the tiny twin's logits' scale: tanh is far from the identity there. Read
    # under RecurrentGemma's own name (`logits_soft_cap`), which was once left unread.
    reference = twin(seed=3).double()
    with torch.no_grad():
        scale = float(reference(TOKENS).logits.abs().max())
    reference.config.logits_soft_cap = scale
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.output_logits_soft_cap == scale
    with torch.no_grad():
        capped = reference(TOKENS).logits
        logits, cache = model.run_with_cache(TOKENS, names_filter="unembed.hook_in")
        raw = model.unembed.W_U.T @ cache["unembed.hook_in"][..., None]
    assert relative_worst(logits, capped) <= ROUNDING
    assert relative_worst(raw.squeeze(-1), capped) > 0.1


# Our hook point -> (the layer, its piece whose output it is).
WRITES = {
    "blocks.0.mixer.hook_out": (0, "temporal_block"),
    "blocks.0.hook_mlp_out": (0, "mlp_block"),
    "blocks.2.hook_attn_out": (2, "temporal_block"),
}


@pytest.mark.parametrize("ours", WRITES)
def test_each_sublayers_write_is_transformers(ours):
    reference = twin(seed=5).double()
    assert write_worst(reference, ours, *WRITES[ours], TOKENS) <= ROUNDING


def test_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=6), TOKENS[:, :5]))


def test_the_decomposition_of_an_import_sums_to_the_stream():
    model = HookedTransformer.from_hf(twin(seed=7).double())
    assert_decomposition_sums(model, TOKENS, ("sublayer", "head"))


def test_the_files_are_read_as_the_live_model(tmp_path):
    reference = twin(seed=8)
    reference.save_pretrained(tmp_path)
    assert_files_read_as_the_live_model(reference, tmp_path)


def test_an_import_saves_and_loads(tmp_path):
    model = HookedTransformer.from_hf(twin(seed=9))
    assert_saves_and_loads(model, tmp_path / "ours", TOKENS)
