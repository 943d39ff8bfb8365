"""Kimi Linear imported by convention: Kimi Delta Attention (`components.kimi_delta`) in
attention's place in the layers `layer_types` calls "linear_attention" (named `self_attn`, as
its attention is: told apart by its parts), multi-head latent attention rotating nothing in
the others (its decoupled key part kept, unrotated: `rotary_layers` all False), a dense
gated MLP in the first layer and DeepSeek V3's sigmoid-routed experts with a shared expert
after it. Each is compared with `transformers` on a tiny random twin (four delta layers, then
latent attention): the logits, every residual stream and the sublayers' writes, greedy
generation, the checkpoint's files (its convolution kept as `q_conv1d`, `k_conv1d`,
`v_conv1d`, its experts one by one) against the live model.

`transformers` runs its delta rule and its RMSNorms in float32 whatever the model's dtype, so
a float64 twin agrees with our float64 import to float32's rounding only (the numbers the
tests measured are in `docs/guide/families.md`); the bound is 1e-5 of each tensor's largest
value. The float64 exactness of the delta layer itself is checked against its recurrence in
`tests/core/test_kimi_delta.py`, and against `transformers`' own module given the same
weights in `test_kimi_delta_module.py`.
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

from hookedattn import HookedTransformer

pytest.importorskip("transformers")

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)
ROUNDING = 1e-5  # of each tensor's largest value (module docstring)


def twin(seed: int = 0, **fields) -> torch.nn.Module:
    """A tiny random Kimi Linear (four delta layers, then latent attention)."""
    return tiny_twin("kimi_linear", seed=seed, **fields)


def test_the_layers_are_read_as_transformers_builds_them():
    reference = twin(seed=1)
    model = HookedTransformer.from_hf(reference)
    cfg, c = model.cfg, reference.config
    assert cfg.mixers.layers == ("kimi_delta",) * 4 + ("attention",)
    heads = (cfg.mixers.n_ssm_heads, cfg.mixers.d_ssm_head)
    assert heads == (c.linear_num_heads, c.linear_head_dim)
    assert (cfg.kv_lora_rank, cfg.rotary_dim) == (c.kv_lora_rank, c.qk_rope_head_dim)
    assert not any(cfg.layer_rotates(i) for i in range(cfg.n_layers))
    assert "blocks.4.attn.hook_rot_q" not in model.hook_dict
    assert "blocks.4.attn.hook_k_rope" in model.hook_dict  # the shared key part, unrotated
    assert [cfg.layer_is_moe(i) for i in range(cfg.n_layers)] == [False] + [True] * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logits_and_every_residual_stream_are_transformers(dtype):
    reference = twin(seed=3).to(dtype)
    model = HookedTransformer.from_hf(reference)
    assert streams_worst(model, reference, TOKENS) <= ROUNDING


# Our hook point -> (the layer, its piece whose output it is).
WRITES = {
    "blocks.0.mixer.hook_out": (0, "self_attn"),
    "blocks.0.hook_mlp_out": (0, "mlp"),
    "blocks.3.hook_mlp_out": (3, "mlp"),
    "blocks.4.hook_attn_out": (4, "self_attn"),
}


@pytest.mark.parametrize("ours", WRITES)
def test_each_sublayers_write_is_transformers(ours):
    reference = twin(seed=5).double()
    assert write_worst(reference, ours, *WRITES[ours], TOKENS) <= ROUNDING


def test_the_delta_layers_and_the_unrotated_key_part_move_the_logits():
    # Each piece the import reads is exercised: without the delta layers' writes, or with
    # the latent attention rotated as DeepSeek's is, the logits leave transformers'.
    reference = twin(seed=3).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS).logits
        silenced = [(f"blocks.{i}.mixer.hook_out", lambda out, hook: out * 0) for i in range(4)]
        with model.hooks(fwd_hooks=silenced):
            without_delta = model(TOKENS)
        rotated = HookedTransformer(dataclasses.replace(model.cfg, rotary_layers=None))
        rotated.load_state_dict(model.state_dict())
        with_rotation = rotated(TOKENS)
    assert relative_worst(model(TOKENS), expected) <= ROUNDING
    assert relative_worst(without_delta, expected) > 0.1
    assert relative_worst(with_rotation, expected) > 1e-3


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
    model = HookedTransformer.from_hf(twin(seed=9, max_position_embeddings=64))
    assert_saves_and_loads(model, tmp_path / "ours", TOKENS)


def test_a_delta_convolution_of_another_activation_is_refused_by_name():
    # transformers convolves the delta layers' q, k, v with the config's `hidden_act`.
    with pytest.raises(ValueError, match="Kimi Delta Attention whose convolution's activation"):
        HookedTransformer.from_hf(twin(seed=10, hidden_act="gelu"))
