"""The per-head analyses of a hybrid model (a mixer in attention's place in some blocks):
each is computed for the blocks with heads, against dense products of those blocks'
weights and the patterns they cache; a block without heads scores NaN where a result
covers every block, and asking for its heads is refused by name."""

import functools

import pytest
import torch

import analysis
from hookedattn.viewer import attention as attention_page  # the page of every head
from tests.helpers.mixers import hybrid_cfg, random_hybrid

KINDS = ("mamba2", "attention", "short_conv", "attention")
ATTENTION, MIXERS = [1, 3], [0, 2]


@functools.cache
def _model():
    return random_hybrid(hybrid_cfg(KINDS), 4)


def _dense_ov(layer: int, head: int) -> torch.Tensor:
    attn = _model().blocks[layer].attn
    return (attn.W_V[head] @ attn.W_O[head]).detach()


def test_a_heads_circuits_are_its_blocks_weight_products() -> None:
    model = _model()
    for layer in ATTENTION:
        attn = model.blocks[layer].attn
        for head in range(model.cfg.n_heads):
            ov = analysis.ov_circuit(model, layer, head).AB
            qk = analysis.qk_circuit(model, layer, head).AB
            torch.testing.assert_close(ov, _dense_ov(layer, head), rtol=0, atol=1e-12)
            torch.testing.assert_close(qk, attn.W_Q[head] @ attn.W_K[head].T, rtol=0, atol=1e-12)
        full = analysis.full_ov_circuit(model, layer).AB
        expected = torch.stack([model.W_E @ _dense_ov(layer, h) @ model.W_U for h in range(3)])
        torch.testing.assert_close(full, expected, rtol=0, atol=1e-12)


def test_every_heads_circuits_of_a_hybrid_are_refused_naming_its_mixers() -> None:
    with pytest.raises(ValueError, match=r"blocks \[0, 2\] hold \['mamba2', 'short_conv'\]"):
        analysis.ov_circuit(_model())
    with pytest.raises(ValueError, match=r"blocks \[2\] hold \['short_conv'\]"):
        analysis.full_qk_circuit(_model(), 2)


def test_head_detectors_score_the_blocks_with_heads_and_nan_the_others() -> None:
    model = _model()
    tokens = analysis.repeated_random_tokens(23, 6, batch=3)
    _, cache = model.run_with_cache(tokens)
    scores = analysis.induction_scores(model, tokens=tokens, cache=cache).scores
    assert scores.shape == (4, 3) and scores[MIXERS].isnan().all()
    target = tokens[:, :, None] == torch.cat([tokens[:, :1] * 0 - 1, tokens[:, :-1]], 1)[:, None]
    target = target.double() * torch.ones(12, 12).tril(-1)
    has = target.sum(-1) > 0
    for layer in ATTENTION:  # the mean attention on the induction targets, by a loop
        pattern = cache["pattern", layer]
        for head in range(3):
            mass = (pattern[:, head] * target).sum(-1)[has].mean()
            assert abs(float(scores[layer, head]) - float(mass)) < 1e-12
    top = analysis.induction_scores(model, tokens=tokens, cache=cache).top(6)
    assert len(top.rows) == 6 and all(label[1] in "13" for label, _ in top.rows)


def test_copying_scores_are_the_full_ov_circuits_spectra_and_nan_for_mixers() -> None:
    model = _model()
    scores = analysis.copying_scores(model).scores
    assert scores[MIXERS].isnan().all()
    for layer in ATTENTION:
        for head in range(3):
            full = (model.W_E @ _dense_ov(layer, head) @ model.W_U).detach()
            eigenvalues = torch.linalg.eigvals(full)
            expected = eigenvalues.sum().real / eigenvalues.abs().sum()
            assert abs(float(scores[layer, head]) - float(expected)) < 1e-9


def test_v_composition_of_a_hybrids_heads_is_the_dense_norm_ratio() -> None:
    model = _model()
    scores = analysis.composition_scores(model, "V").scores
    assert scores[MIXERS].isnan().all() and scores[:, :, MIXERS].isnan().all()
    for h1 in range(3):
        for h2 in range(3):
            first, second = _dense_ov(1, h1), _dense_ov(3, h2)
            ratio = torch.linalg.matrix_norm(first @ second) / (
                torch.linalg.matrix_norm(first) * torch.linalg.matrix_norm(second)
            )
            assert abs(float(scores[1, h1, 3, h2]) - float(ratio)) < 1e-12
    assert float(scores[3, :, 1].abs().max()) == 0.0  # a later head writes to no earlier one


def test_the_attention_page_shows_the_blocks_with_heads() -> None:
    model = _model()
    page = attention_page(model, torch.tensor([1, 2, 3]))
    assert page.data["layers"] == ATTENTION
    with pytest.raises(ValueError, match=r"blocks \[0\] hold \['mamba2'\]"):
        attention_page(model, torch.tensor([1, 2, 3]), layers=[0, 1])


def _written_by_loop(cache, layer: int, head: int) -> torch.Tensor:
    """`z_h @ W_O[h]`, head by head, from the cached `hook_z` and the block's weight."""
    return cache["z", layer][:, :, head] @ _model().blocks[layer].attn.W_O[head]


def test_stacked_head_results_of_the_blocks_with_heads_are_z_times_W_O() -> None:
    model = _model()
    _, cache = model.run_with_cache(torch.tensor([[1, 5, 2, 7, 3]]))
    stack = analysis.stacked_head_results(model, cache, layers=model.cfg.attention_layers)
    assert stack.shape == (2, 3, 1, 5, model.cfg.d_model)
    for i, layer in enumerate(ATTENTION):
        for head in range(3):
            expected = _written_by_loop(cache, layer, head)
            torch.testing.assert_close(stack[i, head], expected, rtol=0, atol=1e-12)


def test_stacking_every_block_of_a_hybrid_is_refused_naming_its_mixers() -> None:
    model = _model()
    _, cache = model.run_with_cache(torch.tensor([[1, 5, 2]]))
    with pytest.raises(ValueError, match=r"blocks \[0, 2\].*layers=model.cfg.attention_layers"):
        analysis.stacked_head_results(model, cache)
    with pytest.raises(ValueError, match=r"blocks \[2\] hold \['short_conv'\]"):
        analysis.stacked_head_results(model, cache, layers=[1, 2])


def test_a_sublayer_decomposition_labels_each_mixer_by_its_kind() -> None:
    model = _model()
    _, cache = model.run_with_cache(torch.tensor([[1, 5, 2, 7]]))
    decomposition = analysis.decompose_resid(model, cache, None, check=True)
    labels = ("embed", "L0_mamba2", "L0_mlp", "L1_attn", "L1_mlp", "L2_short_conv", "L2_mlp")
    assert decomposition.labels == (*labels, "L3_attn", "L3_mlp")
    write = decomposition.components[decomposition.labels.index("L2_short_conv")]
    torch.testing.assert_close(write, cache["blocks.2.hook_attn_out"], rtol=0, atol=0)
