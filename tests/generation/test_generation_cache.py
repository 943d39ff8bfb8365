"""The cache over a generation, against `run_with_cache` of the final tokens: every family,
padded and batched rows against each row alone, and the per-step caches of
`generate_steps`."""

import pytest
import torch
from helpers.families import FAMILIES, family_model
from helpers.fused import VARIANTS, pair

from hookedattn import KeyValueCache
from hookedattn.testing import random_tokens

TOL = dict(rtol=1e-10, atol=1e-10)


def prompt(model, batch=2, pos=4, seed=3):
    return random_tokens(model.cfg.d_vocab, batch, pos, seed=seed)


def assert_cache_equal(cache, expected, names=None, **tol):
    assert sorted(cache) == sorted(expected if names is None else names)
    for name in cache:
        torch.testing.assert_close(cache[name], expected[name], **(tol or TOL), msg=name)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_cache_over_a_generation_is_run_with_cache_of_its_tokens(name):
    model = family_model(name)
    out = model.generate(prompt(model), 5, stop_at_eos=False, return_cache=True)
    assert out.tokens.shape == (2, 9) and torch.equal(out.output, out.tokens)
    _, expected = model.run_with_cache(out.tokens)
    assert_cache_equal(out.cache, expected)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_each_padded_rows_cache_is_its_cache_alone(name):
    model = family_model(name)
    rows = [prompt(model, 1, n, seed=n)[0] for n in (5, 2, 4)]
    width = max(len(r) for r in rows)
    tokens = torch.stack(
        [torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows]
    )
    mask = torch.stack([(torch.arange(width) >= width - len(r)).long() for r in rows])
    batched = model.generate(tokens, 4, attention_mask=mask, stop_at_eos=False, return_cache=True)
    for row, alone_prompt in enumerate(rows):
        alone = model.generate(alone_prompt[None], 4, stop_at_eos=False, return_cache=True)
        start = width - len(alone_prompt)  # the row's padding comes first
        assert torch.equal(batched.tokens[row, start:], alone.tokens[0])
        for n in alone.cache:
            ours = batched.cache[n][row : row + 1]
            if n.endswith(("hook_attn_scores", "hook_pattern")):
                ours = ours[..., start:, start:]
            else:
                ours = ours[:, start:]
            torch.testing.assert_close(ours, alone.cache[n], **TOL, msg=f"row {row} {n}")


def test_rows_that_end_early_are_padded_in_the_cache_as_run_with_cache_pads_them():
    model = family_model("neox")
    tokens = prompt(model, 3, 4)
    free = model.generate(tokens, 6, stop_at_eos=False)
    eos = int(free[0, 5])  # the second token row 0 generates
    out = model.generate(tokens, 6, eos_token_id=eos, return_cache=True)
    assert out.attention_mask[0, 6:].sum() == 0  # row 0 ends at its second new token
    _, expected = model.run_with_cache(out.tokens, attention_mask=out.attention_mask)
    assert_cache_equal(out.cache, expected)


def step_by_step_reference(model, tokens, n_new, names_filter=None):
    """A generation written out with `run_with_cache` and a KV cache: each step's
    activations by hand, joined along positions (scores and patterns padded)."""
    kv = KeyValueCache.empty(model.cfg, tokens.shape[0])
    stores, step = [], tokens
    for _ in range(n_new):
        logits, cache = model.run_with_cache(step, past_kv_cache=kv, names_filter=names_filter)
        stores.append(dict(cache.items()))
        step = logits[:, -1:].argmax(-1)
    _, cache = model.run_with_cache(step, past_kv_cache=kv, names_filter=names_filter)
    stores.append(dict(cache.items()))
    n = tokens.shape[1] + n_new
    out = {}
    for name in stores[0]:
        parts = stores[0][name], *[s[name] for s in stores[1:]]
        if name.endswith(("hook_attn_scores", "hook_pattern")):
            fill = -torch.inf if name.endswith("scores") else 0.0
            parts = [torch.nn.functional.pad(p, (0, n - p.shape[-1]), value=fill) for p in parts]
            out[name] = torch.cat(parts, dim=2)
        else:
            out[name] = torch.cat(parts, dim=1)
    return out


def test_with_fused_kernels_off_the_cache_is_each_steps_cache_bit_for_bit():
    _, written = pair(VARIANTS["llama"], torch.float64)
    tokens = prompt(written, 2, 5)
    out = written.generate(tokens, 4, stop_at_eos=False, return_cache=True)
    assert_cache_equal(out.cache, step_by_step_reference(written, tokens, 4), rtol=0, atol=0)


def test_names_filter_device_and_dtype_are_those_of_run_with_cache():
    model = family_model("qwen3")
    names = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern"]
    out = model.generate(
        prompt(model), 3, stop_at_eos=False, return_cache=True, names_filter=names,
        dtype=torch.float32, device="cpu",
    )  # fmt: skip
    _, expected = model.run_with_cache(out.tokens, names_filter=names, dtype=torch.float32)
    assert all(out.cache[n].dtype == torch.float32 for n in names)
    assert_cache_equal(out.cache, expected, names, rtol=1e-6, atol=1e-6)


def test_without_a_kv_cache_the_cache_is_run_with_cache_of_the_tokens():
    model = family_model("olmo2")
    out = model.generate(
        prompt(model), 3, stop_at_eos=False, return_cache=True, use_past_kv_cache=False
    )
    _, expected = model.run_with_cache(out.tokens)
    assert_cache_equal(out.cache, expected, rtol=0, atol=0)


def test_a_steered_generation_caches_the_steered_activations():
    model = family_model("llama")
    direction = torch.randn(model.cfg.d_model, dtype=torch.float64)
    hooks = [("blocks.0.hook_resid_post", lambda x, hook: x + direction)]
    with model.hooks(fwd_hooks=hooks):
        out = model.generate(prompt(model), 4, stop_at_eos=False, return_cache=True)
        _, expected = model.run_with_cache(out.tokens)
    assert_cache_equal(out.cache, expected)


def test_no_new_tokens_caches_the_prompt():
    model = family_model("llama")
    tokens = prompt(model)
    out = model.generate(tokens, 0, stop_at_eos=False, return_cache=True)
    assert torch.equal(out.tokens, tokens)
    assert_cache_equal(out.cache, model.run_with_cache(tokens)[1])


# ---------------------------------------------------------------- step by step
def test_each_step_sees_the_activations_of_its_forward():
    model = family_model("gemma2")
    tokens = prompt(model, 2, 4)
    names = "blocks.1.hook_resid_post"
    steps = list(model.generate_steps(tokens, 3, stop_at_eos=False, names_filter=names))
    assert [s.cache["resid_post", 1].shape[1] for s in steps] == [4, 1, 1]
    full = torch.cat([tokens, torch.stack([s.tokens for s in steps[:-1]], dim=1)], dim=1)
    _, expected = model.run_with_cache(full, names_filter=names)
    got = torch.cat([s.cache["resid_post", 1] for s in steps], dim=1)
    torch.testing.assert_close(got, expected["resid_post", 1], **TOL)


def test_breaking_out_of_the_steps_stops_generating_and_detaches_the_hooks():
    model = family_model("llama")
    forwards = []
    model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: forwards.append(x.shape[1]))
    for i, step in enumerate(model.generate_steps(prompt(model), 10, stop_at_eos=False)):
        assert step.cache is not None
        if i == 2:
            break
    assert forwards == [4, 1, 1]  # no forward after the step that stopped it
    assert len(model.attached_hooks()) == 1  # ours only: the recording hooks are gone
    model.reset_hooks(including_permanent=True)


# ---------------------------------------------------------------- every block shape
RECORDING_MODELS = {f"family {k}": k for k in FAMILIES} | {f"variant {k}": k for k in VARIANTS}


def recording_model(name):
    kind, _, key = name.partition(" ")
    return family_model(key) if kind == "family" else pair(VARIANTS[key], torch.float64)[0]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("name", RECORDING_MODELS)
def test_a_cached_generation_records_every_hook_point(name, padded):
    model = recording_model(name)
    tokens, mask = prompt(model, 3, 5), None
    if padded:
        mask = torch.ones_like(tokens)
        mask[0, :2] = 0
    out = model.generate(tokens, 4, attention_mask=mask, stop_at_eos=False, return_cache=True)
    _, expected = model.run_with_cache(out.tokens, attention_mask=out.attention_mask)
    assert_cache_equal(out.cache, expected)


# ---------------------------------------------------------------- written out at each step
def _counting(module):
    calls = []
    method = module.written_out

    def counted(*args):
        calls.append(args[0].shape[1])  # the positions it ran over
        return method(*args)

    module.written_out = counted
    return calls


def test_a_cached_generation_writes_each_norm_and_pattern_out_once_after_the_steps():
    model = family_model("llama")
    attn_calls, norm_calls = _counting(model.blocks[0].attn), _counting(model.blocks[1].ln2)
    out = model.generate(prompt(model, 2, 4), 5, stop_at_eos=False, return_cache=True)
    # the prompt's 4 positions and the 5 steps' one each, in one call after the last step
    assert attn_calls == [9] and norm_calls == [9]
    _, expected = model.run_with_cache(out.tokens)
    assert_cache_equal(out.cache, expected)


def test_a_hook_that_needs_the_pattern_writes_it_out_at_every_step():
    model = family_model("llama")
    attn_calls = _counting(model.blocks[0].attn)
    seen = []
    hooks = [("blocks.0.attn.hook_pattern", lambda x, hook: seen.append(x.shape[2]))]
    with model.hooks(fwd_hooks=hooks):
        out = model.generate(prompt(model, 2, 4), 3, stop_at_eos=False, return_cache=True)
    assert attn_calls == [4, 1, 1, 1] and seen == [4, 1, 1, 1]  # nothing left for later
    _, expected = model.run_with_cache(out.tokens)
    assert_cache_equal(out.cache, expected)


def test_generate_steps_records_each_steps_patterns_at_that_step():
    model = family_model("llama")
    attn_calls = _counting(model.blocks[0].attn)
    steps = list(model.generate_steps(prompt(model, 2, 4), 3, stop_at_eos=False))
    assert attn_calls == [4, 1, 1]  # each step's cache is whole when the step is yielded
    assert all("blocks.0.attn.hook_pattern" in step.cache for step in steps)


# ---------------------------------------------------------------- room for the cache
def test_a_cache_that_will_not_fit_is_refused_after_the_prompt(monkeypatch):
    from hookedattn.core.generation import _recording

    model = family_model("llama")
    forwards = []
    model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: forwards.append(x.shape[1]))
    monkeypatch.setattr(_recording, "free_memory", lambda device: 2**10)  # a device of 1 KiB
    try:
        with pytest.raises(ValueError, match=r"would take about .* GB, .* GB free .*names_filter"):
            model.generate(prompt(model, 2, 4), 10, stop_at_eos=False, return_cache=True)
    finally:
        model.reset_hooks(including_permanent=True)
    assert forwards == [4]  # the prompt only: no step ran


@pytest.mark.parametrize("name", ["family llama", "variant split-inputs"])
def test_the_projected_size_is_the_size_of_the_cache(name, monkeypatch):
    from hookedattn.core.generation import _recording

    model = recording_model(name)
    projected = []
    original = _recording.StepRecorder.check_room

    def check_room(self, n_first, n_total, device):
        projected.append(self.projected_bytes(n_first, n_total)[0])
        original(self, n_first, n_total, device)

    monkeypatch.setattr(_recording.StepRecorder, "check_room", check_room)
    out = model.generate(prompt(model, 2, 4), 6, stop_at_eos=False, return_cache=True)
    actual = sum(t.numel() * t.element_size() for t in out.cache.values())
    assert projected == [pytest.approx(actual, rel=1e-9)]
