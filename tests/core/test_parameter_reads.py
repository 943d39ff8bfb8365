"""A parameter read through its class's property (`parameter_read`) is the one torch keeps:
every way of replacing it is seen, and nothing else of the same name is hidden."""

import torch
from torch import nn

from hookedattn import HookedTransformer, HookedTransformerConfig


def _model() -> HookedTransformer:
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=2, d_mlp=32, d_vocab=20,
                                  n_ctx=8, act_fn="gelu", seed=0)  # fmt: skip
    return HookedTransformer(cfg)


def test_a_parameter_is_read_through_the_class_without_the_modules_fallback() -> None:
    attn = _model().blocks[0].attn
    assert isinstance(vars(type(attn))["W_O"], property)
    assert attn.W_O is attn._parameters["W_O"]


def test_a_parameter_assigned_anew_is_the_one_read() -> None:
    attn = _model().blocks[0].attn
    new = nn.Parameter(torch.zeros_like(attn.W_O))
    attn.W_O = new
    assert attn.W_O is new


def test_functional_call_reads_the_swapped_tensors() -> None:
    model = _model()
    tokens = torch.tensor([[1, 2, 3]])
    zeros = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    logits = torch.func.functional_call(model, zeros, (tokens,))
    assert torch.equal(logits, torch.zeros_like(logits))  # every weight read was the swapped one
    assert not torch.equal(model(tokens), logits)  # and the model's own are back


def test_a_name_the_module_does_not_hold_as_a_parameter_falls_through() -> None:
    model = _model()
    other = model.blocks[0].attn
    del other.W_O
    try:
        other.W_O
    except AttributeError as error:
        assert "W_O" in str(error)
    else:
        raise AssertionError("a deleted parameter was still read")
    other.register_buffer("W_O", torch.ones(2, 8, 16))
    assert torch.equal(other.W_O, torch.ones(2, 8, 16))  # a buffer of that name is found


def test_a_plain_attribute_of_a_parameters_name_is_kept_on_the_instance() -> None:
    attn = _model().blocks[0].attn
    del attn.W_O
    attn.W_O = "not a parameter"
    assert attn.W_O == "not a parameter" and "W_O" not in attn._parameters
