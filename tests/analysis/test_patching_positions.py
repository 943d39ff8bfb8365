"""Patching with `metric_positions`: only what the declared positions need, same numbers."""

import functools
import itertools

import pytest
import torch

from analysis.patching import Component, _passes, activation_patch, available_kinds, path_patch
from hookedattn import HookedTransformer
from hookedattn.testing import random_tokens, tiny_model

BATCH, N_POS, D_VOCAB = 2, 5, 11
EXACT = dict(rtol=0.0, atol=1e-10)

MODELS = {
    "2 layers, LN, MLP": dict(),
    "3 layers, RMS, per-head inputs": dict(
        n_layers=3, normalization_type="RMS", use_attn_in=True, use_hook_mlp_in=True
    ),
    "attention-only, no norm, split qkv": dict(
        attn_only=True, d_mlp=None, normalization_type=None, use_split_qkv_input=True
    ),
    "3 layers, rotary, split qkv": dict(
        n_layers=3, positional_embedding_type="rotary", use_attn_result=True,
        use_split_qkv_input=True,
    ),
    # No room in the context after the shared keys: every pass stacks variants on the batch.
    "2 layers, context full": dict(n_ctx=N_POS, use_attn_result=True),
    # The KV cache holds the normed values (Gemma 4's), not those at hook_v.
    "3 layers, RMS, value norms": dict(n_layers=3, normalization_type="RMS", use_v_norm=True),
}  # fmt: skip


@functools.cache
def make_model(name: str) -> HookedTransformer:
    """`hookedattn.testing.tiny_model` with two heads, D_VOCAB tokens and `MODELS[name]`."""
    return tiny_model(**{"n_heads": 2, "d_vocab": D_VOCAB, "d_mlp": 32, **MODELS[name]})


CLEAN, CORRUPTED = (random_tokens(D_VOCAB, BATCH, N_POS, seed) for seed in (1, 2))
PROMPTS = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED)
ANSWERS = torch.tensor([3, 7])


def logit_diff_at(*positions: int):
    """The summed logit difference (answer minus token 0) at `positions`, per prompt."""

    def metric(logits: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(BATCH)
        return sum(logits[rows, p, ANSWERS] - logits[:, p, 0] for p in positions)

    return metric


# (what the metric reads, what is declared): one position, two, and more than it reads.
DECLARATIONS = {"last": ((-1,), -1), "two": ((1, -1), [1, -1]), "superset": ((2,), [0, 2, 3])}


def full_and_declared(model, kind, metric, declared: dict, **options):
    """`activation_patch` of `kind` computed in full and with `declared` (the metric's
    positions, a memory budget), checked to give the same numbers; both results."""
    full = activation_patch(model, kind, **PROMPTS, metric=metric, **options)
    fast = activation_patch(model, kind, **PROMPTS, metric=metric, **options, **declared)
    torch.testing.assert_close(fast.per_prompt, full.per_prompt, **EXACT)
    return full, fast


def assert_every_kind_matches(model, direction, declaration):
    reads, declared = DECLARATIONS[declaration]
    metric = logit_diff_at(*reads)
    for kind in available_kinds(model):
        for by_pos in (True, False):
            options = dict(by_pos=by_pos, direction=direction)
            full, fast = full_and_declared(
                model, kind, metric, dict(metric_positions=declared), **options
            )
            torch.testing.assert_close(fast.clean, full.clean, **EXACT)


# Each variant once, with a direction and a declaration each, so that all are covered.
CASES = [
    ("2 layers, LN, MLP", "denoising", "last"),
    ("3 layers, RMS, per-head inputs", "noising", "two"),
    ("3 layers, RMS, per-head inputs", "denoising", "superset"),
    ("attention-only, no norm, split qkv", "noising", "last"),
    ("3 layers, rotary, split qkv", "denoising", "two"),
    ("3 layers, rotary, split qkv", "noising", "last"),
    ("2 layers, context full", "denoising", "two"),
    ("3 layers, RMS, value norms", "noising", "two"),
]


@pytest.mark.parametrize(("model_name", "direction", "declaration"), CASES)
def test_every_kind_gives_the_numbers_of_the_full_computation(model_name, direction, declaration):
    assert_every_kind_matches(make_model(model_name), direction, declaration)


@pytest.mark.parametrize("memory_budget", [1, 20_000, 10**9])
def test_every_chunking_gives_the_same_numbers(memory_budget):
    model = make_model("3 layers, RMS, per-head inputs")
    metric = logit_diff_at(1, -1)
    declared = dict(metric_positions=[1, -1], memory_budget=memory_budget)
    for kind in ("z", "resid_pre", "k", "pattern", "mlp_out"):
        full_and_declared(model, kind, metric, declared, by_pos=True)


def test_patches_that_cannot_reach_the_declared_positions_keep_the_unpatched_metric():
    model = make_model("2 layers, LN, MLP")
    result = activation_patch(
        model,
        "z",
        **PROMPTS,
        metric=logit_diff_at(2),
        by_pos=True,
        metric_positions=2,
    )
    # After position 2, and in the last block anywhere but position 2: not run at all, so
    # bit for bit the unpatched metric.
    unreached = {(0, 3), (0, 4), (1, 0), (1, 1), (1, 3), (1, 4)}
    for layer, pos, head in itertools.product(range(2), range(N_POS), range(2)):
        same = torch.equal(result.per_prompt[layer, pos, head], result.corrupted)
        assert same == ((layer, pos) in unreached), (layer, pos, head)


def test_a_metric_reading_an_undeclared_position_is_an_error_naming_it():
    model = make_model("2 layers, LN, MLP")
    with pytest.raises(ValueError, match=r"also reads the logits at positions \[1, 3\].*"):
        activation_patch(model, "z", **PROMPTS, metric=logit_diff_at(1, 3, -1), metric_positions=-1)
    with pytest.raises(ValueError, match=r"metric_positions=\[1, 3, 4\] or None"):
        path_patch(
            model,
            Component("k", 1, head=0),
            **PROMPTS,
            metric=logit_diff_at(1, 3, -1),
            metric_positions=-1,
        )


def test_a_metric_reading_undeclared_positions_only_when_patched_is_caught():
    model = make_model("2 layers, LN, MLP")
    calls = []

    def sneaky(logits: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        # Four unpatched calls (a base run and a check, per run) read the last position.
        extra = 0 if len(calls) <= 4 else logits[:, 0, 0]
        return logit_diff_at(-1)(logits) + extra

    with pytest.raises(ValueError, match=r"gave NaN with z L\d+H\d+ pos \d patched"):
        activation_patch(model, "z", **PROMPTS, metric=sneaky, by_pos=True, metric_positions=-1)
    assert model.attached_hooks() == []


@pytest.mark.parametrize("model_name", ["2 layers, LN, MLP", "3 layers, rotary, split qkv"])
def test_hooks_attached_to_the_model_still_act(model_name):
    model = make_model(model_name).copy()
    last = model.cfg.n_layers - 1

    def damp(values: torch.Tensor, hook) -> torch.Tensor:
        return values * 0.5

    model.add_hook(f"blocks.{last}.attn.hook_v", damp)
    model.add_hook(f"blocks.{last - 1}.hook_attn_out", damp)
    metric = logit_diff_at(-1)
    for kind in ("z", "resid_pre", "k"):
        _, fast = full_and_declared(model, kind, metric, dict(metric_positions=-1), by_pos=True)
        assert not torch.allclose(fast.clean, metric(make_model(model_name)(CLEAN)))
    assert len(model.attached_hooks()) == 2


RECEIVERS = [
    Component("k", 1, head=0),
    Component("v", 1, head=1, pos=2),
    Component("q", 1, head=0, pos=4),
    Component("resid_post", 1),
    Component("z", 0, head=1, pos=1),
]


@pytest.mark.parametrize("direction", ["denoising", "noising"])
@pytest.mark.parametrize("model_name", ["2 layers, LN, MLP", "3 layers, rotary, split qkv"])
def test_path_patching_gives_the_numbers_of_the_full_computation(model_name, direction):
    model = make_model(model_name)
    for receiver in RECEIVERS:
        for reads, declared in DECLARATIONS.values():
            metric = logit_diff_at(*reads)
            kwargs = dict(direction=direction, senders="z", freeze_mlps=True)
            full = path_patch(model, receiver, **PROMPTS, metric=metric, **kwargs)
            fast = path_patch(
                model,
                receiver,
                **PROMPTS,
                metric=metric,
                metric_positions=declared,
                **kwargs,
            )
            torch.testing.assert_close(fast.per_prompt, full.per_prompt, **EXACT)


@pytest.mark.parametrize(
    ("metric_positions", "error", "message"),
    [
        (5, ValueError, r"5 is not a position of 5 tokens \(valid: -5\.\.4\)"),
        ([], ValueError, "metric_positions is empty"),
        (1.0, TypeError, "a position or a sequence of positions"),
        ([True], TypeError, "must hold ints"),
    ],
)
def test_bad_metric_positions_are_errors(metric_positions, error, message):
    model = make_model("2 layers, LN, MLP")
    with pytest.raises(error, match=message):
        activation_patch(
            model,
            **PROMPTS,
            metric=logit_diff_at(-1),
            metric_positions=metric_positions,
        )


def _passes_of(model, **kwargs):
    """The passes a sweep runs (the first may be the cost model's own, on a stand-in)."""
    passes = []
    original = _passes.run

    def spy(model, base, edits, p, stop_layer, names, entering=None):
        passes.append(p)
        return original(model, base, edits, p, stop_layer, names, entering)

    _passes.run = spy
    try:
        activation_patch(model, "z", **PROMPTS, by_pos=True, **kwargs)
    finally:
        _passes.run = original
    return [p for p in passes if len(p.variants) > 1]


def test_patches_confined_to_a_window_run_the_declared_positions_again():
    # A head's output in the block before the last changes one row on the way into the
    # last block: after the packed first block, every such variant runs its window in the
    # last block and then the declared position again.
    model = make_model("2 layers, LN, MLP")
    passes = _passes_of(model, metric=logit_diff_at(-1), metric_positions=-1)
    again = [v for p in passes if p.layer == 1 and p.again for v in p.variants]
    assert sorted(again) == list(range(N_POS * 2))  # layer 0's variants: every pos x head


def test_head_outputs_at_every_position_share_one_sequence_per_head():
    # Each head's output at position p changes its block's output at p alone, so one
    # packed sequence per head serves every position: one pass per block, n_heads wide.
    model = make_model("2 layers, LN, MLP")
    passes = _passes_of(model, metric=logit_diff_at(-1))
    packed = [p for p in passes if p.rows == N_POS and p.n_past == 0]
    assert [(p.layer, len(p.variants)) for p in packed[:2]] == [(0, 2), (1, 2)]
