"""`rotary_pairs`: `transformers`' "proportional" RoPE (LFM 3), where only the first
`partial_rotary_factor` of a head's pairs turn, at the whole head's frequencies and
pairing, and the rest keep frequency 0. Checked against `transformers`' own frequency
function, and against a rotation written out pair by pair."""

import pytest
import torch

from hookedattn import HookedTransformerConfig
from hookedattn.core.components.rotary import Rotary, rotary_frequencies
from hookedattn.core.hf import _translate

transformers = pytest.importorskip("transformers")


def config(**fields) -> HookedTransformerConfig:
    base = dict(n_layers=1, d_model=32, n_heads=2, d_head=16, n_ctx=64, d_vocab=50,
                positional_embedding_type="rotary", attn_only=True)  # fmt: skip
    return HookedTransformerConfig(**base | fields)


@pytest.mark.parametrize("proportion", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("factor", [1.0, 4.0])
def test_the_frequencies_are_transformers_own(proportion, factor):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": proportion,
            "factor": factor}  # fmt: skip
    hf_config = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=2, head_dim=16, rope_parameters=rope
    )
    expected, _ = ROPE_INIT_FUNCTIONS["proportional"](hf_config, "cpu")
    fields = _translate.rotary(hf_config, 16, partial=True)
    ours = rotary_frequencies(config(**{k: v for k, v in fields.items() if k != "rotary_base"},
                                     rotary_base=1e6))  # fmt: skip
    assert torch.equal(ours, expected.float())


def test_the_still_pairs_are_not_rotated_and_the_others_turn_as_written_out():
    cfg = config(rotary_pairs=3, rotary_base=100.0, dtype=torch.float64)
    rotary = Rotary(cfg)
    x = torch.randn(1, 5, 2, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(5)[None]
    got = rotary(x, positions)
    expected = x.clone()
    for p in range(5):
        for i in range(3):  # pair (i, i + 8), angle p * 100 ** (-2i / 16), float32 as HF's
            frequency = 1.0 / torch.tensor(100.0) ** (torch.tensor(2.0 * i) / 16)
            angle = p * frequency.double()  # the angle in the model's dtype
            c, s = angle.cos(), angle.sin()
            a, b = x[0, p, :, i], x[0, p, :, i + 8]
            expected[0, p, :, i], expected[0, p, :, i + 8] = a * c - b * s, b * c + a * s
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_more_pairs_than_the_rotated_width_holds_is_an_error():
    with pytest.raises(ValueError, match=r"rotary_pairs=9 exceeds the 8 pairs of rotary_dim=16"):
        config(rotary_pairs=9)
