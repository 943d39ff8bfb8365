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
beside the experts' block). The reference is the HF model itself,
in float64.
"""

import pytest
import torch
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("hookedattn.core.hf")
from hookedattn.core.hf import _anatomy, _convention, _probes, _tiny, _verify  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12]])
ARCHITECTURES = ("cohere", "granite", "gemma", "olmo", "starcoder2", "smollm3", "nemotron",
                 "phi", "glm", "gpt_bigcode", "biogpt", "whisper", "granite_swa", "flex_olmo",
                 "aria_text", "granitemoe", "granitemoeshared")  # fmt: skip


@pytest.fixture(autouse=True)
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: each test verifies afresh."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


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


def test_a_live_model_by_convention_is_verified():
    model = HookedTransformer.from_hf(twin("smollm3"))
    assert model.verification is not None and not model.verification.remembered


def test_the_verification_picks_the_rotation_the_architecture_uses(tmp_path):
    reference = twin("cohere")
    reference.save_pretrained(tmp_path / "cohere")
    halves, pairs, *_ = _convention.candidates(reference.config)
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


def test_a_folder_by_convention_is_verified_once(tmp_path):
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
    with pytest.raises(ValueError, match=r"model_type='diffllama'.*lambda_q1"):
        HookedTransformer.from_hf(twin("diffllama"))


def test_a_recognised_but_wrong_hypothesis_is_refused_by_the_verification():
    # HunYuan normalises queries and keys after rotating them; ours before: every piece is
    # recognised, and the verification refuses it at the first block.
    with pytest.raises(hf.VerificationError, match=r"blocks\.0\.hook_resid_post parts"):
        HookedTransformer.from_hf(twin("hunyuan_v1_dense"))


def test_a_composite_config_names_its_parts():
    config = transformers.AutoConfig.for_model("gemma3")
    with pytest.raises(ValueError, match="composite config.*text_config"):
        _anatomy.recognise(config)


def test_verify_false_takes_the_first_candidate_unverified():
    model = HookedTransformer.from_hf(twin("granite"), verify=False)
    assert model.verification is None


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


def test_the_memo_key_tells_candidates_apart():
    config = twin("cohere").config
    halves, pairs, *_ = _convention.candidates(config)
    tiny = _tiny.tiny_config(config)
    assert _verify.memo_key(halves, tiny) != _verify.memo_key(pairs, tiny)


def test_a_recognised_anatomy_is_remembered(monkeypatch):
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


def test_a_router_keeping_other_pieces_is_refused_by_name():
    with pytest.raises(ValueError, match="moe_statics|not imported by convention|unexpected"):
        HookedTransformer.from_hf(twin("ernie4_5_moe"))


@pytest.mark.parametrize("model_type", ["minimax_m2", "glm4_moe", "kolibri1"])
def test_a_mixture_with_sigmoid_routing_or_dense_first_layers_or_renamed_files(
    model_type, tmp_path
):
    # MiniMax-M2: a sigmoid router with a choice bias; GLM-4-MoE: dense first layers, groups
    # and shared experts; Kolibri: files that name the norms otherwise than the modules.
    reference = twin(model_type, seed=2)
    reference.save_pretrained(tmp_path / model_type)
    for source in (reference, tmp_path / model_type):
        model = HookedTransformer.from_hf(source)
        with torch.no_grad():
            expected = reference(TOKENS).logits
            got = model(TOKENS)
        assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max())
