"""Activation patching of hybrid models (blocks with a mixer in attention's place or beside
it): every pass runs from position 0 (`_plan.runs_from_the_start`: what a mixer reads of
earlier positions is not among the unpatched run's activations), and the batched engine
gives the numbers of one forward per patch (`_reference.reference_sweep`, float64)."""

import dataclasses
import functools

import pytest
import torch

from analysis.patching import (
    Component,
    activation_patch,
    attribution_patch,
    available_kinds,
    compare_patching,
    path_patch,
)
from analysis.patching._components import component_grid
from analysis.patching._reference import reference_sweep
from hookedattn.core.mixer_config import MixerConfig
from hookedattn.testing import random_tokens
from tests.helpers.mixers import SETTINGS, hybrid_cfg, random_hybrid

BATCH, N_POS = 2, 6
EXACT = dict(rtol=0.0, atol=1e-10)
LAYOUTS = {
    "mixers around attention": ("mamba2", "attention", "short_conv"),
    "delta rule then attention": ("gated_delta", "attention"),
    "a mixer beside every attention": ("attention", "attention"),
}


@functools.cache
def _model(layout: str):
    kinds = LAYOUTS[layout]
    cfg = hybrid_cfg(kinds)
    if layout == "a mixer beside every attention":
        mixers = MixerConfig(layers=kinds, beside_attention="mamba2", **SETTINGS)
        cfg = dataclasses.replace(cfg, mixers=mixers)
    return random_hybrid(cfg, 3)


CLEAN, CORRUPTED = (random_tokens(23, BATCH, N_POS, seed) for seed in (1, 2))


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    """Reads every position, so that no patch is skipped."""
    return (logits[:, :, 3] - logits[:, :, 0]).sum(1)


def last_logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3] - logits[:, -1, 0]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_kind_of_a_hybrid_matches_the_reference(layout):
    model = _model(layout)
    _, cache = model.run_with_cache(CLEAN)
    kinds = available_kinds(model)
    assert {"resid_pre", "attn_out", "mlp_out", "z", "pattern"} <= set(kinds)
    if layout == "a mixer beside every attention":  # its heads' kinds as the others'; quicker
        kinds = ["resid_pre", "attn_out", "z"]
    for kind in kinds:
        for by_pos in (True, False):
            result = activation_patch(
                model, kind, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=logit_diff,
                by_pos=by_pos,
            )  # fmt: skip
            components = component_grid(model, kind, N_POS, by_pos).components
            expected = reference_sweep(model, CORRUPTED, cache, components, logit_diff)
            actual = result.per_prompt.reshape(-1, BATCH)
            torch.testing.assert_close(actual, expected, **EXACT, msg=f"{kind} by_pos={by_pos}")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_hybrid_with_declared_positions_matches_the_reference(layout):
    model = _model(layout)
    _, cache = model.run_with_cache(CLEAN)
    for kind in ("resid_pre", "attn_out", "mlp_out"):
        result = activation_patch(
            model, kind, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED,
            metric=last_logit_diff, by_pos=True, metric_positions=N_POS - 1,
        )  # fmt: skip
        components = component_grid(model, kind, N_POS, True).components
        expected = reference_sweep(model, CORRUPTED, cache, components, last_logit_diff)
        torch.testing.assert_close(result.per_prompt.reshape(-1, BATCH), expected, **EXACT)


def test_attribution_patching_of_a_hybrid_lays_out_activation_patchings_grid():
    """Every kind, heads included in the blocks that attend: the same components, axes and
    labels as activation patching, so the two compare; a head's kinds name only those
    blocks."""
    model = _model("mixers around attention")
    prompts = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED)
    approx = attribution_patch(model, **prompts, metric=logit_diff)
    assert set(approx) == set(available_kinds(model))
    assert approx["z"].labels[0] == ("1",)  # block 1 attends; 0 and 2 hold mixers
    for kind in ("z", "resid_pre", "attn_out"):
        exact = activation_patch(model, kind, **prompts, metric=logit_diff)
        assert (approx[kind].axes, approx[kind].labels) == (exact.axes, exact.labels)
        assert compare_patching(approx[kind], exact).error.isfinite().all()


def _path_by_hand(model, sender, receiver_head: tuple[int, int]) -> torch.Tensor:
    """Path patching (noising) written out: step 1 runs the clean prompts with the sender
    from the corrupted run and, from its block on, every other head's `z` and every mixer's
    write frozen at the clean run's; step 2 patches what the receiver's values saw."""
    _, clean = model.run_with_cache(CLEAN)
    _, corrupted = model.run_with_cache(CORRUPTED)
    layer, head = receiver_head

    def frozen(keep: int | None = None):
        """The clean value (a `z`: every head's but `keep`'s)."""

        def hook(value, hook):
            if not hook.name.endswith("hook_z"):
                return clean[hook.name]
            value = value.clone()
            heads = [h for h in range(value.shape[2]) if h != keep]
            value[:, :, heads] = clean[hook.name][:, :, heads]
            return value

        return hook

    hooks = []
    for block in range(sender.layer, 4):
        attends = model.cfg.layer_mixer(block) == "attention"
        name = f"blocks.{block}.attn.hook_z" if attends else f"blocks.{block}.hook_attn_out"
        if name != sender.hook_name:
            hooks.append((name, frozen()))
        elif attends:
            hooks.append((name, frozen(keep=sender.head)))
    sender_name = sender.hook_name

    def send(value, hook):
        value = value.clone()
        if sender.head is None:
            return corrupted[sender_name]
        value[:, :, sender.head] = corrupted[sender_name][:, :, sender.head]
        return value

    seen = {}
    receiver = f"blocks.{layer}.attn.hook_v"
    record = lambda value, hook: seen.setdefault("v", value.clone())
    model.run_with_hooks(CLEAN, fwd_hooks=[(sender_name, send), *hooks, (receiver, record)])

    def patched(value, hook):
        value = value.clone()
        value[:, :, head] = seen["v"][:, :, head]
        return value

    return logit_diff(model.run_with_hooks(CLEAN, fwd_hooks=[(receiver, patched)]))


@pytest.mark.parametrize("sender", [Component("attn_out", 0), Component("z", 1, head=2)])
def test_path_patching_of_a_hybrid_freezes_its_mixers_as_heads(sender):
    model = random_hybrid(hybrid_cfg(("mamba2", "attention", "short_conv", "attention")), 3)
    with torch.no_grad():
        expected = _path_by_hand(model, sender, (3, 1))
        result = path_patch(
            model, Component("v", 3, head=1), [sender], clean_tokens=CLEAN,
            corrupted_tokens=CORRUPTED, metric=logit_diff,
        )  # fmt: skip
    torch.testing.assert_close(result.per_prompt[0], expected, **EXACT)
    assert float((expected - result.clean).abs().max()) > 1e-6  # the path carries something


def test_path_patching_refuses_a_mixer_beside_the_attention():
    with pytest.raises(ValueError, match="beside its attention"):
        path_patch(
            _model("a mixer beside every attention"), Component("v", 1, head=0), "z",
            clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=logit_diff,
        )  # fmt: skip
