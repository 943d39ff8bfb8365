"""A forward installed on every module's instance, as nnsight's `NNsight(model)` does it.

nnsight puts an object of its own in each module's `__dict__["forward"]` (the model's too)
and reads and edits the value that object returns. A hook point skips `nn.Module.__call__`
while idle, so the model notices the installed forwards at the start of each forward and
routes its hook points through them: every hook point is then reached, with the values
`run_with_cache` records (the written-out equations, not the fused kernels), an edit made
there is kept, and no forward is run twice unseen. Done here by hand, without nnsight
(tests/tl/test_nnsight.py runs nnsight itself).
"""

import functools
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from hookedattn.testing import random_tiny_model, random_tokens

VARIANTS = {
    "gpt2": dict(act_fn="gelu"),
    "llama": dict(
        normalization_type="RMS",
        positional_embedding_type="rotary",
        gated_mlp=True,
        act_fn="silu",
        n_key_value_heads=2,
        use_attn_result=True,
    ),
    "moe": dict(num_experts=4, experts_per_token=2, gated_mlp=True, act_fn="silu"),
}


class Installed:
    """A forward of its own on every module of `model` (nnsight's way of wrapping one):
    each calls the class's forward, records the output under the module's name, and
    returns `edits[name](output)` where an edit is given."""

    def __init__(self, model: nn.Module, edits: dict[str, Any] | None = None) -> None:
        self.model, self.edits, self.seen = model, edits or {}, {}
        for name, module in model.named_modules():
            module.__dict__["forward"] = functools.partial(self._visit, name, module)

    def _visit(self, name: str, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        out = type(module).forward(module, *args, **kwargs)
        if name in self.edits:
            out = self.edits[name](out)
        self.seen.setdefault(name, []).append(out)
        return out

    def remove(self) -> None:
        for module in self.model.modules():
            del module.__dict__["forward"]


def make(variant: str) -> Any:
    return random_tiny_model(dtype=torch.float32, **VARIANTS[variant])


TOKENS = random_tokens(32, batch=2, pos=6, seed=2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_hook_point_reaches_its_installed_forward_with_the_cached_value(variant):
    model = make(variant)
    logits, cache = model.run_with_cache(TOKENS)
    installed = Installed(model)
    out = model(TOKENS)
    torch.testing.assert_close(out, logits, rtol=0, atol=0)
    assert installed.seen[""] == [out]
    for name in model.hook_dict:
        if variant == "moe" and ".experts." in name:  # a point per expert: rows may be empty
            torch.testing.assert_close(installed.seen[name][0], cache[name], rtol=0, atol=0)
            continue
        assert len(installed.seen[name]) == 1, name
        torch.testing.assert_close(installed.seen[name][0], cache[name], rtol=0, atol=0)


def test_an_edit_made_by_an_installed_forward_is_the_edit_a_hook_makes():
    model = make("gpt2")

    def zero_head_1(z: Tensor, hook: Any = None) -> Tensor:
        z = z.clone()
        z[:, :, 1] = 0.0
        return z

    with model.hooks([("blocks.0.attn.hook_z", zero_head_1)]):
        expected, expected_cache = model.run_with_cache(TOKENS)
    installed = Installed(model, {"blocks.0.attn.hook_z": zero_head_1})
    torch.testing.assert_close(model(TOKENS), expected, rtol=0, atol=0)
    seen = installed.seen["blocks.1.attn.hook_pattern"][0]
    torch.testing.assert_close(seen, expected_cache["blocks.1.attn.hook_pattern"], rtol=0, atol=0)


def test_a_hook_on_a_wrapped_point_runs_inside_the_installed_forward():
    model = make("gpt2")
    order = []

    def wrapper(x: Tensor) -> Tensor:
        order.append("wrapper")
        return x

    def hook(x: Tensor, hook: Any) -> Tensor:
        order.append("hook")
        return x + 1.0

    installed = Installed(model, {"blocks.0.hook_resid_post": wrapper})
    model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_resid_post", hook)])
    assert order == ["hook", "wrapper"]
    _, cache = model.run_with_cache(TOKENS)
    seen = installed.seen["blocks.0.hook_resid_post"][0]
    torch.testing.assert_close(seen, cache["blocks.0.hook_resid_post"] + 1.0)


def test_a_nan_written_by_an_installed_forward_reaches_the_logits():
    # Where nothing listens, a forward that meets a non-finite value runs again unseen
    # (`kernels.guarded`); an installed forward is a listener, so its edit stands.
    model = make("gpt2")

    def poison(out: Tensor) -> Tensor:
        out = out.clone()
        out[:, 2] = float("nan")
        return out

    Installed(model, {"blocks.0.mlp": poison})
    assert model.is_listened()
    logits = model(TOKENS)
    assert logits[:, 2:].isnan().all() and logits[:, :2].isfinite().all()


def test_generation_shows_a_wrapped_unembedding_every_prompt_position():
    model = make("gpt2")
    installed = Installed(model)  # wrapped before any forward: generate notices it first
    model.generate(TOKENS, max_new_tokens=2, do_sample=False, stop_at_eos=False)
    shapes = [tuple(x.shape) for x in installed.seen["unembed.hook_out"]]
    assert shapes == [(2, 6, 32), (2, 1, 32)]


def test_removing_the_installed_forwards_brings_back_the_idle_hook_points():
    model = make("gpt2")
    expected = model(TOKENS)
    installed = Installed(model)
    model(TOKENS)
    assert model.hook_dict["blocks.0.attn.hook_pattern"].is_active and model.is_listened()
    installed.remove()
    torch.testing.assert_close(model(TOKENS), expected, rtol=0, atol=0)
    assert not any(point.is_active for point in model.hook_points())
    assert not model.is_listened()
