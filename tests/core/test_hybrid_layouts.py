"""Hybrid layer layouts beyond a mixer in attention's place: Falcon-H1's block, a Mamba-2
mixer beside the attention (`MixerConfig.beside_attention`, `ParallelMixerBlock`), in
float64: its equation against a plain block plus the mixer alone, the residual
decomposition summing with the two writes apart, its hook points, padding, generation,
weight processing, save and load, and the configurations it refuses."""

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.core.components.block import Block, ParallelMixerBlock
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


def _model(normed: bool = False, **fields: object) -> HookedTransformer:
    """A Falcon-H1-like model with every parameter random (gains, biases, A_log, D too)."""
    model = HookedTransformer(_cfg(normed, **fields))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)
    return model


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


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_reaches_no_real_token(side: str) -> None:
    model = _model()
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


def test_generation_reruns_the_prefix_and_is_greedy() -> None:
    model = _model()
    prompt = _tokens(4, (2, 4))
    generated = model.generate(prompt, max_new_tokens=5, stop_at_eos=False)
    tokens = prompt
    for _ in range(5):  # each step a plain forward of the whole sequence: the mixer keeps no cache
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, tokens)


def test_weight_processing_folds_ln1_into_both_readers() -> None:
    from hookedattn.core import processing

    model = _model(normed=True)
    processed = processing.process_weights(model)
    assert processed.cfg.normalization_type == "RMSPre"
    tokens = _tokens(5)
    expected = model(tokens).log_softmax(-1)
    torch.testing.assert_close(processed(tokens).log_softmax(-1), expected, rtol=0, atol=1e-10)


def test_it_saves_and_loads(tmp_path) -> None:
    model = _model()
    model.save(tmp_path / "falcon_h1_like")
    loaded = HookedTransformer.load(tmp_path / "falcon_h1_like")
    assert loaded.cfg == model.cfg and loaded.cfg.mixers.beside_attention == "mamba2"
    tokens = _tokens(6)
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)


def test_a_mixer_beside_attention_needs_a_sequential_pre_norm_block() -> None:
    with pytest.raises(ValueError, match="beside_attention .* needs a sequential block"):
        _cfg(parallel_attn_mlp=True)


def test_an_unknown_kind_beside_attention_is_refused() -> None:
    with pytest.raises(ValueError, match=r"beside_attention='mamba3'; valid: \(None, "):
        MixerConfig(layers=("attention",), beside_attention="mamba3")
