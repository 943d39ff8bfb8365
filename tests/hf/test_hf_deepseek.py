"""DeepSeek V3 (multi-head latent attention, its sigmoid group-limited router, dense first
layers) against `transformers`' `DeepseekV3ForCausalLM`, and the families built of the same
modules, GLM-4-MoE-Lite and DeepSeek V2: logits, the residual stream at every layer,
attention patterns, router logits, residual identities, greedy generation with our KV cache,
a saved directory verified on load, and the refusals.

Tiny random cases (3 layers, d_model 32, 4 heads, a dense first block) reach the variants:
"latent_q" has a query latent, YaRN rotary with `mscale_all_dim` (so the scale is not
`1/sqrt(d_head)`), interleaved rotary pairs, attention biases, 8 experts in 4 groups (2
chosen groups, 3 experts a token, renormalised, scaled by 2.5), two shared experts, a value
head narrower than the query/key head; "plain_q" projects queries straight from the stream,
rotates halves (`rope_interleave=False`), has no biases, one group and no renormalisation;
"glm4_moe_lite" has 2 groups, 1 chosen, and a value head wider than the query/key head;
DeepSeek V2's softmax router chooses within the best groups by their best expert
("v2_grouped", with V3's attention variants) or among all ("v2_greedy", no shared expert).
Every norm gain, bias and `e_score_correction_bias` is moved away from its neutral value.

A float64 HF model rounds its RMSNorms, its attention softmax, its router (and V2 its
rotary) to float32; as in tests/hf/test_hf_moe.py, the float64 checks run HF's own model
with those steps computed in float64 (`exact`: `InFloat64Throughout`) and agree with it
to 1e-10; stock float64 HF agrees to 1e-5.
"""

import pytest
import torch
from helpers.hf_pairs import (
    LOGIT_REFERENCES,
    TOKENS,
    assert_greedy_generation_equal,
    assert_loads_like_the_live_model,
    assert_logits_equal,
    assert_patterns_equal_hf_attentions,
    assert_resid_pre_equals_hidden_states,
    max_abs,
    pair_fixtures,
)

from hookedattn import HookedTransformer
from hookedattn.core.components.latent_attention import LatentAttention
from hookedattn.core.hf import _verify
from hookedattn.testing import assert_residual_identities, published_constants

transformers = pytest.importorskip("transformers")

VOCAB = 64
COMMON = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
    kv_lora_rank=12, qk_rope_head_dim=8, qk_nope_head_dim=10, max_position_embeddings=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=None, attn_implementation="eager",
    experts_implementation="eager",
)  # fmt: skip
V3 = ("DeepseekV3ForCausalLM", "DeepseekV3Config")
V2 = ("DeepseekV2ForCausalLM", "DeepseekV2Config")
GLM = ("Glm4MoeLiteForCausalLM", "Glm4MoeLiteConfig")
YARN = dict(rope_type="yarn", rope_theta=1e4, factor=4.0, mscale=0.7, mscale_all_dim=1.3,
            original_max_position_embeddings=16)  # fmt: skip
# HF class, config class, config overrides.
CASES = {
    "latent_q": (*V3, dict(
        q_lora_rank=20, v_head_dim=6, attention_bias=True, n_shared_experts=2,
        n_group=4, topk_group=2, num_experts_per_tok=3, norm_topk_prob=True,
        routed_scaling_factor=2.5, rope_interleave=True, first_k_dense_replace=1,
        rope_parameters=YARN)),
    "plain_q": (*V3, dict(
        q_lora_rank=None, v_head_dim=10, attention_bias=False, n_shared_experts=1,
        n_group=1, topk_group=1, num_experts_per_tok=2, norm_topk_prob=False,
        routed_scaling_factor=1.5, rope_interleave=False, first_k_dense_replace=1)),
    # GLM-4-MoE-Lite: DeepSeek V3's modules, the dense blocks named by `mlp_layer_types`.
    "glm4_moe_lite": (*GLM, dict(
        q_lora_rank=20, v_head_dim=14, n_shared_experts=1, n_group=2, topk_group=1,
        num_experts_per_tok=2, routed_scaling_factor=1.8, head_dim=8,
        mlp_layer_types=["dense", "sparse", "sparse"])),
    # DeepSeek V2: a softmax router, within the best groups by their best expert, or not.
    "v2_grouped": (*V2, dict(
        q_lora_rank=20, v_head_dim=6, attention_bias=True, n_shared_experts=2, n_group=4,
        topk_group=2, num_experts_per_tok=3, routed_scaling_factor=2.5,
        topk_method="group_limited_greedy", first_k_dense_replace=1, rope_parameters=YARN)),
    "v2_greedy": (*V2, dict(
        q_lora_rank=None, v_head_dim=10, n_shared_experts=0, num_experts_per_tok=2,
        routed_scaling_factor=1.0, topk_method="greedy", first_k_dense_replace=1)),
}  # fmt: skip


def make_hf(case: str, dtype: torch.dtype = torch.float32):
    architecture, config_class, overrides = CASES[case]
    config = getattr(transformers, config_class)(**{**COMMON, **overrides})
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.3 * torch.randn_like(param))
            elif param.ndim >= 2:  # large enough weights that routing and patterns vary
                param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
        for module in hf.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.copy_(0.2 * torch.randn(config.n_routed_experts))
    return hf.to(dtype)


case, pair32, pair64 = pair_fixtures(CASES, make_hf)


# ---------------------------------------------------------------- agreement
def test_the_config_is_latent_attention_with_dense_first_layers(case, pair32):
    cfg, c = pair32.ours.cfg, pair32.hf.config
    assert cfg.kv_lora_rank == c.kv_lora_rank and cfg.q_lora_rank == c.q_lora_rank
    assert cfg.original_architecture == CASES[case][0]
    assert (cfg.d_head, cfg.d_value, cfg.rotary_dim) == (18, c.v_head_dim, 8)
    scoring = "softmax" if CASES[case][0] == V2[0] else "sigmoid"
    assert (cfg.num_experts, cfg.n_dense_layers, cfg.router_scoring) == (8, 1, scoring)
    assert all(isinstance(block.attn, LatentAttention) for block in pair32.ours.blocks)


@pytest.mark.parametrize("reference", LOGIT_REFERENCES)
def test_logits_equal(reference, pair32, pair64):
    assert_logits_equal(reference, pair32, pair64)


def test_residual_stream_equals_hf_hidden_states(pair64):
    assert_resid_pre_equals_hidden_states(pair64)


def test_attention_patterns_equal_hf_eager_attentions(pair64):
    assert_patterns_equal_hf_attentions(pair64)


def test_router_logits_equal_hfs(pair64):
    with torch.no_grad():
        expected = pair64.exact(TOKENS, output_router_logits=True).router_logits
    _, cache = pair64.ours.run_with_cache(TOKENS, names_filter=lambda n: "router" in n)
    moe_layers = range(pair64.ours.cfg.n_dense_layers, pair64.ours.cfg.n_layers)
    assert len(expected) == len(moe_layers)
    for layer, logits in zip(moe_layers, expected, strict=True):
        ours = cache[f"blocks.{layer}.mlp.hook_router_logits"].flatten(0, 1)
        assert max_abs(ours, logits) <= 1e-10, layer


def test_the_group_limit_and_the_choice_bias_change_the_choice(pair64):
    # Without them (every group, no bias) some token would choose other experts: the case
    # tests something.
    if pair64.ours.cfg.n_expert_groups == 1 or pair64.ours.cfg.router_scoring == "softmax":
        pytest.skip("one group, or no choice bias")
    _, cache = pair64.ours.run_with_cache(TOKENS, names_filter=lambda n: "expert_indices" in n)
    mlp = pair64.ours.blocks[1].mlp
    with torch.no_grad():
        logits = mlp.router_logits(pair64.ours.blocks[1].ln2(_resid_mid(pair64, 1)))
    unlimited = logits.sigmoid().topk(mlp.experts_per_token, dim=-1).indices.sort(-1).values
    chosen = cache["blocks.1.mlp.hook_expert_indices"].sort(-1).values
    assert not torch.equal(unlimited, chosen)


def _resid_mid(pair, layer):
    _, cache = pair.ours.run_with_cache(TOKENS, names_filter=f"blocks.{layer}.hook_resid_mid")
    return cache[f"blocks.{layer}.hook_resid_mid"]


def test_the_imported_model_keeps_every_residual_identity(pair64):
    # The constants from HF's own modules: its attention's scale (YaRN's mscale folded in)
    # and its norms' epsilon.
    hf_attn = pair64.hf.model.layers[0].self_attn
    constants = published_constants(
        pair64.ours.cfg.d_head, eps=pair64.hf.config.rms_norm_eps, attn_scale=1 / hf_attn.scaling
    )
    _, cache = pair64.ours.run_with_cache(TOKENS)
    assert not assert_residual_identities(pair64.ours, cache, constants=constants).skipped


def test_greedy_generation_equals_hf_generate(pair32):
    assert_greedy_generation_equal(pair32)


def test_a_saved_directory_is_verified_and_loads_like_the_live_model(pair32, tmp_path, monkeypatch):
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))  # no remembered pass
    pair32.hf.save_pretrained(tmp_path / "model")
    loaded = HookedTransformer.from_hf(tmp_path / "model")
    assert loaded.verification is not None and not loaded.verification.remembered
    assert loaded.verification.worst <= _verify.TOLERANCE
    assert_loads_like_the_live_model(loaded, pair32)


# ---------------------------------------------------------------- refusals
def test_grouped_keys_and_values_are_refused_by_name():
    config = transformers.DeepseekV3Config(**{**COMMON, **CASES["plain_q"][2]})
    config.num_key_value_heads = 2
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        HookedTransformer.from_hf(transformers.DeepseekV3ForCausalLM(config))


def test_a_block_kind_other_than_dense_or_sparse_is_refused_by_name():
    # A dense block anywhere imports (tests/hf/test_moe_layers.py); another kind does not.
    config = transformers.Glm4MoeLiteConfig(**{**COMMON, **CASES["glm4_moe_lite"][2]})
    model = transformers.Glm4MoeLiteForCausalLM(config)
    model.config.mlp_layer_types = ["dense", "sparse", "hash_moe"]
    with pytest.raises(ValueError, match=r"mlp_layer_types=.* holds \['hash_moe'\]"):
        HookedTransformer.from_hf(model)


def test_a_checkpoints_layers_past_the_model_are_not_read(tmp_path):
    # DeepSeek V3's files hold its multi-token prediction layer after the last block.
    from safetensors.torch import load_file, save_file

    hf = make_hf("plain_q")
    hf.save_pretrained(tmp_path)
    (file,) = tmp_path.glob("*.safetensors")
    tensors = load_file(file)
    tensors["model.layers.3.extra.weight"] = torch.zeros(2, 2)
    save_file(tensors, file, metadata={"format": "pt"})
    loaded = HookedTransformer.from_hf(tmp_path, verify=False)
    assert loaded.cfg.n_layers == 3
