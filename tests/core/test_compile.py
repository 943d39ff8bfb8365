"""`torch.compile` works on a model with no hooks and on `run_with_cache` of fixed names.

One tiny model, because compiling is slow on a CPU: the two tests take 35-45 s together on
our shared 2-core machine (the inductor cache on disk saves only part of it). Speed is
measured by `python scripts/bench` (the `compile` section), never here.
"""

import jaxtyping
import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tokens, tiny_model

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

NAMES = ["blocks.0.attn.hook_pattern", "blocks.1.hook_resid_post", "ln_final.hook_scale"]


@pytest.fixture(autouse=True)
def _without_runtime_shape_checks():
    """The suite's jaxtyping + beartype checks are a test instrument that dynamo cannot trace
    (beartype's error path sees fake tensors); users compile without them, and so do we."""
    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", previous)


def make_model() -> HookedTransformer:
    return tiny_model(n_heads=2, n_ctx=8, d_vocab=20, d_mlp=32, dtype=torch.float32)


def tokens(seed: int) -> torch.Tensor:
    return random_tokens(20, batch=2, pos=8, seed=seed)


@torch.no_grad()
def test_a_compiled_model_gives_the_eager_logits():
    model = make_model()
    compiled = torch.compile(model)
    for seed in (0, 1):
        torch.testing.assert_close(
            compiled(tokens(seed)), model(tokens(seed)), **tolerance(torch.float32).as_kwargs()
        )


@torch.no_grad()
def test_a_compiled_run_with_cache_records_the_eager_activations_every_call():
    model = make_model()
    compiled = torch.compile(lambda t: model.run_with_cache(t, names_filter=NAMES))
    for seed in (0, 1):  # the second call must record its own activations, not replay
        logits, cache = compiled(tokens(seed))
        eager_logits, eager = model.run_with_cache(tokens(seed), names_filter=NAMES)
        assert list(cache.keys()) == NAMES
        torch.testing.assert_close(logits, eager_logits, **tolerance(torch.float32).as_kwargs())
        for name in NAMES:
            torch.testing.assert_close(
                cache[name], eager[name], **tolerance(torch.float32).as_kwargs()
            )
    assert model.attached_hooks() == []
