"""Hybrid layer layouts beyond a mixer in attention's place, in float64: Falcon-H1's block, a
Mamba-2 mixer beside the attention (`MixerConfig.beside_attention`, `ParallelMixerBlock`),
and Nemotron-H's blocks of one sublayer (a mixing sublayer alone, `AttnOnlyBlock`, or an MLP
alone, `MLPOnlyBlock`: `MixerConfig.layers` "none" and `mlp_layers`). For each: its
equation against the modules alone (and, for Falcon-H1's, a plain model when the mixer
writes nothing), its hook points, the residual decomposition summing with every write
apart, padding, generation, weight processing, save and load, and the configurations it
refuses."""

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.core._variants import variant_base
from hookedattn.core.components.block import AttnOnlyBlock, Block, MLPOnlyBlock, ParallelMixerBlock
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kernels import attention_context
from hookedattn.core.mixer_config import MixerConfig

D_MODEL, VOCAB = 12, 23


def _cfg(normed: bool = False, **fields: object) -> HookedTransformerConfig:
    mixers = MixerConfig(
        layers=("attention",) * 3, beside_attention="mamba2", d_conv=3, n_ssm_heads=4,
        d_ssm_head=6, d_state=5, n_ssm_groups=2, ssm_gated_norm=normed, proj_bias=True,
        conv_bias=True,
    )  # fmt: skip
    return HookedTransformerConfig(
        n_layers=3, d_model=D_MODEL, n_ctx=32, d_vocab=VOCAB, n_heads=3, d_mlp=20,
        normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
        act_fn="silu", seed=0, dtype=torch.float64, mixers=mixers, **fields,
    )  # fmt: skip


def _nemotron_cfg() -> HookedTransformerConfig:
    """Nemotron-H's layout "M*-M-": Mamba-2, attention, MLP, Mamba-2, MLP; no positions."""
    layers = ("mamba2", "attention", "none", "mamba2", "none")
    mixers = MixerConfig(
        layers=layers, mlp_layers=tuple(k == "none" for k in layers), d_conv=3,
        n_ssm_heads=4, d_ssm_head=6, d_state=5, n_ssm_groups=2, proj_bias=True, conv_bias=True,
    )  # fmt: skip
    return HookedTransformerConfig(
        n_layers=5, d_model=D_MODEL, n_ctx=32, d_vocab=VOCAB, n_heads=3, n_key_value_heads=1,
        d_mlp=20, normalization_type="RMS", positional_embedding_type="none", act_fn="relu2",
        seed=0, dtype=torch.float64, mixers=mixers,
    )  # fmt: skip


def _randomised(model: HookedTransformer) -> HookedTransformer:
    """Every parameter random (gains, biases, A_log, D too)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)
    return model


def _model(normed: bool = False, **fields: object) -> HookedTransformer:
    """A Falcon-H1-like model, every parameter random."""
    return _randomised(HookedTransformer(_cfg(normed, **fields)))


def _layout(name: str) -> HookedTransformer:
    """A random model of the layout `name`: "falcon_h1" or "nemotron_h"."""
    return _model() if name == "falcon_h1" else _randomised(HookedTransformer(_nemotron_cfg()))


LAYOUTS = ["falcon_h1", "nemotron_h"]


def _tokens(seed: int, shape: tuple[int, int] = (2, 7)) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def test_every_block_holds_the_mixer_beside_its_attention() -> None:
    model = _model()
    assert all(isinstance(block, ParallelMixerBlock) for block in model.blocks)
    assert not hasattr(model.blocks[0].mixer, "w_norm")  # ssm_gated_norm=False
    names = [n.removeprefix("blocks.1.") for n in model.hook_dict if n.startswith("blocks.1.")]
    expected = ["hook_resid_pre", "hook_attn_out", "hook_mixer_out", "hook_resid_mid",
                "hook_mlp_out", "hook_resid_post"]  # fmt: skip
    assert [n for n in names if n in expected] == expected  # in the order the forward reaches
    assert "mixer.hook_mixing" in names and "attn.hook_pattern" in names


@pytest.mark.parametrize("normed", [False, True])
def test_the_mixer_write_is_the_mixer_alone_on_the_normed_stream(normed: bool) -> None:
    model = _model(normed)
    _, cache = model.run_with_cache(_tokens(2))
    block, resid_pre = model.blocks[1], cache["blocks.1.hook_resid_pre"]
    alone = attention_context(64, resid_pre.shape[0], resid_pre.shape[1], None, None, None, "cpu")
    with torch.no_grad():
        mixer_write = block.mixer(block.ln1(resid_pre), alone)
    written = cache["blocks.1.hook_attn_out"] + mixer_write
    torch.testing.assert_close(cache["blocks.1.hook_mixer_out"], mixer_write, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        cache["blocks.1.hook_resid_mid"], resid_pre + written, rtol=0, atol=1e-12
    )


def test_without_the_mixer_write_it_is_the_plain_model() -> None:
    model = _model()
    plain = HookedTransformer(_cfg().replace(mixers=None))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".mixer." not in k})
    with torch.no_grad():
        for block in model.blocks:  # the mixers write nothing
            block.mixer.W_out.zero_()
            block.mixer.b_out.zero_()
    assert all(isinstance(block, Block) and not hasattr(block, "mixer") for block in plain.blocks)
    tokens = _tokens(7)
    torch.testing.assert_close(model(tokens), plain(tokens), rtol=0, atol=1e-12)


@pytest.mark.parametrize("granularity", ["sublayer", "head", "neuron"])
def test_the_decomposition_sums_with_the_mixer_as_its_own_term(granularity: str) -> None:
    from analysis.decomposition import decompose_resid

    model = _model()
    _, cache = model.run_with_cache(_tokens(3))
    decomposition = decompose_resid(model, cache, granularity=granularity)
    final = cache["blocks.2.hook_resid_post"]
    torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)
    assert {"L0_mamba2", "L1_mamba2", "L2_mamba2"} <= set(decomposition.labels)
    if granularity != "sublayer":
        assert "L1H2" in decomposition.labels  # the heads keep their own terms


@pytest.mark.parametrize("granularity", ["sublayer", "head", "neuron"])
def test_the_decomposition_of_blocks_of_one_sublayer_sums(granularity: str) -> None:
    from analysis.decomposition import decompose_resid

    model = _layout("nemotron_h")
    _, cache = model.run_with_cache(_tokens(3))
    decomposition = decompose_resid(model, cache, granularity=granularity)
    final = cache["blocks.4.hook_resid_post"]
    torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)
    labels = set(decomposition.labels)
    assert not any(label.startswith(("L0_mlp", "L1_mlp", "L3_mlp", "L2_attn", "L4_attn"))
                   for label in labels)  # fmt: skip
    if granularity == "neuron":
        assert {"L2N0", "L4N19", "L1H2", "L0_mamba2"} <= labels
    else:
        assert {"L2_mlp", "L4_mlp"} <= labels


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_reaches_no_real_token(side: str, layout: str) -> None:
    model = _layout(layout)
    short, long = [3, 9, 4], [7, 1, 2, 8, 5, 6]
    pad = [0] * (len(long) - len(short))
    real_row = [1] * len(short)
    row, mask_row = (pad + short, [0] * len(pad) + real_row) if side == "left" else (
        short + pad, real_row + [0] * len(pad))  # fmt: skip
    batched = model(torch.tensor([row, long]), attention_mask=torch.tensor([mask_row, [1] * 6]))
    real = slice(len(pad), None) if side == "left" else slice(0, len(short))
    torch.testing.assert_close(
        batched[0, real], model(torch.tensor([short]))[0], rtol=0, atol=1e-10
    )
    torch.testing.assert_close(batched[1], model(torch.tensor([long]))[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generation_reruns_the_prefix_and_is_greedy(layout: str) -> None:
    model = _layout(layout)
    prompt = _tokens(4, (2, 4))
    generated = model.generate(prompt, max_new_tokens=5, stop_at_eos=False)
    tokens = prompt
    for _ in range(5):  # each step a plain forward of the whole sequence: the mixer keeps no cache
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, tokens)


@pytest.mark.parametrize("layout", ["falcon_h1_normed", *LAYOUTS])
def test_weight_processing_keeps_the_log_probs(layout: str) -> None:
    from hookedattn.core import processing

    model = _model(normed=True) if layout == "falcon_h1_normed" else _layout(layout)
    processed = processing.process_weights(model)
    assert processed.cfg.normalization_type == "RMSPre"
    tokens = _tokens(5)
    expected = model(tokens).log_softmax(-1)
    torch.testing.assert_close(processed(tokens).log_softmax(-1), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_it_saves_and_loads(tmp_path, layout: str) -> None:
    model = _layout(layout)
    model.save(tmp_path / layout)
    loaded = HookedTransformer.load(tmp_path / layout)
    assert loaded.cfg == model.cfg
    tokens = _tokens(6)
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)


def test_a_mixer_beside_attention_needs_a_sequential_pre_norm_block() -> None:
    with pytest.raises(ValueError, match="beside_attention .* needs a sequential block"):
        _cfg(parallel_attn_mlp=True)


def test_an_unknown_kind_beside_attention_is_refused() -> None:
    with pytest.raises(ValueError, match=r"beside_attention='mamba3'; valid: \(None, "):
        MixerConfig(layers=("attention",), beside_attention="mamba3")


def test_each_block_holds_one_sublayer_and_only_its_hook_points() -> None:
    model = _layout("nemotron_h")
    kinds = [AttnOnlyBlock, AttnOnlyBlock, MLPOnlyBlock, AttnOnlyBlock, MLPOnlyBlock]
    assert [variant_base(type(block)) for block in model.blocks] == kinds
    names = set(model.hook_dict)
    for layer in (0, 1, 3):  # mixing alone: no MLP, no resid_mid
        assert f"blocks.{layer}.hook_attn_out" in names
        assert not {f"blocks.{layer}.hook_mlp_out", f"blocks.{layer}.hook_resid_mid"} & names
    for layer in (2, 4):  # an MLP alone: no ln1, no attention's write
        assert {f"blocks.{layer}.hook_mlp_out", f"blocks.{layer}.ln2.hook_scale"} <= names
        assert not any(n.startswith((f"blocks.{layer}.ln1", f"blocks.{layer}.hook_attn"))
                       for n in names)  # fmt: skip


def test_each_block_of_one_sublayer_is_its_equation() -> None:
    model = _layout("nemotron_h")
    _, cache = model.run_with_cache(_tokens(8))
    for layer in range(model.cfg.n_layers):
        block, resid_pre = model.blocks[layer], cache[f"blocks.{layer}.hook_resid_pre"]
        with torch.no_grad():
            if layer in (2, 4):  # resid_post = resid_pre + mlp(ln2(resid_pre))
                write = block.mlp(block.ln2(resid_pre))
                torch.testing.assert_close(cache[f"blocks.{layer}.hook_mlp_out"], write)
            else:  # resid_post = resid_pre + mixing(ln1(resid_pre)), the cached write
                write = cache[f"blocks.{layer}.hook_attn_out"]
        torch.testing.assert_close(
            cache[f"blocks.{layer}.hook_resid_post"], resid_pre + write, rtol=0, atol=1e-12
        )
    alone = attention_context(64, 2, 7, None, None, None, "cpu")
    with torch.no_grad():  # a Mamba-2 block's write is the mixer alone on the normed stream
        mixer_write = model.blocks[3].mixer(model.blocks[3].ln1(cache["blocks.3.hook_resid_pre"]),
                                            alone)  # fmt: skip
    torch.testing.assert_close(cache["blocks.3.hook_attn_out"], mixer_write, rtol=0, atol=1e-12)


def test_a_block_of_no_sublayer_is_refused() -> None:
    with pytest.raises(ValueError, match=r"blocks \[1\] would hold no sublayer"):
        MixerConfig(layers=("attention", "none"), mlp_layers=(True, False))


def test_mlp_layers_need_a_model_with_mlps() -> None:
    mixers = MixerConfig(layers=("attention", "none"), mlp_layers=(False, True))
    with pytest.raises(ValueError, match="mlp_layers says which blocks hold an MLP"):
        _nemotron_cfg().replace(n_layers=2, attn_only=True, mixers=mixers)


def test_stacked_mlp_weights_name_the_blocks_without_an_mlp() -> None:
    model = _layout("nemotron_h")
    with pytest.raises(ValueError, match=r"blocks \[0, 1, 3\] hold none"):
        _ = model.W_in
    with pytest.raises(ValueError, match=r"blocks \[0, 2, 3, 4\] hold \['mamba2', 'none'\]"):
        _ = model.W_Q
