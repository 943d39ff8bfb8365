"""Hybrid architectures imported by convention: layers whose sublayer in attention's place
is a gated short convolution (LFM2, LFM2-MoE), a Mamba-2 mixer (Bamba, Granite 4 hybrids)
or a gated delta net (Qwen3-Next, Qwen3.5), beside attention layers, or in every layer
(Mamba 2). Each is compared with `transformers`
on a tiny random twin: the logits and every residual stream in float32 and float64, and
greedy generation; and each mixer module with ours in float64 on random inputs.

`transformers` runs its RMSNorms, its Mamba-2 scan and its delta rule in float32 whatever
the model's dtype
(`hidden_states.to(torch.float32)`, `.float()`), so a float64 twin agrees with our float64
import to float32's rounding only; the float64 identities of the mixers themselves are
checked against brute-force loops in `tests/core/test_mixers.py`.
"""

import pytest
import torch
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _tiny  # noqa: E402
from hookedattn.core.kernels import attention_context  # noqa: E402

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)
# model type -> fields set on its default config (LFM2's default attends in every layer).
HYBRIDS = {
    "bamba": {},
    "lfm2": {"layer_types": ["conv", "full_attention"] * 2, "num_hidden_layers": 4},
    "lfm2_moe": {},
    "granitemoehybrid": {},  # Mamba-2 and attention, experts with a shared MLP beside them
    "mamba2": {},  # Mamba-2 alone: every layer `x + mixer(norm(x))`, no attention, no MLP
    # Gated delta nets: Qwen3-Next's q, k, v, z interleaved per key head (2 key heads, each
    # serving 2 value heads: pieces of 16, 16, 32, 32 rows), its attention gated and partly
    # rotated; Qwen3.5's projections apart; Lara Mini's saved fused (`in_proj`), its layers
    # sliding, linear and full.
    "qwen3_next": {},
    "qwen3_5_text": {},
    "lara_mini": {},
}  # fmt: skip
# Gated delta twins amplify rounding more: on seed 3 our float32 logits are 2.2e-5
# (Qwen3-Next), 2.3e-5 (Qwen3.5), 2.2e-6 (Lara Mini) of their scale from HF's, the float64
# ones 1.3e-5, 1.8e-5, 5.1e-7 (HF's delta rule runs in float32 whatever the dtype);
# Qwen3-Next's seed-0 twin reaches 1.0e-4 in float32.
ROUNDING = {"qwen3_next": 1e-4, "qwen3_5_text": 1e-4, "lara_mini": 1e-4}


@pytest.fixture(autouse=True)
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: each test verifies afresh."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def twin(model_type: str, seed: int = 0) -> nn.Module:
    """A tiny random hybrid of `model_type`, as the verification builds one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    config = transformers.AutoConfig.for_model(model_type, **HYBRIDS[model_type])
    return _tiny.random_hf_model(model_class, _tiny.tiny_config(config), seed=seed)


def _worst(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / float(want.abs().max())


@pytest.mark.parametrize("model_type", HYBRIDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hybrid_imported_by_convention_computes_what_transformers_computes(model_type, dtype):
    # Of each tensor's largest value: float32's rounding (module docstring).
    tolerance = ROUNDING.get(model_type, 1e-5)
    reference = twin(model_type, seed=3).to(dtype)
    model = HookedTransformer.from_hf(reference)
    kinds = set(model.cfg.mixers.layers)
    assert len(kinds) == 2 if model_type != "mamba2" else kinds == {"mamba2"}
    with torch.no_grad():
        expected = reference(TOKENS, output_hidden_states=True)
        logits, cache = model.run_with_cache(TOKENS)
    assert _worst(logits, expected.logits) <= tolerance
    for i in range(model.cfg.n_layers - 1):  # every residual stream between the layers
        got, want = cache[f"blocks.{i}.hook_resid_post"], expected.hidden_states[i + 1]
        assert _worst(got, want) <= tolerance


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_hybrid_greedy_generation_is_transformers(model_type):
    reference = twin(model_type, seed=4)
    model = HookedTransformer.from_hf(reference)
    prompt = TOKENS[:, :5]
    reference.generation_config.eos_token_id = None  # neither stops nor avoids EOS
    with torch.no_grad():
        expected = reference.generate(prompt, max_new_tokens=8, do_sample=False)
    ours = model.generate(prompt, max_new_tokens=8, stop_at_eos=False)
    assert torch.equal(ours, expected)


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
    assert _worst(got, want) <= (1e-12 if module == "conv" else 1e-6)


def test_a_layer_kind_the_twin_did_not_show_is_refused():
    from hookedattn.core.hf import _anatomy

    reference = twin("lfm2_moe")
    mixers = _anatomy.recognise(reference.config).mixers
    config = transformers.AutoConfig.for_model(
        "lfm2_moe", layer_types=["conv", "sliding_attention"], num_hidden_layers=2
    )
    with pytest.raises(ValueError, match=r"layer_types holds \['sliding_attention'\]"):
        mixers.config(config)


def test_a_mixer_we_do_not_compute_is_refused_by_its_parts():
    with pytest.raises(ValueError, match="neither a gated short convolution nor a Mamba-2"):
        HookedTransformer.from_hf(
            _tiny.random_hf_model(
                transformers.JambaForCausalLM,
                _tiny.tiny_config(transformers.AutoConfig.for_model("jamba")),
            )
        )


def test_a_hybrid_anatomy_round_trips_through_the_memo():
    from hookedattn.core.hf import _anatomy

    config = twin("bamba").config
    first = _anatomy.recognise(config)  # read off the twin, then remembered
    again = _anatomy.recognise(config)  # read from the memo's JSON
    assert again == first and again.mixers.kind == "mamba2"


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_an_imported_hybrid_processes_exactly(model_type):
    from hookedattn.core import processing

    model = HookedTransformer.from_hf(twin(model_type, seed=3).double())
    processed = processing.process_weights(model)  # the norms folded into the mixers too
    assert processed.cfg.normalization_type == "RMSPre"
    with torch.no_grad():
        expected, got = model(TOKENS).log_softmax(-1), processed(TOKENS).log_softmax(-1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


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
