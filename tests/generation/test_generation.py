"""Generation with a KV cache, against full forwards over the whole sequence.

The independent reference is a plain loop written here: run the whole sequence through the
forward, take the argmax of the last position, append, repeat (no KV cache, no padding).
"""

import math

import pytest
import torch

from hookedattn import ByteTokenizer, HookedTransformer, HookedTransformerConfig, KeyValueCache
from hookedattn.core.generation import (
    Generated,
    GenerationOptions,
    Sampling,
    generation_steps,
    next_token_probs,
    prompt_of,
)
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import tiny_model

TOL = tolerance(torch.float64).as_kwargs()


def make_model(**overrides):
    base = dict(n_heads=2, n_ctx=32, d_vocab=259, d_mlp=32, init_range=0.5)
    return tiny_model(1, tokenizer=ByteTokenizer(), **{**base, **overrides})


VARIANTS = {
    "learned positions": {},
    "rotary, attention only": dict(positional_embedding_type="rotary", attn_only=True),
}


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def model(request):
    return make_model(**VARIANTS[request.param])


@pytest.fixture(scope="module")
def plain_model():
    return make_model()


PROMPTS = [[256, 104, 101, 108, 108, 111], [256, 104, 105], [256, 120, 121, 122, 33]]


def left_padded(prompts, pad=258):
    length = max(len(p) for p in prompts)
    tokens = torch.tensor([[pad] * (length - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts])
    return tokens, mask


def greedy_reference(model, prompt, n_new):
    """The whole sequence through the forward at every step; argmax of the last position."""
    tokens = list(prompt)
    for _ in range(n_new):
        tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    return tokens[len(prompt) :]


def steps_of(model, tokens, mask=None, **options):
    """The steps of the generation loop; rows end only at `eos_token_id`, if given."""
    options.setdefault("stop_at_eos", "eos_token_id" in options)
    prompt = prompt_of(model, tokens, mask, None)
    return prompt, generation_steps(model, prompt, GenerationOptions(**options))


def generate_tokens(model, tokens, mask, **options):
    """Every step of the generation loop, assembled with its prompt (padding: 258, the byte
    tokenizer's)."""
    return Generated.from_steps(*steps_of(model, tokens, mask, **options))


# ---------------------------------------------------------------- equivalences
def test_greedy_with_kv_cache_equals_without(model):
    tokens, mask = left_padded(PROMPTS)
    with_cache = generate_tokens(model, tokens, mask, max_new_tokens=8)
    without = generate_tokens(model, tokens, mask, max_new_tokens=8, use_past_kv_cache=False)
    assert torch.equal(with_cache.tokens, without.tokens)
    assert torch.equal(with_cache.attention_mask, without.attention_mask)


def test_padded_batch_generates_what_each_prompt_generates_alone(model):
    tokens, mask = left_padded(PROMPTS)
    out = generate_tokens(model, tokens, mask, max_new_tokens=8)
    for row, prompt in enumerate(PROMPTS):
        assert out.tokens[row, -8:].tolist() == greedy_reference(model, prompt, 8)


def test_each_kv_cache_step_has_the_logits_of_a_full_forward(model):
    tokens, mask = left_padded(PROMPTS)
    steps = list(steps_of(model, tokens, mask, max_new_tokens=6)[1])
    full_tokens = torch.cat([tokens, *[s.tokens[:, None] for s in steps]], dim=1)
    full_mask = torch.cat([mask, torch.ones(len(PROMPTS), len(steps), dtype=torch.long)], dim=1)
    full = model(full_tokens, attention_mask=full_mask)
    n_prompt = tokens.shape[1]
    for i, step in enumerate(steps):
        torch.testing.assert_close(step.logits, full[:, n_prompt - 1 + i], **TOL)


def test_parallel_forward_equals_token_by_token(model):
    """The seed's "what is parallel, what is sequential": one forward over all positions
    computes what running them one at a time, each reading the cached keys and values of
    the positions before it, computes."""
    tokens = torch.tensor([PROMPTS[0]])
    parallel = model(tokens)
    cache = KeyValueCache.empty(model.cfg, batch=1)
    one_by_one = torch.cat([model(tokens[:, i : i + 1], past_kv_cache=cache) for i in range(6)], 1)
    torch.testing.assert_close(one_by_one, parallel, **TOL)


def test_run_with_cache_after_a_kv_cache_records_only_the_new_positions(plain_model):
    tokens = torch.tensor([PROMPTS[0]])
    _, full = plain_model.run_with_cache(tokens)
    kv = KeyValueCache.empty(plain_model.cfg, batch=1)
    plain_model(tokens[:, :4], past_kv_cache=kv)
    _, new = plain_model.run_with_cache(tokens[:, 4:], past_kv_cache=kv)
    assert new["resid_post", 1].shape == (1, 2, 16)
    assert new["pattern", 0].shape == (1, 2, 2, 6)  # new queries, all keys
    for name in new:
        expected = (
            full[name][:, :, 4:] if name.endswith(("pattern", "scores")) else full[name][:, 4:]
        )
        torch.testing.assert_close(new[name], expected, **TOL, msg=name)


def test_strings_continue_a_kv_cache_without_a_second_bos(plain_model):
    kv = KeyValueCache.empty(plain_model.cfg, batch=1)
    plain_model("he", past_kv_cache=kv)
    continued = plain_model("llo", past_kv_cache=kv)
    torch.testing.assert_close(continued, plain_model("hello")[:, 3:], **TOL)


# ---------------------------------------------------------------- hooks
def push_towards(direction):
    def hook(resid, hook):
        return resid + direction

    return hook


def test_a_hook_on_resid_post_changes_what_is_generated(plain_model):
    direction = 3 * plain_model.W_E[ord("z")]
    hooks = [("blocks.0.hook_resid_post", push_towards(direction))]
    prompt = torch.tensor([PROMPTS[1]])
    plain = plain_model.generate(prompt, 6, stop_at_eos=False)
    with plain_model.hooks(fwd_hooks=hooks):
        hooked = plain_model.generate(prompt, 6, stop_at_eos=False)
        reference = greedy_reference(plain_model, PROMPTS[1], 6)  # hooked too
    assert hooked[0, -6:].tolist() == reference
    assert not torch.equal(hooked, plain)


def test_hooks_see_every_generation_step(plain_model):
    shapes = []
    hooks = [("blocks.0.hook_resid_post", lambda x, hook: shapes.append(x.shape[1]))]
    with plain_model.hooks(fwd_hooks=hooks):
        plain_model.generate(torch.tensor([PROMPTS[1]]), 4, stop_at_eos=False)
    assert shapes == [3, 1, 1, 1]  # the prompt once, then one new position per step


@pytest.mark.parametrize("name", ["ln_final.hook_out", "unembed.hook_in", "unembed.hook_out"])
def test_a_hook_after_the_blocks_sees_every_prompt_position(plain_model, name):
    # Unhooked, generation unembeds only each row's last position; a hook there must
    # still see the whole forward, as everywhere else.
    shapes = []
    with plain_model.hooks(fwd_hooks=[(name, lambda x, hook: shapes.append(x.shape[1]))]):
        hooked = plain_model.generate(torch.tensor([PROMPTS[1]]), 3, stop_at_eos=False)
    assert shapes == [3, 1, 1]
    assert torch.equal(
        hooked, plain_model.generate(torch.tensor([PROMPTS[1]]), 3, stop_at_eos=False)
    )


# ---------------------------------------------------------------- stopping
def test_stop_at_eos_pads_finished_sequences_and_stops_when_all_are(plain_model):
    expected = {row: greedy_reference(plain_model, p, 8) for row, p in enumerate(PROMPTS[:2])}
    eos = expected[0][2]  # the third token row 0 generates
    tokens, mask = left_padded(PROMPTS[:2])
    out = generate_tokens(plain_model, tokens, mask, max_new_tokens=8, eos_token_id=[eos])
    for row in range(2):
        new = out.tokens[row, tokens.shape[1] :].tolist()
        new_mask = out.attention_mask[row, tokens.shape[1] :].tolist()
        stop = expected[row].index(eos) + 1 if eos in expected[row] else 8
        assert new[:stop] == expected[row][:stop]
        assert new[stop:] == [258] * (len(new) - stop)
        assert new_mask == [1] * stop + [0] * (len(new) - stop)
    finished_at = [expected[r].index(eos) + 1 if eos in expected[r] else 8 for r in range(2)]
    assert out.n_new == max(finished_at)


@pytest.mark.parametrize("use_past_kv_cache", [True, False])
def test_a_row_that_finishes_first_pads_an_unpadded_batch(model, use_past_kv_cache):
    # Without padding in the prompt the steps run without a mask until a row finishes.
    prompts = [[256, 104, 101], [256, 120, 121]]
    expected = [greedy_reference(model, p, 8) for p in prompts]
    eos = next(t for t in expected[0] if t not in expected[1])  # row 0 stops, row 1 not
    out = generate_tokens(
        model, torch.tensor(prompts), None, max_new_tokens=8, eos_token_id=[eos],
        use_past_kv_cache=use_past_kv_cache,
    )  # fmt: skip
    stop = expected[0].index(eos) + 1
    assert out.tokens[0, 3:].tolist() == expected[0][:stop] + [258] * (8 - stop)
    assert out.attention_mask[0, 3:].tolist() == [1] * stop + [0] * (8 - stop)
    assert out.tokens[1, 3:].tolist() == expected[1]


def test_generate_stops_at_the_tokenizers_eos(plain_model):
    eos = ByteTokenizer().eos_token_id
    direction = 50 * plain_model.W_U[:, eos]  # make EOS the only likely token

    def force_eos(resid, hook):
        return resid + direction

    with plain_model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", force_eos)]):
        out = plain_model.generate(torch.tensor([PROMPTS[1]]), 5)
    assert out[0].tolist() == PROMPTS[1] + [eos]


# ---------------------------------------------------------------- sampling
def probs_reference(logits, temperature, top_k, top_p):
    """Row by row: sort, keep the top k, softmax with temperature, keep the nucleus."""
    out = torch.zeros_like(logits)
    for row, values in enumerate(logits.tolist()):
        order = sorted(range(len(values)), key=lambda i: -values[i])
        kept = order[: top_k or len(values)]
        weights = torch.tensor([values[i] / temperature for i in kept], dtype=torch.float64)
        weights = weights.softmax(0).tolist()
        if top_p is not None:
            total, nucleus = 0.0, []
            for i, w in zip(kept, weights, strict=True):
                if total >= top_p:
                    break
                nucleus.append((i, w))
                total += w
            kept, weights = [i for i, _ in nucleus], [w / total for _, w in nucleus]
        for i, w in zip(kept, weights, strict=True):
            out[row, i] = w
    return out


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, None, None), (0.5, None, None), (2.0, 5, None), (1.0, None, 0.5), (0.7, 10, 0.8)],
)
def test_sampling_distribution_equals_a_brute_force_one(temperature, top_k, top_p):
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probs = next_token_probs(logits, Sampling(True, temperature, top_k, top_p))
    torch.testing.assert_close(probs, probs_reference(logits, temperature, top_k, top_p), **TOL)


@pytest.mark.parametrize("settings", [dict(top_k=1), dict(temperature=0.0), dict(top_p=1e-9)])
def test_sampling_that_leaves_one_choice_is_greedy(plain_model, settings):
    prompt = torch.tensor([PROMPTS[0]])
    greedy = plain_model.generate(prompt, 6, stop_at_eos=False)
    sampled = plain_model.generate(prompt, 6, stop_at_eos=False, do_sample=True, **settings)
    assert torch.equal(sampled, greedy)


def test_sampling_with_a_seeded_generator_is_reproducible(plain_model):
    def run(seed):
        return plain_model.generate(
            torch.tensor([PROMPTS[0]]), 6, stop_at_eos=False, do_sample=True, temperature=2.0,
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip

    assert torch.equal(run(3), run(3))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("temperature", -0.5),
        ("temperature", math.inf),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", math.nan),
    ],
)
def test_sampling_settings_out_of_range_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"{field} must be"):
        Sampling(do_sample=True, **{field: value})


def test_generate_refuses_a_nan_temperature_before_running():
    model = tiny_model(n_layers=1, d_model=8, n_heads=2, n_ctx=8, d_vocab=10, d_mlp=8)
    with pytest.raises(ValueError, match="temperature must be a number >= 0 and finite"):
        model.generate(
            torch.tensor([[1, 2]]), max_new_tokens=2, do_sample=True, temperature=math.nan
        )


def test_a_zero_temperature_still_means_greedy():
    assert Sampling(do_sample=True, temperature=0.0).greedy


# ---------------------------------------------------------------- text in, text out
def test_generate_from_a_string_returns_the_prompt_and_its_continuation(plain_model):
    text = plain_model.generate("hi", 4, stop_at_eos=False)
    expected = greedy_reference(plain_model, PROMPTS[1], 4)
    assert text == ByteTokenizer().decode([104, 105, *expected], skip_special_tokens=True)


def test_generate_from_strings_left_pads_them(plain_model):
    texts = plain_model.generate(["hello", "hi"], 4, stop_at_eos=False)
    assert texts == [plain_model.generate(t, 4, stop_at_eos=False) for t in ["hello", "hi"]]
    tokens = plain_model.generate(["hello", "hi"], 4, stop_at_eos=False, return_type="tokens")
    assert tokens[1, :6].tolist() == [258, 258, 258, 256, 104, 105]  # padding, BOS, "hi"


# ---------------------------------------------------------------- bad input
def test_max_new_tokens_past_n_ctx_is_refused_before_running(plain_model):
    with pytest.raises(ValueError, match="at most 26 new tokens fit"):
        plain_model.generate(torch.tensor([PROMPTS[0]]), 27, stop_at_eos=False)


def test_right_padding_is_refused_for_generation(plain_model):
    tokens = torch.tensor([[256, 104, 258], [256, 104, 105]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match=r"rows \[0\] end in padding: generation needs left"):
        plain_model.generate(tokens, 2, attention_mask=mask, stop_at_eos=False)


def test_stop_at_eos_needs_an_eos_token():
    model = HookedTransformer(
        HookedTransformerConfig(n_layers=1, d_model=8, n_heads=2, n_ctx=8, d_vocab=10, d_mlp=8)
    )
    with pytest.raises(ValueError, match="pass eos_token_id=, or stop_at_eos=False"):
        model.generate(torch.tensor([[1, 2]]), 2)
    assert model.generate(torch.tensor([[1, 2]]), 2, stop_at_eos=False).shape == (1, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_new_tokens=-1), "max_new_tokens must be >= 0"),
        (dict(temperature=-1.0), "temperature must be a number >= 0"),
        (dict(top_p=1.5), "top_p must be in"),
        (dict(top_k=0), "top_k must be an int >= 1"),
        (dict(return_type="logits"), "return_type must be 'input', 'str' or 'tokens'"),
    ],
)
def test_bad_generation_arguments(plain_model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plain_model.generate(torch.tensor([PROMPTS[0]]), **{"max_new_tokens": 2, **kwargs})


@pytest.mark.parametrize("eos", [259, -1, [5, 300]])
def test_an_eos_token_outside_the_vocabulary_is_refused(plain_model, eos):
    with pytest.raises(ValueError, match=r"eos_token_id \[-?\d+\] is outside .*ids 0\.\.258"):
        plain_model.generate(torch.tensor([PROMPTS[1]]), 3, eos_token_id=eos)
