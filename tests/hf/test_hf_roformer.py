"""RoFormer imported by convention: BERT's layer layout (`_split_layers`) with no positions
in the stream, its queries and keys rotated in neighbouring pairs by a table of sinusoids
the encoder hands every layer (`_handed_rotary`). A tiny random twin (`_tiny`: the stream
64 wide, 4 heads of 16, the sinusoid table as `transformers` computes it) is compared with
`transformers`: the logits and every residual stream, and greedy generation.
"""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import relative_worst
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _handed_rotary, _tiny  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 77], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3]])


def twin(seed: int = 0, **fields) -> nn.Module:
    """A tiny random RoFormer decoder, as the verification builds one."""
    config = transformers.AutoConfig.for_model("roformer", is_decoder=True, **fields)
    return _tiny.random_hf_model(
        transformers.RoFormerForCausalLM, _tiny.tiny_config(config), seed=seed
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_import_computes_what_transformers_computes(dtype):
    # transformers' sinusoids are float64 angles rounded to a float32 table; ours are too
    # (`rotary_angles_float64` with `rotary_table_float32`), so float64 agrees to float64's
    # rounding.
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5  # of each tensor's largest value
    reference = twin(seed=3).to(dtype)
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS, output_hidden_states=True)
        logits, cache = model.run_with_cache(TOKENS)
    assert relative_worst(logits, expected.logits) <= tolerance
    for i in range(model.cfg.n_layers):
        got, want = cache[f"blocks.{i}.hook_resid_pre"], expected.hidden_states[i]
        assert relative_worst(got, want) <= tolerance
    last = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    assert relative_worst(last, expected.hidden_states[-1]) <= tolerance


def test_the_import_rotates_the_whole_head_by_base_10000_without_learned_positions():
    model = HookedTransformer.from_hf(twin(seed=5).double())
    cfg = model.cfg
    assert (cfg.positional_embedding_type, cfg.rotary_dim, cfg.rotary_base) == (
        "rotary",
        16,
        10000.0,
    )


def test_the_stream_entering_the_first_layer_is_the_normed_embedding_and_token_type_0():
    reference = twin(seed=6).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
        want = reference.roformer.embeddings(TOKENS)  # token type 0 added, then normed
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], want, rtol=0, atol=1e-12)


def test_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=4), TOKENS[:, :5]))


def test_rotated_values_are_refused_by_name():
    with pytest.raises(ValueError, match=r"rotary_value=True \(the values rotated"):
        HookedTransformer.from_hf(twin(seed=7, rotary_value=True))


def test_the_sinusoids_are_transformers_table():
    table = transformers.models.roformer.modeling_roformer.RoFormerSinusoidalPositionalEmbedding
    want = table(300, 16).create_weight().double()  # float64's, rounded to float32
    torch.testing.assert_close(_handed_rotary.sinusoids(300, 16), want, rtol=0, atol=1e-7)


def test_a_handed_table_of_another_base_is_refused_by_name():
    rows = _handed_rotary.sinusoids(7, 16).float()
    wrong = rows.clone()
    wrong[1:, 1] += 1e-3  # pair 1's angle from another base
    seen = {"table:encoder.embed_positions": (None, wrong)}
    with pytest.raises(ValueError, match=r"encoder.embed_positions hands the layers sinusoids"):
        _handed_rotary.handed_table(seen, [wrong[None, None]], d_head=16)
    seen = {"table:encoder.embed_positions": (None, rows)}
    assert _handed_rotary.handed_table(seen, [rows[None, None]], 16) == "encoder.embed_positions"
