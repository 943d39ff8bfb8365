"""A hookedattn module is called without nn.Module's `__call__` only where no torch hook,
compiled call or trace could see the call (`_module_calls`): every torch hook still runs."""

import torch
from torch import nn

from hookedattn.core import _module_calls
from hookedattn.core.components.attention import Attention
from hookedattn.testing import random_tokens, tiny_model


def model_and_tokens():
    model = tiny_model(n_layers=2, d_model=16, n_heads=2, d_head=8, d_vocab=23, d_mlp=32)
    model = model.to(torch.float64)
    return model, random_tokens(23, 2, 6, seed=0)


def test_components_take_the_quiet_call():
    model, _ = model_and_tokens()
    assert type(model.blocks[0]).__call__ is _module_calls.quiet_call
    assert type(model.blocks[0].attn).__call__ is _module_calls.quiet_call
    assert nn.Linear.__call__ is nn.Module.__call__  # classes outside hookedattn: left alone
    assert type(model).__call__ is nn.Module.__call__  # and the root


def test_a_forward_pre_hook_that_replaces_the_input_runs():
    model, tokens = model_and_tokens()
    handle = model.blocks[1].register_forward_pre_hook(lambda m, args: (args[0] * 0, *args[1:]))
    try:
        logits = model(tokens)
    finally:
        handle.remove()
    zeroed = [("blocks.1.hook_resid_pre", lambda x, hook: x * 0)]
    torch.testing.assert_close(
        logits, model.run_with_hooks(tokens, fwd_hooks=zeroed), rtol=0, atol=0
    )


def test_a_global_forward_hook_sees_every_component_call():
    model, tokens = model_and_tokens()
    seen = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda m, args, out: seen.append(m) if isinstance(m, Attention) else None
    )
    try:
        model(tokens)
    finally:
        handle.remove()
    assert seen == [model.blocks[0].attn, model.blocks[1].attn]


def test_a_backward_hook_on_a_block_runs():
    model, tokens = model_and_tokens()
    grads = []
    handle = model.blocks[0].register_full_backward_hook(lambda m, gin, gout: grads.append(gout))
    try:
        model(tokens).sum().backward()
    finally:
        handle.remove()
    assert len(grads) == 1 and grads[0][0].shape == (2, 6, 16)


def test_a_forward_set_on_an_instance_is_called():
    model, tokens = model_and_tokens()
    mlp = model.blocks[0].mlp
    calls = []

    def forward(*args, **kwargs):
        calls.append(1)
        return type(mlp).forward(mlp, *args, **kwargs)

    mlp.forward = forward
    try:
        model(tokens)
    finally:
        del mlp.forward
    assert calls == [1]
