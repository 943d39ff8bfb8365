"""The decode step checked once (nothing listening) against the decode step checked per
layer (a hook attached): the same logits on every block shape, the same non-finite values,
one synchronisation per step, and every hook, torch's included, at every step.

The reference is the same generation with a no-op hook attached: the model is then
listened to, and every fused layer checks its own operands (`kernels.guarded`).
"""

import pytest
import torch
from helpers.families import FAMILIES, family_model
from helpers.fused import VARIANTS, pair
from torch import nn
from torch.profiler import ProfilerActivity, profile

from hookedattn import KeyValueCache
from hookedattn.core.components.mlp import MLP
from hookedattn.core.generation import GenerationOptions, generation_steps, prompt_of
from hookedattn.testing import random_tokens

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
NO_OP = [("blocks.0.hook_resid_pre", lambda x, hook: None)]  # listened: a guard per layer


def models(dtype=torch.float64):
    out = {f"variant {k}": pair(v, dtype)[0] for k, v in VARIANTS.items()}
    return out | {f"family {k}": family_model(k, dtype=dtype) for k in FAMILIES}


MODELS = models()


def prompt(model, padded, batch=3, pos=5):
    tokens = random_tokens(model.cfg.d_vocab, batch, pos, seed=3)
    if not padded:
        return tokens, None
    mask = torch.ones_like(tokens)
    mask[0, :2] = 0
    mask[2, :1] = 0
    return tokens, mask


def loop_steps(model, tokens, mask=None, **options):
    """The generation loop's steps (no stop token)."""
    prompt = prompt_of(model, tokens, mask, None)
    return generation_steps(model, prompt, GenerationOptions(stop_at_eos=False, **options))


def run(model, tokens, mask=None, hooks=(), n=6, **options):
    with model.hooks(fwd_hooks=list(hooks)):
        return list(loop_steps(model, tokens, mask, max_new_tokens=n, **options))


def assert_same_steps(once, per_layer, tol):
    assert [s.tokens.tolist() for s in once] == [s.tokens.tolist() for s in per_layer]
    for i, (a, b) in enumerate(zip(once, per_layer, strict=True)):
        torch.testing.assert_close(a.logits, b.logits, rtol=tol, atol=tol, equal_nan=True, msg=i)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("name", MODELS)
def test_the_step_checked_once_gives_the_logits_checked_per_layer(name, padded):
    model = MODELS[name]
    tokens, mask = prompt(model, padded)
    assert_same_steps(run(model, tokens, mask), run(model, tokens, mask, NO_OP), 1e-10)


@pytest.mark.parametrize("name", ["variant gpt2", "family gemma2", "family llama"])
def test_the_step_checked_once_in_float32(name):
    model = models(torch.float32)[name]
    tokens, _ = prompt(model, False)
    assert_same_steps(run(model, tokens), run(model, tokens, hooks=NO_OP), 1e-5)


def test_with_fused_kernels_off_the_step_is_the_listened_step_bit_for_bit():
    _, written = pair(VARIANTS["llama"], torch.float64)
    tokens, _ = prompt(written, False)
    assert_same_steps(run(written, tokens), run(written, tokens, hooks=NO_OP), 0.0)


def synchronisations(model, hooks=()):
    """`.item()` calls (host-device synchronisations) of one decode step."""
    tokens = random_tokens(model.cfg.d_vocab, 2, 4, seed=1)
    cache = KeyValueCache.empty(model.cfg, 2, capacity=8)
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        model(tokens, past_kv_cache=cache)
        model._next_token_step(tokens[:, :1], cache)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model._next_token_step(tokens[:, 1:2], cache)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::item")


def test_a_decode_step_with_idle_hooks_synchronises_once():
    model = MODELS["variant gpt2"]
    assert synchronisations(model) == 1
    assert synchronisations(model, NO_OP) >= model.cfg.n_layers  # the guard of every layer


def generation_synchronisations(model, n_new):
    tokens = random_tokens(model.cfg.d_vocab, 2, 4, seed=1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model.generate(tokens, max_new_tokens=n_new, do_sample=False, stop_at_eos=False)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::item")


def test_each_generated_token_synchronises_once_where_nothing_listens():
    # The step's guard reads the logits, so the loop does not read them again.
    model = MODELS["variant gpt2"]
    assert generation_synchronisations(model, 6) - generation_synchronisations(model, 2) == 4


def test_a_hook_anywhere_runs_at_every_step():
    model = MODELS["family llama"]
    seen = []
    hooks = [("blocks.1.mlp.hook_post", lambda x, hook: seen.append(x.shape[1]))]
    run(model, *prompt(model, False), hooks=hooks, n=4)
    assert seen == [5, 1, 1, 1]


def test_a_hook_attached_between_steps_runs_from_the_next_step_on():
    model = MODELS["variant gpt2"]
    tokens, _ = prompt(model, False)
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    shift = [("blocks.0.hook_resid_post", lambda x, hook: x + direction.to(x.dtype))]

    def steps(early_hooks):
        it = loop_steps(model, tokens, max_new_tokens=4)
        with model.hooks(fwd_hooks=early_hooks):
            first = [next(it), next(it)]  # the prompt, then one decode step
        with model.hooks(fwd_hooks=shift):
            return first + list(it)

    once_early = steps([])
    assert_same_steps(once_early, steps(NO_OP), 1e-10)
    assert not torch.allclose(once_early[-1].logits, run(model, tokens, n=4)[-1].logits)


# ---------------------------------------------------------------- non-finite values
def poisoned(model, where):
    """A copy of `model` with a NaN at `where`."""
    model = model.copy()
    with torch.no_grad():
        if where == "W_Q":  # a fused kernel returns 0 for a NaN query among few keys
            model.blocks[1].attn.W_Q[0, 0, 0] = float("nan")
        elif where == "W_V":
            model.blocks[0].attn.W_V[1, 3, 0] = float("nan")
        elif where == "W_U":
            model.unembed.W_U[2, 5] = float("nan")
        elif where == "ln2":
            model.blocks[0].ln2.w[3] = float("nan")
    return model


@pytest.mark.parametrize("where", ["W_Q", "W_V", "W_U", "ln2"])
def test_a_nan_weight_shows_in_the_decode_steps_logits_as_when_checked_per_layer(where):
    model = poisoned(MODELS["variant gpt2"], where)
    tokens = random_tokens(model.cfg.d_vocab, 2, 4, seed=5)
    logits = []
    for hooks in ([], NO_OP):
        cache = KeyValueCache.empty(model.cfg, 2, capacity=4)
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            model(tokens[:, :2], past_kv_cache=cache)  # two keys at the first step
            steps = [model._next_token_step(tokens[:, i : i + 1], cache)[0] for i in (2, 3)]
        logits.append(torch.stack(steps))
    assert torch.equal(logits[0].nan_to_num(7.0), logits[1].nan_to_num(7.0))
    assert logits[0].isnan().any(dim=-1).all()


@pytest.mark.parametrize("where", ["W_Q", "W_U"])
def test_generation_refuses_logits_that_are_not_finite(where):
    # The argmax of NaN logits is token 0: a generation must not read as ordinary text.
    model = poisoned(MODELS["variant gpt2"], where)
    tokens = random_tokens(model.cfg.d_vocab, 2, 2, seed=5)
    with pytest.raises(ValueError, match=r"rows \[0, 1\] at new token 1 are not finite"):
        run(model, tokens, n=3)


def test_a_nan_key_at_a_padding_position_stays_unread_as_when_checked_per_layer():
    # A fused kernel adds -inf to a blocked score: NaN there would spread to every query.
    model = MODELS["variant gpt2"]
    tokens, mask = prompt(model, padded=True)

    def poison(k, hook):
        k[0, 0] = float("nan")  # row 0 is padded at positions 0 and 1

    def steps(hooks_after_prompt):
        it = loop_steps(model, tokens, mask, max_new_tokens=3)
        with model.hooks(fwd_hooks=[("blocks.1.attn.hook_k", poison)]):
            first = next(it)  # the prompt's keys are stored with the NaN
        with model.hooks(fwd_hooks=hooks_after_prompt):
            return [first, *it]

    once, per_layer = steps([]), steps(NO_OP)
    assert_same_steps(once, per_layer, 1e-10)
    assert all(step.logits.isfinite().all() for step in once)


# ---------------------------------------------------------------- weights and modules
def test_a_weight_edited_between_steps_is_seen_in_place_and_by_assignment():
    def steps(model, hooks):
        it = loop_steps(model, *prompt(model, False), max_new_tokens=5)
        with model.hooks(fwd_hooks=hooks):
            out = [next(it), next(it)]
            with torch.no_grad():
                model.blocks[0].attn.W_O.mul_(2.0)
                model.blocks[1].mlp.W_out = nn.Parameter(model.blocks[1].mlp.W_out * 0.5)
                model.unembed.W_U.add_(0.1)
            return out + list(it)

    once = steps(MODELS["family neox"].copy(), [])
    per_layer = steps(MODELS["family neox"].copy(), NO_OP)
    assert_same_steps(once, per_layer, 1e-10)


class DoubledMLP(MLP):
    """An MLP whose output is doubled: a module of one's own."""

    def forward(self, x):
        return 2 * super().forward(x)


def test_a_module_of_the_users_own_runs_at_every_step():
    model = MODELS["variant gpt2"].copy()
    doubled = DoubledMLP(model.cfg)
    doubled.load_state_dict(model.blocks[0].mlp.state_dict())
    model.blocks[0].mlp = doubled
    model.setup()
    tokens, _ = prompt(model, False)
    steps = run(model, tokens, n=4)
    sequence = torch.cat([tokens, *[s.tokens[:, None] for s in steps[:-1]]], dim=1)
    with torch.no_grad():
        full = model(sequence)[:, tokens.shape[1] - 1 :]
    for i, step in enumerate(steps):
        torch.testing.assert_close(step.logits, full[:, i], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("where", ["module", "global"])
def test_a_torch_forward_hook_runs_at_every_step(where):
    model = MODELS["variant gpt2"].copy()
    seen = []

    def hook(module, args, output):
        seen.append(output.shape[1])

    if where == "module":
        handle = model.blocks[1].mlp.register_forward_hook(hook)
    else:
        handle = nn.modules.module.register_module_forward_hook(
            lambda m, a, out: hook(m, a, out) if m is model.blocks[1].mlp else None
        )
    try:
        run(model, *prompt(model, False), n=4)
    finally:
        handle.remove()
    assert seen == [5, 1, 1, 1]  # the prompt, then each decode step, once
