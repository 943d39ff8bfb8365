"""Activation patching of hybrid models (blocks with a mixer in attention's place or beside
it): every pass runs from position 0 (`_plan.runs_from_the_start`: what a mixer reads of
earlier positions is not among the unpatched run's activations), and the batched engine
gives the numbers of one forward per patch (`_reference.reference_sweep`, float64)."""

import dataclasses
import functools

import pytest
import torch

from analysis.patching import activation_patch, available_kinds
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
    assert {"resid_pre", "attn_out", "mlp_out"} <= set(kinds)
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
