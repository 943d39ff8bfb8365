"""Bailing Hybrid (Ling 3) imported by convention: Kimi Delta Attention in its Bailing form
(`components.kimi_delta` with `kda_full_rank_gates`: each gate one full map; the decay
bounded, `kda_decay_bound`, its "safe gate") in attention's place in the layers
`layer_types` calls "linear_attention" (named `self_attn`, as its attention is: told apart
by their parts), DeepSeek V3's latent attention (interleaved rotary) with a sigmoid output
gate per head (`attn_gate_per_head`) in every sixth, dense gated MLPs in the first
`first_k_dense_replace` layers and DeepSeek V3's sigmoid-routed experts with a shared expert
after them. Each is compared with `transformers` on a tiny random twin (five delta layers,
then latent attention): the logits, every residual stream and the sublayers' writes, greedy
generation, the checkpoint's files (the layers' `self_attn` saved as `attention`, the
convolution as `q_conv1d`, `k_conv1d`, `v_conv1d`, the multi-token prediction layer past the
decoder's not read) against the live model.

`transformers` runs its delta rule in float32 whatever the model's dtype, so a float64 twin
agrees with our float64 import to float32's rounding only (the numbers the tests measured
are in `docs/guide/families.md`; `transformers`' own float32 and float64 twins are as far
apart); the bound is 1e-5 of each tensor's largest value. The float64 exactness of the delta
layer is checked against its recurrence in `tests/core/test_kimi_delta.py` and against
`transformers`' own module given the same weights in `test_kimi_delta_module.py`; the gated
latent attention's against a brute force in `tests/core/test_latent_attention.py`.
"""

import dataclasses

import pytest
import torch
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
from safetensors.torch import load_file, save_file

from hookedattn import HookedTransformer

pytest.importorskip("transformers")

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)
ROUNDING = 1e-5  # of each tensor's largest value (module docstring)
DELTA_LAYERS = 5


def twin(seed: int = 0, **fields) -> torch.nn.Module:
    """A tiny random Bailing Hybrid (five delta layers, then latent attention)."""
    return tiny_twin("bailing_hybrid", seed=seed, **fields)


def test_the_layers_are_read_as_transformers_builds_them():
    reference = twin(seed=1)
    model = HookedTransformer.from_hf(reference)
    cfg, c = model.cfg, reference.config
    assert cfg.mixers.layers == ("kimi_delta",) * DELTA_LAYERS + ("attention",)
    assert cfg.mixers.kda_full_rank_gates and cfg.mixers.kda_decay_bound == c.kda_lower_bound
    assert (cfg.attn_gate, cfg.attn_gate_per_head) == ("sigmoid", True)
    assert cfg.kv_lora_rank == c.kv_lora_rank and cfg.layer_rotates(DELTA_LAYERS)
    assert model.blocks[DELTA_LAYERS].attn.W_G.shape == (c.num_attention_heads, c.hidden_size, 1)
    assert [cfg.layer_is_moe(i) for i in range(cfg.n_layers)] == [False] * 2 + [True] * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("safe_gate", [True, False])
def test_logits_and_every_residual_stream_are_transformers(dtype, safe_gate):
    reference = twin(seed=3, kda_safe_gate=safe_gate).to(dtype)
    model = HookedTransformer.from_hf(reference)
    assert (model.cfg.mixers.kda_decay_bound is None) == (not safe_gate)
    assert streams_worst(model, reference, TOKENS) <= ROUNDING


# Our hook point -> (the layer, its piece whose output it is).
WRITES = {
    "blocks.0.mixer.hook_out": (0, "self_attn"),
    "blocks.0.hook_mlp_out": (0, "mlp"),
    "blocks.3.hook_mlp_out": (3, "mlp"),
    "blocks.5.hook_attn_out": (5, "self_attn"),
}


@pytest.mark.parametrize("ours", WRITES)
def test_each_sublayers_write_is_transformers(ours):
    reference = twin(seed=5).double()
    assert write_worst(reference, ours, *WRITES[ours], TOKENS) <= ROUNDING


def test_the_delta_layers_the_gate_and_the_bounded_decay_move_the_logits():
    # Each piece the import reads is exercised: without the delta layers' writes, without
    # the attention's output gate, or with Kimi Linear's unbounded decay in place of the
    # bounded one, the logits leave transformers'.
    reference = twin(seed=3).double()
    model = HookedTransformer.from_hf(reference)
    cfg = model.cfg
    silenced = [(f"blocks.{i}.mixer.hook_out", lambda out, hook: out * 0)
                for i in range(DELTA_LAYERS)]  # fmt: skip
    ungated = HookedTransformer(dataclasses.replace(cfg, attn_gate=None, attn_gate_per_head=False))
    ungated.load_state_dict({n: t for n, t in model.state_dict().items() if "_G" not in n})
    mixers = dataclasses.replace(cfg.mixers, kda_decay_bound=None)
    unbounded = HookedTransformer(dataclasses.replace(cfg, mixers=mixers))
    unbounded.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = reference(TOKENS).logits
        with model.hooks(fwd_hooks=silenced):
            without_delta = model(TOKENS)
        assert relative_worst(model(TOKENS), expected) <= ROUNDING
        assert relative_worst(without_delta, expected) > 0.1
        assert relative_worst(ungated(TOKENS), expected) > 0.01
        assert relative_worst(unbounded(TOKENS), expected) > 0.1


def test_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=6), TOKENS[:, :5]))


def test_the_decomposition_of_an_import_sums_to_the_stream():
    model = HookedTransformer.from_hf(twin(seed=7).double())
    assert_decomposition_sums(model, TOKENS, ("sublayer", "head"))


def test_the_files_are_read_as_the_live_model(tmp_path):
    reference = twin(seed=8)
    reference.save_pretrained(tmp_path)
    assert_files_read_as_the_live_model(reference, tmp_path)


def test_the_multi_token_prediction_layer_in_the_files_is_not_read(tmp_path):
    # Ling's checkpoints keep `num_mtp_layers` layers past the decoder's; transformers
    # skips them, and so does the import.
    reference = twin(seed=8)
    reference.save_pretrained(tmp_path)
    (path,) = tmp_path.glob("*.safetensors")
    files = load_file(path)
    last = reference.config.num_hidden_layers
    extra = {n.replace(f"layers.{last - 1}.", f"layers.{last}."): t.clone()
             for n, t in files.items() if f"layers.{last - 1}." in n}  # fmt: skip
    save_file(files | extra, path, metadata={"format": "pt"})
    saved = HookedTransformer.from_hf(tmp_path)
    live = HookedTransformer.from_hf(reference)
    torch.testing.assert_close(saved(TOKENS), live(TOKENS), rtol=0, atol=0)


def test_an_import_saves_and_loads(tmp_path):
    model = HookedTransformer.from_hf(twin(seed=9, max_position_embeddings=64))
    assert_saves_and_loads(model, tmp_path / "ours", TOKENS)


def test_clipped_expert_swiglus_are_refused_by_name():
    # A tiny twin's random weights never reach the clip: the config is read instead.
    limits = [0, 0, 7.0, 7.0, 7.0, 7.0]
    with pytest.raises(ValueError, match=r"swiglu_limits=\[0, 0, 7\.0"):
        HookedTransformer.from_hf(
            twin(seed=10, num_hidden_layers=6, expert_swiglu_limit_list=limits)
        )
