"""`randomize_parameters`: every parameter random, the input model untouched."""

import torch

from hookedattn import HookedTransformer
from hookedattn.testing import randomize_parameters, tiny_model


def model() -> HookedTransformer:
    return tiny_model(
        n_layers=1, d_model=8, n_heads=2, n_ctx=4, d_vocab=5, d_mlp=8, dtype=torch.float32
    )


def test_biases_and_gains_move_off_their_initial_values():
    random = randomize_parameters(model())
    assert (random.blocks[0].attn.b_O != 0).all()
    assert (random.blocks[0].ln1.w != 1).all()
    gains = [p for n, p in random.named_parameters() if n.endswith(".w")]
    assert 0.5 < torch.cat(gains).mean() < 1.5


def test_the_input_model_is_left_as_it_was():
    original = model()
    before = {n: p.clone() for n, p in original.state_dict().items()}
    randomize_parameters(original)
    assert all(torch.equal(p, before[n]) for n, p in original.state_dict().items())


def test_one_seed_gives_one_model_and_another_seed_another():
    a, b, c = (randomize_parameters(model(), seed=s) for s in (1, 1, 2))
    assert torch.equal(a.W_Q, b.W_Q)
    assert not torch.equal(a.W_Q, c.W_Q)
