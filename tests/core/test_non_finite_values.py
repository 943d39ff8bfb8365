"""Non-finite values stay where they are, and are never hidden.

An inf or NaN key or value reaches no earlier position, a NaN in a padding position no
real token, and a finite key whose scores overflow leaves earlier positions finite.

A NaN or inf weight shows on the default (fused) path exactly where the written-out
equation shows it. torch's CPU `scaled_dot_product_attention` returns 0 rather than NaN
for a NaN query or key at some sizes (one query position among them), so `model(t)`,
`run_with_cache(t)` and a `use_fused_kernels=False` twin must give non-finite logits at
the same positions, and the same finite logits everywhere else.

On commit 256099a (the guard checked only the kernel's output) the first two weight tests
fail for a NaN or inf in W_Q or W_K (a one-position forward, a one-token prompt and its
decode steps), with and without grouped keys. With padding, torch's kernel propagated the
NaN in every batch we tried, so the third passed before the fix too: it keeps the fix from
regressing on the masked path.
"""

import math
from functools import partial

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig, KeyValueCache
from hookedattn.testing import tiny_model

BASE = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=16, d_vocab=23, d_mlp=32, seed=0)
SHAPES = {
    "gpt2": {},
    "gqa-rotary": {
        "n_key_value_heads": 2,
        "positional_embedding_type": "rotary",
        "normalization_type": "RMS",
    },
}
SITES = ["W_Q", "W_K", "W_V", "W_O", "W_E"]
VALUES = {"nan": math.nan, "inf": math.inf}
# Decode steps and padded batches: NaN everywhere, inf where it reaches a score (an inf
# value or output weight makes NaN or inf by plain arithmetic, as the first test shows).
STEP_CASES = [(site, "nan") for site in SITES] + [(site, "inf") for site in ("W_Q", "W_K", "W_E")]


def poisoned(shape: str, site: str, value: float) -> tuple[HookedTransformer, HookedTransformer]:
    """A float64 model with one entry of `site` set to `value`, fused and written out.

    The entry is in layer 0, head 0 (a query head; for GQA, key/value head 0), or in the
    embedding row of token 3, which every input below holds at position 1.
    """
    cfg = HookedTransformerConfig(**{**BASE, "dtype": torch.float64, **SHAPES[shape]})
    fused = HookedTransformer(cfg)
    params = dict(fused.named_parameters())
    with torch.no_grad():
        if site == "W_E":
            params["embed.W_E"][3, 2] = value
        else:  # grouped keys and values are stored per key/value head, as `_W_K`, `_W_V`
            name = f"blocks.0.attn.{site}"
            params.get(name, params.get(f"blocks.0.attn._{site}"))[0, 1, 2] = value
    assert sum(int((~p.isfinite()).sum()) for p in fused.parameters()) == 1
    written = HookedTransformer(cfg.replace(use_fused_kernels=False))
    written.load_state_dict(fused.state_dict())
    return fused, written


def tokens(batch: int, pos: int) -> torch.Tensor:
    t = torch.randint(4, 23, (batch, pos), generator=torch.Generator().manual_seed(pos))
    t[:, min(1, pos - 1)] = 3  # the poisoned embedding's token
    return t


def assert_same_non_finite(fused: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    """Non-finite at the same positions, equal (to float64 rounding) where finite."""
    bad, expected = ~fused.isfinite(), ~reference.isfinite()
    assert expected.any(), f"{what}: the reference shows no non-finite value (test setup)"
    assert torch.equal(bad, expected), (
        f"{what}: the fused path has {int(bad.sum())} non-finite logits where the written-out "
        f"equation has {int(expected.sum())}"
    )
    torch.testing.assert_close(fused[~bad], reference[~expected], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_non_finite_weight_shows_on_the_default_path_where_written_out_shows_it(
    shape, site, value
):
    """Guards: model(t) on the fused path keeps a NaN/inf weight's non-finite logits, at
    1, 2 and 7 positions (at one, torch's kernel returns 0 for a NaN query or key)."""
    fused, written = poisoned(shape, site, VALUES[value])
    for pos in (1, 2, 7):
        t = tokens(2, pos)
        reference = written(t)
        assert_same_non_finite(fused(t), reference, f"model(t) at {pos} positions")
        cached, _ = fused.run_with_cache(t)
        assert_same_non_finite(cached, reference, f"run_with_cache(t) at {pos} positions")


@pytest.mark.parametrize(("site", "value"), STEP_CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_non_finite_weight_shows_in_every_generation_step_with_a_kv_cache(shape, site, value):
    """Guards: a one-token prompt and each one-token decode step after it (one query position
    against cached keys) keep a corrupted weight's non-finite values, as written out does."""
    fused, written = poisoned(shape, site, VALUES[value])
    t = tokens(2, 5)
    steps = []
    for model in (fused, written):
        cache = KeyValueCache.empty(model.cfg, batch=2)
        steps.append(torch.cat([model(t[:, i : i + 1], past_kv_cache=cache) for i in range(5)], 1))
    assert_same_non_finite(steps[0], steps[1], "prompt and decode steps")


@pytest.mark.parametrize(("site", "value"), STEP_CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_non_finite_weight_shows_in_a_left_padded_batch(shape, site, value):
    """Guards: with padding (an explicit mask on the fused kernel), a poisoned weight's
    non-finite logits appear at the same real positions as written out."""
    fused, written = poisoned(shape, site, VALUES[value])
    t = tokens(3, 5)
    mask = torch.ones_like(t)
    mask[0, :3] = 0  # the first row's only real tokens are positions 3 and 4
    mask[1, :1] = 0
    reference = written(t, attention_mask=mask)
    # Padded positions read nothing real: only the real ones are compared.
    real = mask.bool()
    got = fused(t, attention_mask=mask)
    assert_same_non_finite(got[real], reference[real], "padded model(t)")
    cached, _ = fused.run_with_cache(t, attention_mask=mask)
    assert_same_non_finite(cached[real], reference[real], "padded run_with_cache(t)")


# ------------------------------------------------------------ non-finite activations
make_model = partial(
    tiny_model, n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=23, d_mlp=32
)
TOKENS = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("site", ["blocks.0.attn.hook_k", "blocks.0.attn.hook_v"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_non_finite_key_or_value_never_reaches_earlier_positions(site, value):
    model = make_model()

    def poison(x, hook):
        x[:, 5] = value
        return x

    logits = model.run_with_hooks(TOKENS, fwd_hooks=[(site, poison)])
    clean = model(TOKENS)
    torch.testing.assert_close(logits[:, :5], clean[:, :5], rtol=1e-12, atol=1e-12)
    assert not logits[:, 5:].isfinite().all()


def test_a_finite_key_whose_scores_overflow_leaves_earlier_positions_finite():
    model = make_model(dtype=torch.float32)

    def huge(k, hook):
        k[:, 5] = 3e38
        return k

    logits = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_k", huge)])
    assert logits[:, :5].isfinite().all()


def test_nan_in_a_padding_position_does_not_reach_real_tokens():
    model = make_model()
    mask = torch.ones_like(TOKENS)
    mask[:, :2] = 0  # left padding

    def poison(resid, hook):
        resid[:, :2] = math.nan
        return resid

    padded = model.run_with_hooks(
        TOKENS, attention_mask=mask, fwd_hooks=[("blocks.0.hook_resid_pre", poison)]
    )
    assert padded[:, 2:].isfinite().all()
