"""Hybrid architectures imported by convention: layers whose sublayer in attention's place
is a gated short convolution (LFM2, LFM2-MoE, LFM3), a Mamba-1 mixer (Jamba; in every
layer: Mamba, Falcon Mamba), a Mamba-2 mixer (Bamba, Granite 4 hybrids) or a gated delta net
(Qwen3-Next, Qwen3.5, Lara Mini), beside attention layers, or in every layer (Mamba 2); and
Falcon-H1 (its family module, `_falcon_h1`), a Mamba-2 mixer beside the attention in every
layer, its muP multipliers folded into the weights (its twin's multipliers are not 1:
`_tiny.OVERRIDES`); and Nemotron-H (`_nemotron_h`), one sublayer per layer: a Mamba-2 mixer,
an attention without positions or an MLP, our blocks of one sublayer, and its default, which
adds a mixture of plain experts (relu2, no gate) with a sigmoid group router and a shared
expert. Each is compared with `transformers` on a tiny random twin: the logits and every
residual stream in float32 and float64, and greedy generation; and each mixer module with
ours in float64 on random inputs.

`transformers` runs its RMSNorms, its Mamba-1 and Mamba-2 scans and its delta rule in float32
whatever the model's dtype (`hidden_states.to(torch.float32)`, `.float()`), so a float64 twin
agrees with our float64 import to float32's rounding only; the float64 identities of the
mixers themselves are checked against brute-force loops in `tests/core/test_mixers.py`,
`tests/core/test_mamba1.py` and `tests/core/test_gated_delta.py`.
"""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import relative_worst
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core._variants import variant_base  # noqa: E402
from hookedattn.core.hf import _tiny  # noqa: E402
from hookedattn.core.kernels import attention_context  # noqa: E402

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)
# model type -> fields set on its default config (LFM2's default attends in every layer).
HYBRIDS = {
    "bamba": {},
    "mamba": {},  # Mamba-1 alone, as Mamba 2
    "falcon_mamba": {},  # Mamba-1 with RMSNorms without gains on its B, C and step
    # Mamba-1 with learned gains on those norms, beside attention; experts every other layer,
    # dense MLPs between (`moe_layers`).
    "jamba": {},
    "lfm2": {"layer_types": ["conv", "full_attention"] * 2, "num_hidden_layers": 4},
    "lfm2_moe": {},
    "granitemoehybrid": {},  # Mamba-2 and attention, experts with a shared MLP beside them
    "mamba2": {},  # Mamba-2 alone: every layer `x + mixer(norm(x))`, no attention, no MLP
    "lfm3": {},  # short convolutions; windowed and proportional-RoPE attention, output gates
    "falcon_h1": {},  # attention and Mamba-2 side by side in every layer
    "falcon_h1_normed": {"mamba_rms_norm": True, "mamba_norm_before_gate": False},
    # Nemotron-H's 8B and 56B layout, "M*-" repeated
    "nemotron_h": {"layers_block_type": ["linear_attention", "full_attention", "mlp"]},
    # Gated delta nets: Qwen3-Next's q, k, v, z interleaved per key head (2 key heads, each
    # serving 2 value heads: pieces of 16, 16, 32, 32 rows), its attention gated and partly
    # rotated; Qwen3.5's projections apart; Lara Mini's saved fused (`in_proj`), its layers
    # sliding, linear and full.
    "qwen3_next": {},
    "qwen3_5_text": {},
    "lara_mini": {},
    "nemotron_h_moe": {},  # its default, "ME*-": plain experts beside Mamba-2, attention, MLP
}  # fmt: skip
# The entries that are a variant of another model type.
VARIANT_OF = {"falcon_h1_normed": "falcon_h1", "nemotron_h_moe": "nemotron_h"}
ATTENTION_FREE = {"mamba2": "mamba2", "mamba": "mamba", "falcon_mamba": "mamba"}
# Whose `hidden_states` leave the embedding out: entry `i` is layer `i`'s output.
EMBEDDING_LEFT_OUT = {"mamba", "falcon_mamba"}
# Gated delta twins amplify rounding more: on seed 3 our float32 logits are 2.2e-5
# (Qwen3-Next), 2.3e-5 (Qwen3.5), 2.2e-6 (Lara Mini) of their scale from HF's, the float64
# ones 1.3e-5, 1.8e-5, 5.1e-7 (HF's delta rule runs in float32 whatever the dtype);
# Qwen3-Next's seed-0 twin reaches 1.0e-4 in float32.
ROUNDING = {"qwen3_next": 1e-4, "qwen3_5_text": 1e-4, "lara_mini": 1e-4}


@pytest.fixture
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: the test verifies afresh (the others share the session's)."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def twin(model_type: str, seed: int = 0) -> nn.Module:
    """A tiny random hybrid of `model_type`, as the verification builds one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    fields = HYBRIDS[model_type]
    model_type = VARIANT_OF.get(model_type, model_type)
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    config = transformers.AutoConfig.for_model(model_type, **fields)
    return _tiny.random_hf_model(model_class, _tiny.tiny_config(config), seed=seed)


@pytest.mark.parametrize("model_type", HYBRIDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hybrid_imported_by_convention_computes_what_transformers_computes(model_type, dtype):
    # Of each tensor's largest value: float32's rounding (module docstring).
    tolerance = ROUNDING.get(model_type, 1e-5)
    reference = twin(model_type, seed=3).to(dtype)
    model = HookedTransformer.from_hf(reference)
    kinds = set(model.cfg.mixers.layers) | {model.cfg.mixers.beside_attention} - {None}
    assert kinds - {"attention", "none"}  # a mixer somewhere
    assert ("attention" in kinds) == (model_type not in ATTENTION_FREE)
    if model_type in ATTENTION_FREE:
        assert kinds == {ATTENTION_FREE[model_type]}
    with torch.no_grad():
        expected = reference(TOKENS, output_hidden_states=True)
        logits, cache = model.run_with_cache(TOKENS)
    assert relative_worst(logits, expected.logits) <= tolerance
    first = 0 if model_type in EMBEDDING_LEFT_OUT else 1
    for i in range(model.cfg.n_layers - 1):  # every residual stream between the layers
        got, want = cache[f"blocks.{i}.hook_resid_post"], expected.hidden_states[i + first]
        assert relative_worst(got, want) <= tolerance


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_hybrid_greedy_generation_is_transformers(model_type):
    assert torch.equal(*greedy_ours_and_transformers(twin(model_type, seed=4), TOKENS[:, :5]))


@pytest.mark.parametrize(
    "model_type, module",
    [("lfm2_moe", "conv"), ("bamba", "mamba"), ("qwen3_next", "linear_attn"),
     ("qwen3_5_text", "linear_attn")],
)  # fmt: skip
def test_each_mixer_is_the_transformers_module_in_float64(model_type, module):
    reference = twin(model_type, seed=5).double()
    model = HookedTransformer.from_hf(reference)
    layer = model.cfg.mixers.layers.index(model.cfg.mixers.layers[0])  # the first mixer
    theirs = getattr(reference.model.layers[layer], module)
    x = torch.randn(2, 9, model.cfg.d_model, generator=torch.Generator().manual_seed(6),
                    dtype=torch.float64)  # fmt: skip
    with torch.no_grad():
        want = theirs(x)
        got = model.blocks[layer].mixer(x, attention_context(64, 2, 9, None, None, None, "cpu"))
    # float64 throughout for the short convolution; the Mamba-2 scan and the delta rule
    # cast to float32.
    assert relative_worst(got, want) <= (1e-12 if module == "conv" else 1e-6)


def test_a_layer_kind_the_twin_did_not_show_is_refused():
    from hookedattn.core.hf import _anatomy

    reference = twin("lfm2_moe")
    mixers = _anatomy.recognise(reference.config).mixers
    config = transformers.AutoConfig.for_model(
        "lfm2_moe", layer_types=["conv", "sliding_attention"], num_hidden_layers=2
    )
    with pytest.raises(ValueError, match=r"layer_types holds \['sliding_attention'\]"):
        mixers.config(config)


def _recurrent_gemma_whose_block(monkeypatch, change) -> torch.nn.Module:
    """A tiny RecurrentGemma whose recurrent blocks `change(block)` alters as they are built
    (the import's own twin included)."""
    from transformers.models.recurrent_gemma import modeling_recurrent_gemma as rg

    built = rg.RecurrentGemmaRecurrentBlock.__init__

    def init(self, config, layer_idx):
        built(self, config, layer_idx)
        change(self)

    monkeypatch.setattr(rg.RecurrentGemmaRecurrentBlock, "__init__", init)
    return _tiny.random_hf_model(
        transformers.RecurrentGemmaForCausalLM,
        _tiny.tiny_config(transformers.AutoConfig.for_model("recurrent_gemma")),
    )


def test_a_mixer_we_do_not_compute_is_refused_by_its_parts(memo, monkeypatch):
    # Griffin's block with one more map than it has: no kind of mixer we compute.
    reference = _recurrent_gemma_whose_block(
        monkeypatch, lambda block: setattr(block, "extra", torch.nn.Linear(4, 4))
    )
    with pytest.raises(ValueError, match=r"RecurrentGemmaRecurrentBlock of parts \['act_fn'"):
        HookedTransformer.from_hf(reference)


def test_a_griffin_block_of_another_activation_is_refused(memo, monkeypatch):
    reference = _recurrent_gemma_whose_block(
        monkeypatch, lambda block: setattr(block, "act_fn", torch.nn.ReLU())
    )
    with pytest.raises(ValueError, match="ReLU is not the tanh-approximated GELU"):
        HookedTransformer.from_hf(reference)


def test_a_hybrid_anatomy_round_trips_through_the_memo(memo):
    from hookedattn.core.hf import _anatomy

    config = twin("bamba").config
    first = _anatomy.recognise(config)  # read off the twin, then remembered
    again = _anatomy.recognise(config)  # read from the memo's JSON
    assert again == first and again.mixers.kind == "mamba2"


# LFM3 also norms each sublayer's output (`pre_and_post`), which no weight can absorb.
@pytest.mark.parametrize("model_type", [m for m in HYBRIDS if m != "lfm3"])
def test_an_imported_hybrid_processes_exactly(model_type):
    from hookedattn.core import processing

    model = HookedTransformer.from_hf(twin(model_type, seed=3).double())
    processed = processing.process_weights(model)  # the norms folded into the mixers too
    assert processed.cfg.normalization_type == "RMSPre"
    with torch.no_grad():
        expected, got = model(TOKENS).log_softmax(-1), processed(TOKENS).log_softmax(-1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_falcon_h1_keeps_its_heads_and_its_mixer_write_apart():
    model = HookedTransformer.from_hf(twin("falcon_h1", seed=7).double())
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS[:, :6])
    block = "blocks.1"
    written = cache[f"{block}.hook_attn_out"] + cache[f"{block}.hook_mixer_out"]
    torch.testing.assert_close(
        cache[f"{block}.hook_resid_mid"], cache[f"{block}.hook_resid_pre"] + written,
        rtol=0, atol=1e-12,
    )  # fmt: skip
    assert cache[f"{block}.attn.hook_pattern"].shape == (2, model.cfg.n_heads, 6, 6)
    assert cache[f"{block}.mixer.hook_mixing"].shape[1] == model.cfg.mixers.n_ssm_heads


def test_falcon_h1_refuses_a_norm_before_its_gate():
    config = _tiny.tiny_config(transformers.AutoConfig.for_model(
        "falcon_h1", mamba_rms_norm=True, mamba_norm_before_gate=True))  # fmt: skip
    model = _tiny.random_hf_model(transformers.FalconH1ForCausalLM, config)
    with pytest.raises(ValueError, match="mamba_norm_before_gate=True"):
        HookedTransformer.from_hf(model)


def test_nemotron_h_layers_are_blocks_of_one_sublayer():
    from hookedattn.core.components.block import AttnOnlyBlock, MLPOnlyBlock

    reference = twin("nemotron_h", seed=8).double()
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.mixers.layers == ("mamba2", "attention", "none")
    kinds = [AttnOnlyBlock, AttnOnlyBlock, MLPOnlyBlock]
    assert [variant_base(type(b)) for b in model.blocks] == kinds
    x = torch.randn(2, 9, model.cfg.d_model, generator=torch.Generator().manual_seed(9),
                    dtype=torch.float64)  # fmt: skip
    with torch.no_grad():  # the MLP layer's MLP: float64 throughout in both
        want, got = reference.model.layers[2].mixer(x), model.blocks[2].mlp(x)
    assert relative_worst(got, want) <= 1e-12


def test_nemotron_h_experts_are_the_transformers_module_in_float64():
    reference = twin("nemotron_h_moe", seed=8).double()
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.layer_is_moe(1) and not model.cfg.gated_mlp
    x = torch.randn(2, 9, model.cfg.d_model, generator=torch.Generator().manual_seed(9),
                    dtype=torch.float64)  # fmt: skip
    with torch.no_grad():  # the router's logits are float32 in theirs (float64 in ours)
        want, got = reference.model.layers[1].mixer(x), model.blocks[1].mlp(x)
    assert relative_worst(got, want) <= 1e-6


def test_nemotron_h_latent_projection_is_refused_by_name():
    config = transformers.AutoConfig.for_model("nemotron_h", moe_latent_size=16)
    model = _tiny.random_hf_model(transformers.NemotronHForCausalLM, _tiny.tiny_config(config))
    with pytest.raises(ValueError, match="moe_latent_size=16"):
        HookedTransformer.from_hf(model)


@pytest.mark.parametrize("model_type", ["falcon_h1", "nemotron_h", "nemotron_h_moe"])
def test_a_saved_checkpoint_imports_verified(model_type, tmp_path):
    reference = twin(model_type, seed=10)
    reference.save_pretrained(tmp_path)  # Nemotron-H's names as its checkpoints: `backbone.`
    model = HookedTransformer.from_hf(tmp_path)  # verified on its tiny twin before loading
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= 1e-5


@pytest.mark.parametrize("model_type", ["qwen3_next", "lara_mini"])
def test_a_gated_delta_net_loads_from_its_files_as_from_the_live_model(model_type, tmp_path):
    # Qwen3-Next's interleaved projections read by their runs; Lara Mini's saved as one.
    reference = twin(model_type, seed=6)
    reference.save_pretrained(tmp_path)
    live, files = HookedTransformer.from_hf(reference), HookedTransformer.from_hf(tmp_path)
    for name, tensor in live.state_dict().items():
        assert torch.equal(files.state_dict()[name], tensor), name


def test_a_piece_of_every_key_heads_run_is_read_alone():
    from hookedattn.core.hf._slices import read_rule
    from hookedattn.core.hf._table import Rule, StateDict, _converted

    # 3 runs of [q (2 rows); v (4 rows)], each row its own number, 2 columns.
    stored = torch.arange(36, dtype=torch.float64).reshape(18, 2)
    sizes = {"group": 3, "d_state": 2, "d_v": 4, "d_model": 2}
    rule = Rule("W_v", "w", "(group d_v) d_model -> d_model (group d_v)",
                split=("d_state", "d_v"), part=1, split_within="group")  # fmt: skip
    expected = torch.cat([stored[6 * g + 2 : 6 * g + 6] for g in range(3)]).T
    for ranges, columns in (({}, slice(None)), ({"group": (1, 3)}, slice(4, None))):
        got = read_rule(rule, StateDict({"w": stored}), "w", sizes, ranges, torch.float64, "cpu")
        assert torch.equal(got, expected[:, columns])
    assert torch.equal(_converted(rule, stored, sizes, torch.float64, "cpu"), expected)
