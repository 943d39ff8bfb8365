"""The importer by convention: architectures no family module describes, recognised by
watching their tiny twin run (`_anatomy`), imported from our components (`_convention`),
and verified against `transformers` before anything is trusted.

Each architecture below exercises a different recognised piece: a parallel block with one
bias-free LayerNorm, rotated pairs and a logit scale (Cohere); the multipliers of the
embedding, of each write, of the softmax and of the logits (Granite), folded into weights;
`1 + w` RMSNorm gains and a `sqrt(d_model)` embedding (Gemma); parameter-free LayerNorms
(OLMo); LayerNorms with biases and a plain MLP with biases (StarCoder 2); blocks without
rotary positions (SmolLM 3); squared ReLU and `1 + w` LayerNorms (Nemotron); partial
rotary, a parallel block and an unembedding bias (Phi); a fused gate/up projection and
rotated pairs (GLM); learned positions and one key/value head in a fused projection
(GPT-BigCode); an MLP whose maps the layer holds itself, positions from row 2 of their
table and a scaled embedding (BioGPT); a decoder's own fields in an encoder-decoder config
and cross-attention a causal LM never calls (Whisper); attention sinks (Granite SWA);
mixtures of experts, stacked as `transformers` keeps them or transposed (FlexOlmo, Aria with
a shared expert, Granite-MoE with its multipliers, Granite-MoE-Shared with a shared MLP
beside the experts' block); output gates on the heads (Laguna's own softplus map per head,
MiniCPM 5 MoE's sigmoid rows beside the queries'); latent attention under DeepSeek's names
(Youtu; MiniCPM 3 with its muP scalars); ALiBi, and sublayers that add the stream to their
write themselves (BLOOM, MPT); an MLP output the layer changes in place after its call
(Falcon); CodeGen's fused q/k/v in 4 shards of [q; v; k] and its fixed rotary base;
LayerNorms of queries and keys with biases (Persimmon); xIELU and its learned scalars per
layer (Apertus); the Transformer paper's fixed sinusoidal positions, a `sqrt(d_model)`
embedding and an MLP kept as an `nn.Sequential` (CTRL); a bias of the last layer's attention
output kept by its attention, and an MLP width as a multiple of d_model (GPT-NeoX Japanese);
the token embedding normed before the positions are added (BlenderbotSmall); rotated halves
turned the other way, queries and keys normed after the rotation, squared ReLU and no norm
gains (NanoChat). The reference
is the HF model itself, in float64.
"""

import json
import re
from pathlib import Path

import pytest
import torch
from helpers.twins import streams_worst
from torch import nn

from hookedattn import CheckpointError, HookedTransformer
from hookedattn.testing import float64_throughout

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("hookedattn.core.hf")
from hookedattn.core.hf import (  # noqa: E402
    _anatomy,
    _candidates,
    _convention,
    _probes,
    _tiny,
    _verify,
)

ROOT = Path(__file__).resolve().parents[2]
TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12]])
ARCHITECTURES = ("cohere", "granite", "gemma", "olmo", "starcoder2", "smollm3", "nemotron",
                 "phi", "glm", "gpt_bigcode", "biogpt", "whisper", "granite_swa", "flex_olmo",
                 "aria_text", "granitemoe", "laguna", "minicpm5_moe", "gpt_neo", "afmoe",
                 "hunyuan_v1_moe", "youtu", "minicpm3", "granitemoeshared", "bloom",
                 "mpt", "falcon", "codegen", "persimmon", "apertus", "apertus1p5_text", "ctrl",
                 "gpt_neox_japanese", "blenderbot-small", "marian", "hy_v3",
                 "nanochat", "phimoe", "modernbert-decoder")  # fmt: skip


@pytest.fixture
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: the test verifies afresh (the others share the session's)."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def twin_of(model_type: str, config, seed: int = 2) -> nn.Module:
    """A random model of `model_type`'s causal-LM class with `config`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    return _tiny.random_hf_model(model_class, config, seed=seed)


def twin(model_type: str, seed: int = 0) -> nn.Module:
    """A tiny random model of `model_type`, as the verification builds one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type))
    return _tiny.random_hf_model(model_class, config, seed=seed)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_imported_by_convention_computes_what_transformers_computes(model_type):
    reference = twin(model_type, seed=3).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS, output_hidden_states=True)
        logits, cache = model.run_with_cache(TOKENS)
    scale = float(expected.logits.abs().max())
    assert float((logits - expected.logits).abs().max()) <= 1e-6 * scale
    for i in range(model.cfg.n_layers - 1):  # every residual stream between the layers
        got, want = cache[f"blocks.{i}.hook_resid_post"], expected.hidden_states[i + 1]
        assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


def test_a_live_model_by_convention_is_verified(memo):
    model = HookedTransformer.from_hf(twin("smollm3"))
    assert model.verification is not None and not model.verification.remembered


def test_the_verification_picks_the_rotation_the_architecture_uses(memo, tmp_path):
    reference = twin("cohere")
    reference.save_pretrained(tmp_path / "cohere")
    halves, pairs, *_ = _candidates.candidates(reference.config)
    assert "rotary_layout='halves'" in halves.variant and "rotary_layout='pairs'" in pairs.variant
    with pytest.raises(hf.VerificationError, match="blocks.0.hook_resid_post"):
        hf.register_family(halves)  # forced: the first guess, which is wrong for Cohere
        try:
            HookedTransformer.from_hf(tmp_path / "cohere")
        finally:
            hf.unregister_family(halves)
    model = HookedTransformer.from_hf(tmp_path / "cohere")
    with torch.no_grad():
        assert torch.allclose(model(TOKENS), reference(TOKENS).logits, atol=1e-5)


def test_the_verification_picks_the_fused_query_key_value_layout(memo, tmp_path):
    # GPT-NeoX keeps [q_h; k_h; v_h] head by head in one map:
    # by convention the stacked [q; k; v] guess comes first and is refused, the head-by-head
    # one computes what transformers computes.
    reference = twin("gpt_neox")
    reference.save_pretrained(tmp_path / "neox")
    layouts = {}  # the first candidate of each layout (rotated halves)
    for candidate in _candidates.candidates(reference.config):
        layouts.setdefault(candidate.variant.split("qkv_layout='")[1].split("'")[0], candidate)
    for layout, works in (("stacked", False), ("per_head", True)):
        hf.register_family(layouts[layout])
        try:
            if works:
                model = HookedTransformer.from_hf(tmp_path / "neox")
                with torch.no_grad():
                    expected = reference(TOKENS).logits
                    assert torch.allclose(model(TOKENS), expected, atol=1e-5)
            else:
                with pytest.raises(hf.VerificationError):
                    HookedTransformer.from_hf(tmp_path / "neox")
        finally:
            hf.unregister_family(layouts[layout])


def test_halves_turned_the_other_way_are_imported_as_their_reflection():
    # NanoChat rotates by minus the angle: its queries and keys are imported with the
    # second rotated half of each head negated, the one rotation conjugating the other.
    reference = twin("nanochat", seed=3).double()
    model = HookedTransformer.from_hf(reference)
    seen = []
    q_proj = reference.model.layers[0].self_attn.q_proj
    handle = q_proj.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        with torch.no_grad():
            reference(TOKENS)
            _, cache = model.run_with_cache(TOKENS)
    finally:
        handle.remove()
    d_head, rotated = model.cfg.d_head, model.cfg.rotary_dim
    reflected = seen[0].view(1, TOKENS.shape[1], -1, d_head).clone()
    reflected[..., rotated // 2 : rotated] *= -1
    # To HF's float32 rounding of its float64 RMSNorm; a sign wrong would differ by O(1).
    delta = (cache["blocks.0.attn.hook_q"] - reflected).abs().max()
    assert float(delta) <= 1e-6 * float(reflected.abs().max())


def test_an_attention_keeping_no_softmax_scale_is_verified_among_the_usual_ones():
    # GPT-Neo wraps its attention and keeps no `scaling`: it does not scale its scores,
    # and slides a window in every other layer (`attention_layers`).
    model = HookedTransformer.from_hf(twin("gpt_neo"))
    assert model.cfg.attn_scale == 1.0
    assert model.cfg.attn_types is not None and "local" in model.cfg.attn_types


def test_a_folder_by_convention_is_verified_once(memo, tmp_path):
    twin("granite").save_pretrained(tmp_path / "granite")
    first = HookedTransformer.from_hf(tmp_path / "granite")
    second = HookedTransformer.from_hf(tmp_path / "granite")
    assert not first.verification.remembered and second.verification.remembered
    assert first.verification.key == second.verification.key


def test_blocks_without_rotary_positions_have_no_rotation():
    model = HookedTransformer.from_hf(twin("smollm3"))
    flags = model.cfg.rotary_layers
    assert flags is not None and False in flags
    for layer, rotates in enumerate(flags):
        assert hasattr(model.blocks[layer].attn, "rotary") == rotates
        assert (f"blocks.{layer}.attn.hook_rot_q" in model.hook_dict) == rotates


def test_a_piece_not_recognised_is_named():
    # Ergo gates each sublayer's write into the stream by a module of its own.
    with pytest.raises(ValueError, match=r"model_type='ergo'.*attention_residual_gate"):
        HookedTransformer.from_hf(twin("ergo"))


def test_a_recognised_but_wrong_hypothesis_is_refused_by_the_verification(memo, tmp_path):
    # HunYuan normalises queries and keys after rotating them: nothing in its modules says
    # so. Forced to the first candidate (norms before the rotation), every piece is
    # recognised and the verification refuses it at the first block; left to choose, it
    # keeps the candidate that computes what transformers computes.
    reference = twin("hunyuan_v1_dense")
    reference.save_pretrained(tmp_path / "hunyuan")
    before, after = _candidates.candidates(reference.config)[:2]
    assert "qk_norm_after_rotary=False" in before.variant
    assert "qk_norm_after_rotary=True" in after.variant
    hf.register_family(before)
    try:
        with pytest.raises(hf.VerificationError, match=r"blocks\.0\.hook_resid_post parts"):
            HookedTransformer.from_hf(tmp_path / "hunyuan")
    finally:
        hf.unregister_family(before)
    assert HookedTransformer.from_hf(tmp_path / "hunyuan").cfg.qk_norm_after_rotary


def test_a_composite_config_names_its_parts():
    config = transformers.AutoConfig.for_model("gemma3")
    with pytest.raises(ValueError, match="composite config.*text_config"):
        _anatomy.recognise(config)


def test_verify_false_loads_unverified():
    model = HookedTransformer.from_hf(twin("granite"), verify=False)
    assert model.verification is None


def test_verify_false_still_lets_the_twin_choose_among_candidates(memo, tmp_path):
    # GPT-NeoX's fused [q_h; k_h; v_h] is its second candidate: unverified, the first (the
    # stacked [q; k; v]) would read every head's queries from the wrong rows.
    reference = twin("gpt_neox", seed=1)
    reference.save_pretrained(tmp_path / "neox")
    model = HookedTransformer.from_hf(tmp_path / "neox", verify=False)
    assert model.verification is None
    with torch.no_grad():
        assert torch.allclose(model(TOKENS), reference(TOKENS).logits, atol=1e-5)


@pytest.mark.parametrize(
    ("model_type", "width"),
    [("ernie4_5_moe", "moe_intermediate_size"), ("aria_text", "intermediate_size")],
)
def test_shared_experts_are_as_wide_as_one_expert_times_their_count(model_type, width):
    # ERNIE 4.5 MoE's shared experts are one gated MLP `moe_intermediate_size *
    # moe_num_shared_experts` wide (DeepSeek's reading), Aria's `intermediate_size *
    # moe_num_shared_experts`: the twin (shrunk to one shared expert) cannot tell either
    # from that width alone.
    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type))
    config.moe_num_shared_experts = 2
    reference = twin_of(model_type, config).double()
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.d_mlp_shared == 2 * getattr(config, width)
    assert streams_worst(model, reference, TOKENS) <= 1e-6


COUNTS = re.compile(r"expert|group|topk|top_k|shared|per_tok")


@pytest.mark.slow
def test_a_checkpoint_with_one_more_of_a_count_its_twin_shrinks_is_never_imported_wrongly():
    # Every count a twin shrinks (experts, experts per token, shared experts, groups), one
    # larger on the checkpoint than on its twin, for every architecture that imports
    # exactly: imported exactly, or refused; never imported with other numbers.
    records = json.loads((ROOT / "scripts" / "data" / "coverage.json").read_text())
    model_types = sorted({r["model_type"] for r in records["architectures"]
                          if r.get("status") == "exact"})  # fmt: skip
    checked, wrong = 0, []
    for model_type in model_types:
        full = transformers.AutoConfig.for_model(model_type)
        shrunk = _tiny.tiny_config(full)
        tiny, defaults = shrunk.to_dict(), full.to_dict()
        for field, value in tiny.items():
            theirs = defaults.get(field)
            if not (COUNTS.search(field) and type(value) is int and type(theirs) is int
                    and 1 <= value != theirs):  # fmt: skip
                continue
            try:
                config = type(shrunk).from_dict(tiny | {field: value + 1})
                reference = twin_of(model_type, config).double()
            except Exception:  # a count this architecture cannot take (more groups than chosen)
                continue
            try:
                model = HookedTransformer.from_hf(reference)
            except (ValueError, CheckpointError):
                continue
            checked += 1
            with torch.no_grad(), float64_throughout():
                expected = reference(TOKENS).logits
            if float((model(TOKENS) - expected).abs().max()) > 1e-8 * float(expected.abs().max()):
                wrong.append(f"{model_type} {field}={value + 1}")
    assert checked >= 100 and not wrong, wrong


def test_a_setting_no_twin_runs_with_changed_explains_no_scalar():
    # A dots.llm1 checkpoint with two shared experts (its twin has one) reads its softmax
    # scale 1/4 also as `topk_group / heads`; no twin runs with `topk_group` changed (it may
    # not exceed `n_group`, 1), so that reading is dropped, not the import refused.
    config = _tiny.tiny_config(transformers.AutoConfig.for_model("dots1"))
    config.n_shared_experts = 2
    reference = _tiny.random_hf_model(transformers.Dots1ForCausalLM, config, seed=2).double()
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.attn_scale == 4.0
    assert streams_worst(model, reference, TOKENS) <= 1e-6


def test_opt_with_its_norms_after_the_sublayers_imports_exactly():
    # OPT's layers norm after each sublayer where `do_layer_norm_before` is False (refused
    # while OPT was written out); its MLP reads the stream flattened to [batch * pos, d].
    config = _tiny.tiny_config(transformers.AutoConfig.for_model("opt"))
    config.do_layer_norm_before = False
    reference = _tiny.random_hf_model(transformers.OPTForCausalLM, config, seed=2).double()
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.normalization_placement == "post_residual"  # norms of the stream
    assert streams_worst(model, reference, TOKENS) <= 1e-6


def test_an_embedding_projected_before_the_positions_is_named():
    config = _tiny.tiny_config(transformers.AutoConfig.for_model("opt"))
    config.word_embed_proj_dim = config.hidden_size // 2
    reference = _tiny.random_hf_model(transformers.OPTForCausalLM, config, seed=2)
    with pytest.raises(ValueError, match="before the positions are added .*project_in"):
        HookedTransformer.from_hf(reference)


def test_modules_a_forward_on_tokens_never_calls_are_left_out(caplog):
    # Phi-4-multimodal's causal LM holds its image and audio encoders inside the embedding
    # it calls; text never reaches them, so their tensors are left out (and said so).
    reference = twin("phi4_multimodal", seed=1).double()
    anatomy = _anatomy.recognise(reference.config, "Phi4MultimodalForCausalLM")
    encoders = ("model.embed_tokens_extend.image_embed", "model.embed_tokens_extend.audio_embed")
    assert anatomy.uncalled == encoders
    _convention._left_out.cache_clear()  # said once per architecture and process
    model = HookedTransformer.from_hf(reference)
    assert streams_worst(model, reference, TOKENS) <= 1e-6
    assert not any("embed_tokens_extend" in name for name in model.state_dict())
    assert f"{', '.join(encoders)} (for other inputs) left out" in caplog.text


def test_a_base_model_of_a_convention_architecture_says_what_to_pass():
    base = transformers.Qwen3Model(twin("qwen3").config)
    with pytest.raises(ValueError, match="for qwen3, pass the Qwen3ForCausalLM"):
        HookedTransformer.from_hf(base)


@pytest.mark.parametrize(
    ("norm", "kind", "bias"),
    [
        (nn.LayerNorm(8, eps=1e-5), "layer", True),
        (nn.LayerNorm(8, eps=1e-5, bias=False), "layer", False),
        (nn.LayerNorm(8, eps=1e-5, elementwise_affine=False), "layer_bare", False),
        (nn.RMSNorm(8, eps=1e-6), "rms", False),
    ],
)
def test_a_norm_is_recognised_by_what_it_computes(norm, kind, bias):
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    assert _probes.one_norm(norm, (1e-5, 1e-6))[:2] == (kind, bias)


def test_a_wrong_epsilon_is_told_apart():
    norm = nn.LayerNorm(8, eps=1e-3, elementwise_affine=False)
    del norm.eps  # keeps none we can read: the ones tried must match
    norm.forward = lambda x: nn.functional.layer_norm(x, (8,), eps=1e-3)
    with pytest.raises(ValueError, match="computes no norm we know"):
        _probes.one_norm(norm, (1e-5, 1e-6))


def test_a_scalar_is_explained_by_the_config_field_it_comes_from():
    config = transformers.GraniteConfig(embedding_multiplier=12.0, logits_scaling=8.0)
    Scale = _probes.Scale
    assert _probes.explain(12.0, config, "x") == Scale("value", "embedding_multiplier")
    assert _probes.explain(1 / 8.0, config, "x") == Scale("inverse", "logits_scaling")
    assert _probes.explain(16**-0.5, config, "x", d_head=16) == Scale("rsqrt", "d_head")
    with pytest.raises(ValueError, match="no config field"):
        _probes.explain(0.123456, config, "x")


def test_a_scalar_of_two_config_fields_is_explained():
    # MiniCPM's muP: each write times scale_depth / sqrt(num_hidden_layers), and the final
    # norm's output divided by hidden_size / dim_model_base before the unembedding.
    anatomy = _anatomy.recognise(transformers.AutoConfig.for_model("minicpm3"))
    assert anatomy.attn_write == _probes.Scale("over_sqrt", "scale_depth/num_hidden_layers")
    assert anatomy.logit_scale == _probes.Scale("ratio", "dim_model_base/hidden_size")
    assert anatomy.latent


def test_a_scalar_read_on_a_tiny_checkpoint_is_not_remembered_for_a_real_one(memo):
    # On a checkpoint as tiny as its twin, MiniCPM 3's dim_model_base / hidden_size (4) is
    # also its head count: either reading is right there, neither told apart, and neither
    # remembered for the structure, where the real checkpoint's would be wrong (40, not 10).
    tiny = twin("minicpm3")
    HookedTransformer.from_hf(tiny)
    anatomy = _anatomy.recognise(transformers.AutoConfig.for_model("minicpm3"))
    assert anatomy.logit_scale == _probes.Scale("ratio", "dim_model_base/hidden_size")


@pytest.mark.parametrize(
    ("model_type", "settings"),
    [
        ("granite", dict(embedding_multiplier=12.0, residual_multiplier=0.22,
                         attention_multiplier=0.0078125, logits_scaling=8.0)),
        ("minicpm3", dict(scale_emb=12, scale_depth=1.4, dim_model_base=32)),
    ],
)  # fmt: skip
def test_a_checkpoint_wider_than_its_twin_keeps_its_scalars(model_type, settings):
    # Granite 3's settings on a model wider than the twin: on the twin (MLP 128, width 64)
    # 0.0078125 is also 1 / the MLP width and 8 also sqrt(width); only a second twin with
    # the settings changed tells which field each scalar follows (`_scalars`).
    sizes = dict(hidden_size=96, intermediate_size=200, num_attention_heads=6,
                 num_key_value_heads=6, num_hidden_layers=2, vocab_size=150)  # fmt: skip
    if model_type == "minicpm3":
        sizes |= dict(q_lora_rank=24, kv_lora_rank=20, qk_nope_head_dim=12, qk_rope_head_dim=4,
                      v_head_dim=10, head_dim=16)  # fmt: skip
    config = transformers.AutoConfig.for_model(model_type, **sizes, **settings)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    reference = _tiny.random_hf_model(model_class, config, seed=6).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS).logits
        got = model(TOKENS)
    # (1e-6: the rotary's angles are float32 on both sides, the rest float64.)
    assert float((got - expected).abs().max()) <= 1e-6 * float(expected.abs().max())


def test_the_memo_key_tells_candidates_apart():
    config = twin("cohere").config
    halves, pairs, *_ = _candidates.candidates(config)
    tiny = _tiny.tiny_config(config)
    assert _verify.memo_key(halves, tiny) != _verify.memo_key(pairs, tiny)


def test_a_recognised_anatomy_is_remembered(memo, monkeypatch):
    config = twin("granite").config
    first = _anatomy.recognise(config)

    def no_twin(*args, **kwargs):
        raise AssertionError("a twin was built for an anatomy already recognised")

    monkeypatch.setattr(_tiny, "random_hf_model", no_twin)
    assert _anatomy.recognise(config) == first


def test_a_mixture_by_convention_loads_from_its_files(tmp_path):
    # `save_pretrained` writes one tensor per expert and projection, under names of the
    # checkpoint's own (`_experts`): the folder route reads them.
    reference = twin("mellum", seed=4)
    reference.save_pretrained(tmp_path / "mellum")
    model = HookedTransformer.from_hf(tmp_path / "mellum")
    assert model.cfg.num_experts == reference.config.num_local_experts
    with torch.no_grad():
        expected = reference(TOKENS).logits
        assert torch.allclose(model(TOKENS), expected, atol=1e-5 * float(expected.abs().max()))


@pytest.mark.parametrize(
    ("model_type", "gate", "per_head"),
    [("laguna", "softplus", True), ("minicpm5_moe", "sigmoid", False)],
)
def test_an_output_gate_is_imported_with_its_function_and_width(model_type, gate, per_head):
    # Laguna: its own map, one softplus factor per head; MiniCPM 5 MoE: `[q_h; gate_h]` rows
    # in one map, a sigmoid factor per dimension. The function is a candidate.
    cfg = HookedTransformer.from_hf(twin(model_type)).cfg
    assert (cfg.attn_gate, cfg.attn_gate_per_head) == (gate, per_head)


@pytest.mark.parametrize(
    ("model_type", "scoring"),
    [("flint", "sigmoid"), ("ernie4_5_moe", "softmax_biased"), ("qwen2_moe", "softmax")],
)
def test_the_verification_picks_the_router_the_architecture_uses(model_type, scoring):
    # Nothing in a router's modules tells softmax from sigmoid scoring, nor a choice bias
    # over probabilities (Ernie 4.5) from one over sigmoid scores (DeepSeek V3): candidates.
    assert HookedTransformer.from_hf(twin(model_type)).cfg.router_scoring == scoring


@pytest.mark.parametrize(
    "model_type",
    ["minimax_m2", "glm4_moe", "kolibri1", "flint", "ernie4_5_moe", "cohere2_moe",
     "granitemoeshared", "granitemoe_swa", "sarvam_moe", "param2moe"],
)  # fmt: skip
def test_a_mixture_with_sigmoid_routing_or_dense_first_layers_or_renamed_files(
    model_type, tmp_path
):
    # MiniMax-M2: a sigmoid router with a choice bias; GLM-4-MoE: dense first layers, groups
    # and shared experts; Kolibri: files that name the norms otherwise than the modules;
    # Flint: sigmoid scores without a bias, dense layers listed (`mlp_only_layers`); Ernie
    # 4.5: a choice bias over softmax probabilities, kept in a module of the router's own
    # and saved as `[1 expert]`; Cohere 2 MoE: the mixture in a parallel block; Granite
    # MoE shared: a fused shared expert beside the mixture, not in it; Granite MoE SWA:
    # stacked experts the files keep untransposed where the live model transposes them;
    # Sarvam MoE and Param-2 MoE: q, k and v maps saved as one `query_key_value`.
    reference = twin(model_type, seed=2)
    reference.save_pretrained(tmp_path / model_type)
    for source in (reference, tmp_path / model_type):
        model = HookedTransformer.from_hf(source)
        with torch.no_grad():
            expected = reference(TOKENS).logits
            got = model(TOKENS)
        assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max())


def test_falcons_new_decoder_layout_imports_with_a_key_value_head_per_head():
    # Falcon's new decoder layout keeps each key/value group's queries, key and value
    # together in query_key_value; with one query head per group that is [q_h; k_h; v_h].
    config = transformers.FalconConfig(new_decoder_architecture=True, num_kv_heads=71)
    reference = _tiny.random_hf_model(transformers.FalconForCausalLM, _tiny.tiny_config(config))
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS).logits
        got = model(TOKENS)
    assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max())


def test_falcons_new_decoder_layout_with_grouped_queries_is_refused():
    # Groups of several queries before their key and value: no candidate reads that layout.
    config = transformers.FalconConfig(new_decoder_architecture=True, num_kv_heads=2)
    reference = _tiny.random_hf_model(transformers.FalconForCausalLM, _tiny.tiny_config(config))
    with pytest.raises(hf.VerificationError, match="blocks.0.hook_resid_post parts"):
        HookedTransformer.from_hf(reference)


def test_verify_false_loads_what_no_candidate_agrees_on_unverified():
    # The same Falcon, unverified: nothing is refused, the first candidate is taken.
    config = transformers.FalconConfig(new_decoder_architecture=True, num_kv_heads=2)
    reference = _tiny.random_hf_model(transformers.FalconForCausalLM, _tiny.tiny_config(config))
    model = HookedTransformer.from_hf(reference, verify=False)
    assert model.verification is None and model.cfg.n_key_value_heads == 2
