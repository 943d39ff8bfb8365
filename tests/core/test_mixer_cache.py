"""A hybrid model's mixers with a KV cache (`components.mixer_cache`): each mixer keeps its
earlier inputs, and a forward over the cache computes the new positions' rows only. For
every kind of mixer, in place of attention and (Mamba-2) beside it: a sequence run in
pieces through a cache gives the logits of the whole (float64, 1e-12 of their scale);
greedy generation with the cache gives the tokens of generation without it, padded
batches included; the mixers' hook points see the new positions only, and a cache over the
generation is the whole sequence's."""

import dataclasses

import pytest
import torch

from hookedattn.core.kv_cache import KeyValueCache
from hookedattn.core.mixer_config import MixerConfig
from tests.helpers.mixers import KIND_SETTINGS, SETTINGS, hybrid_cfg, random_hybrid

# Each kind between two attention layers' neighbours, and Falcon-H1's mixer beside attention.
KINDS = {**KIND_SETTINGS, "beside_attention": {}}


def _model(kind: str, seed: int = 5):
    if kind == "beside_attention":
        cfg = hybrid_cfg(("attention", "attention"))
        mixers = MixerConfig(layers=("attention",) * 2, beside_attention="mamba2", **SETTINGS)
        return random_hybrid(dataclasses.replace(cfg, mixers=mixers), seed)
    return random_hybrid(hybrid_cfg((kind, "attention", kind), **KINDS[kind]), seed)


def _tokens(shape: tuple[int, int], seed: int) -> torch.Tensor:
    return torch.randint(0, 23, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=list(KINDS))
def kind(request) -> str:
    return request.param


def test_a_sequence_run_in_pieces_through_the_cache_gives_the_whole_ones_logits(kind) -> None:
    model = _model(kind)
    tokens = _tokens((2, 9), 1)
    with torch.no_grad():
        whole = model(tokens)
        cache = KeyValueCache.empty(model.cfg, 2)
        pieces = [model(tokens[:, a:b], past_kv_cache=cache) for a, b in ((0, 4), (4, 5), (5, 9))]
    got = torch.cat(pieces, dim=1)
    torch.testing.assert_close(got, whole, rtol=0, atol=1e-12 * float(whole.abs().max()))
    assert cache.length == 9


def test_greedy_generation_with_the_cache_gives_the_tokens_without_it(kind) -> None:
    model = _model(kind)
    prompt = _tokens((2, 4), 2)
    options = dict(max_new_tokens=6, stop_at_eos=False)
    cached = model.generate(prompt, **options)
    rerun = model.generate(prompt, use_past_kv_cache=False, **options)
    assert torch.equal(cached, rerun)


def test_a_left_padded_row_generates_what_it_generates_alone(kind) -> None:
    model = _model(kind)
    short, long = _tokens((1, 3), 3), _tokens((1, 6), 4)
    options = dict(max_new_tokens=4, stop_at_eos=False)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), short], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1] * 6])
    batched = model.generate(torch.cat([padded, long]), attention_mask=mask, **options)
    alone = model.generate(short, **options)
    assert torch.equal(batched[0, 3:], alone[0])
    assert torch.equal(batched[1], model.generate(long, **options)[0])


def test_a_mixers_hook_points_see_the_new_positions_only() -> None:
    model = _model("mamba2")
    seen: list[tuple[str, tuple[int, ...]]] = []
    names = ("blocks.0.mixer.hook_in", "blocks.0.mixer.hook_mixing", "blocks.0.mixer.hook_out")
    record = lambda value, hook: seen.append((hook.name, tuple(value.shape)))
    with model.hooks(fwd_hooks=[(name, record) for name in names]):
        model.generate(_tokens((1, 4), 5), max_new_tokens=2, stop_at_eos=False)
    heads = model.cfg.mixers.n_ssm_heads
    assert seen == [
        ("blocks.0.mixer.hook_in", (1, 4, 12)),
        ("blocks.0.mixer.hook_mixing", (1, heads, 4, 4)),
        ("blocks.0.mixer.hook_out", (1, 4, 12)),
        ("blocks.0.mixer.hook_in", (1, 1, 12)),
        ("blocks.0.mixer.hook_mixing", (1, heads, 1, 5)),
        ("blocks.0.mixer.hook_out", (1, 1, 12)),
    ]


# A hook point whose value later positions read, in each mixer that has one.
CARRIED_EDITS = [("gated_delta", "hook_in"), ("mamba", "hook_in"), ("rg_lru", "hook_decay"),
                 ("kimi_delta", "hook_beta"), ("lightning", "hook_v"), ("gated_delta", "hook_k"),
                 ("gated_delta", "hook_decay")]  # fmt: skip


@pytest.mark.parametrize(("kind", "point"), CARRIED_EDITS)
def test_an_edit_at_the_prompt_reaches_later_steps_as_in_one_forward(kind, point) -> None:
    """A prompt run through the cache with an edit, continued without it, gives the logits
    of one forward whose edit covers the prompt's positions."""
    model = _model(kind)
    tokens = _tokens((1, 7), 6)

    def scaled_prompt(value: torch.Tensor, hook) -> torch.Tensor:
        value = value.clone()
        value[:, : min(4, value.shape[1])] *= 0.5
        return value

    hooks = [(f"blocks.0.mixer.{point}", scaled_prompt)]
    with torch.no_grad():
        whole = model.run_with_hooks(tokens, fwd_hooks=hooks)
        cache = KeyValueCache.empty(model.cfg, 1)
        model.run_with_hooks(tokens[:, :4], past_kv_cache=cache, fwd_hooks=hooks)
        rest = model(tokens[:, 4:], past_kv_cache=cache)
        unedited = model(tokens)
    scale = float(whole.abs().max())
    torch.testing.assert_close(rest, whole[:, 4:], rtol=0, atol=1e-12 * scale)
    assert float((whole[:, 4:] - unedited[:, 4:]).abs().max()) > 1e-6 * scale  # it reaches


def test_a_cache_over_the_generation_is_the_whole_sequences(kind) -> None:
    model = _model(kind)
    result = model.generate(
        _tokens((1, 4), 7), max_new_tokens=3, stop_at_eos=False, return_cache=True
    )
    cache, (_, whole) = result.cache, model.run_with_cache(result.tokens)
    mixers = [name for name in whole if ".mixer." in name]
    assert mixers
    for name in [*mixers, "blocks.2.hook_resid_post", "ln_final.hook_normalized"]:
        if name not in whole:
            continue
        expected = whole[name]
        torch.testing.assert_close(
            cache[name], expected, rtol=0, atol=1e-12 * max(1.0, float(expected.abs().max()))
        )


def test_a_frozen_cache_is_read_and_left_as_it_was() -> None:
    model = _model("short_conv")
    tokens = _tokens((1, 6), 8)
    with torch.no_grad():
        whole = model(tokens)
        cache = KeyValueCache.empty(model.cfg, 1)
        model(tokens[:, :4], past_kv_cache=cache)
        cache.freeze()
        carried = cache[0].carried("conv")  # the convolution's last inputs
        first = model(tokens[:, 4:], past_kv_cache=cache)
        again = model(tokens[:, 4:], past_kv_cache=cache)
    assert cache.length == 4 and cache[0].carried("conv") is carried
    torch.testing.assert_close(first, whole[:, 4:], rtol=0, atol=1e-12 * float(whole.abs().max()))
    assert torch.equal(first, again)


def test_a_failed_step_leaves_the_mixers_inputs_as_they_were() -> None:
    model = _model("beside_attention")
    tokens = _tokens((1, 5), 9)

    def fail(value: torch.Tensor, hook) -> None:
        raise RuntimeError("stop here")

    with torch.no_grad():
        whole = model(tokens)
        cache = KeyValueCache.empty(model.cfg, 1)
        model(tokens[:, :4], past_kv_cache=cache)
        with pytest.raises(RuntimeError, match="stop here"):
            model.run_with_hooks(
                tokens[:, 4:], past_kv_cache=cache, fwd_hooks=[("blocks.1.hook_resid_pre", fail)]
            )
        assert [cache[layer].beside().length for layer in (0, 1)] == [4, 4]
        last = model(tokens[:, 4:], past_kv_cache=cache)  # the retry appends once
    torch.testing.assert_close(last, whole[:, 4:], rtol=0, atol=1e-12 * float(whole.abs().max()))


@pytest.mark.parametrize("kind", ["mamba", "rg_lru", "kimi_delta", "short_conv"])
def test_what_a_mixer_carries_holds_no_more_than_itself(kind) -> None:
    """A carried state is the last of a forward's states: kept as a view it would keep all
    of them (Mamba-1's `[batch pos d_inner d_state]`) for the whole generation."""
    model = _model(kind)
    cache = KeyValueCache.empty(model.cfg, 1)
    with torch.no_grad():
        model(_tokens((1, 9), 10), past_kv_cache=cache)
    carried = cache[0]._carried
    assert carried
    for name, value in carried.items():
        own = value.numel() * value.element_size()
        assert value.untyped_storage().nbytes() == own, name


def _read(value: torch.Tensor, hook) -> torch.Tensor:
    return value  # reading `hook_mixing` makes the mixer write its mixing matrix out


@pytest.mark.parametrize("read_at", [0, 1, 2])
@pytest.mark.parametrize("kind", ["gated_delta", "mamba2"])
def test_a_cache_carries_the_state_whether_or_not_the_mixing_is_read(kind, read_at) -> None:
    """A sequence in three pieces through the cache, `hook_mixing` read in one of them (the
    mixing written out there from the rows kept, the state carried on all the same): the
    whole sequence's logits."""
    model = _model(kind)
    tokens = _tokens((2, 9), 17)
    with torch.no_grad():
        whole = model(tokens)
        cache, pieces = KeyValueCache.empty(model.cfg, 2), []
        for i, piece in enumerate((tokens[:, :4], tokens[:, 4:5], tokens[:, 5:])):
            hooks = [("blocks.0.mixer.hook_mixing", _read)] if i == read_at else []
            with model.hooks(fwd_hooks=hooks):
                pieces.append(model(piece, past_kv_cache=cache))
    got = torch.cat(pieces, dim=1)
    torch.testing.assert_close(got, whole, rtol=0, atol=1e-12 * float(whole.abs().max()))


@pytest.mark.parametrize("kind", ["gated_delta", "mamba2"])
def test_without_fused_kernels_the_mixing_is_always_written_out(kind) -> None:
    """`use_fused_kernels=False` writes every equation out: a run that caches every hook
    point is the plain forward bit for bit, the mixers' mixing matrices included."""
    from hookedattn import HookedTransformer

    fused = _model(kind)
    model = HookedTransformer(fused.cfg.replace(use_fused_kernels=False))
    model.load_state_dict(fused.state_dict())
    tokens = _tokens((2, 7), 18)
    with torch.no_grad():
        plain = model(tokens)
        cached, _ = model.run_with_cache(tokens)
    assert torch.equal(plain, cached)
