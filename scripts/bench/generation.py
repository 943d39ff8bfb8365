"""Generation measures of `scripts/bench`: greedy decoding against the bare KV-cached
loop, with and without a KV cache, beside transformers' and TransformerLens's `generate`,
and the cost of `generate(..., return_cache=True)` against our generation without it."""

from collections.abc import Callable
from typing import Any

import torch
from hf import hf_generate, hf_gpt2
from reference import BareTransformer, build
from tl4 import transformer_lens_major
from torch import Tensor

from hookedattn import HookedTransformer

BARE, OURS, TL, HF = "bare", "hookedattn", "transformer_lens", "transformers"
TL_MAJOR = transformer_lens_major()  # 3: HookedTransformer; 4: TransformerBridge only


def generation_section(run: Any, key: str, n_new: int = 32, prompt: int = 16) -> None:
    """Greedy decoding against the bare KV-cached loop (with and without a KV cache), and
    the cost of `return_cache=True` against our own generation without it.

    `run.generation_groups` picks the groups ("kv", "uncached", "cache"), so that a busy
    machine can time them in separate runs. Uncached generation re-runs the whole sequence
    per token: at GPT-2's shape that is the forward section's row 32 times over (minutes
    of rounds), so it runs only at setting `a`.
    """
    setting = run.settings[key]
    n_new, prompt = (8, 4) if run.quick else (n_new, prompt)
    print(f"generation [{key}] greedy {n_new} tokens after {prompt}, batch 1")
    model, tokens = build(setting.cfg, setting.batch, setting.pos)
    tokens = tokens[:1, :prompt]
    bare = BareTransformer(model)
    groups = run.generation_groups
    with torch.no_grad():
        ref = bare.generate(tokens, n_new, use_cache=True)
        if not torch.equal(ref, bare.generate(tokens, n_new, use_cache=False)):
            raise AssertionError("the bare model's cached and uncached generations differ")
        tls = run.tl_models(model, bare(tokens), tokens) if groups - {"cache"} else {}
        modes = [(True, "KV cache")] if "kv" in groups else []
        modes += [(False, "no KV cache")] if "uncached" in groups and key == "a" else []
        for use_cache, label in modes:
            group = _toolkit_group(bare, model, tls, tokens, n_new, use_cache, label)
            _check_same_tokens(run, group, ref, key)
            run.time_group("generation", key, group)
        if "cache" in groups:
            run.time_group("generation", key, _cache_group(model, tokens, n_new, ref))


def _toolkit_group(
    bare: BareTransformer,
    model: HookedTransformer,
    tls: dict[str, Any],
    tokens: Tensor,
    n_new: int,
    use_cache: bool,
    label: str,
) -> dict:
    """The bare loop (the reference), ours, transformers' and TransformerLens's generate
    (`tls`: `{column: model}`)."""
    measure = f"greedy {n_new} tokens, {label}"
    group = {(measure, BARE): lambda: bare.generate(tokens, n_new, use_cache)}
    if use_cache:
        loop = f"{measure} (forward + KeyValueCache loop)"
        group[(loop, OURS)] = _our_kv_loop(model, tokens, n_new)
    group[(measure, OURS)] = _our_generate(model, tokens, n_new, use_cache)
    hf = hf_gpt2(model)
    if hf is not None:
        group[(measure, HF)] = hf_generate(hf, tokens, n_new, use_cache)
    for column, tl in tls.items():
        group[(measure, column)] = _tl_generate(tl, tokens, n_new, use_cache)
    return group


def _tl_generate(tl: Any, tokens: Tensor, n_new: int, use_cache: bool) -> Callable[[], Tensor]:
    return lambda: tl.generate(tokens, verbose=False, **_greedy(n_new, use_cache))


def _check_same_tokens(run: Any, group: dict, ref: Tensor, key: str) -> None:
    """Every contender must write the bare model's tokens: ours always; another toolkit
    whose float32 rounding picks another token at a near tie is left out, with a note."""
    for (measure, contender), fn in list(group.items()):
        if torch.equal(fn(), ref):
            continue
        if contender in (BARE, OURS):
            raise AssertionError(f"{contender} generates other tokens than the bare model")
        reason = "wrote other tokens than the bare model's (a near tie?)"
        if contender.startswith(TL) and TL_MAJOR and TL_MAJOR >= 4 and "KV cache" in measure:
            # Seen with TransformerLens 4.3 at the quick setting: the first token right, the
            # second wrong, in both modes; transformers' own KV cache on the same weights,
            # and the bridge without one, write the bare model's tokens.
            reason = "wrote other tokens than the bare model's (the bridge's KV cache)"
        run.skip("generation", f"{key}: {measure}: {contender}", reason)
        del group[(measure, contender)]


def _cache_group(model: HookedTransformer, tokens: Tensor, n_new: int, ref: Tensor) -> dict:
    """Our generation without a cache (the reference), and with `return_cache=True`: every
    hook point, and the residual stream only."""
    options = _greedy(n_new, True)
    resid = [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    group = {
        (f"greedy {n_new} tokens, KV cache", OURS): _our_generate(model, tokens, n_new, True),
        (f"greedy {n_new} tokens, return_cache=True (every hook point)", OURS): lambda: (
            model.generate(tokens, **options, return_cache=True).tokens
        ),
        (f"greedy {n_new} tokens, return_cache=True (resid_post only)", OURS): lambda: (
            model.generate(tokens, **options, return_cache=True, names_filter=resid).tokens
        ),
    }
    for (measure, _), fn in group.items():
        if not torch.equal(fn(), ref):
            raise AssertionError(f"hookedattn {measure}: other tokens than the bare model")
    return group


def _greedy(n_new: int, use_cache: bool) -> dict[str, Any]:
    """`generate`'s arguments, ours and TransformerLens's alike, for `n_new` greedy tokens."""
    return dict(
        max_new_tokens=n_new,
        do_sample=False,
        use_past_kv_cache=use_cache,
        stop_at_eos=False,
        return_type="tokens",
    )


def _our_generate(model: HookedTransformer, tokens: Tensor, n_new: int, use_cache: bool):
    return lambda: model.generate(tokens, **_greedy(n_new, use_cache))


def _our_kv_loop(model: HookedTransformer, tokens: Tensor, n_new: int) -> Callable[[], Tensor]:
    """Greedy decoding written directly against the core's forward and `KeyValueCache`."""
    from hookedattn import KeyValueCache

    def run() -> Tensor:
        cache = KeyValueCache.empty(model.cfg, tokens.shape[0])
        out, step = tokens, tokens
        for _ in range(n_new):
            step = model(step, past_kv_cache=cache)[:, -1:].argmax(-1)
            out = torch.cat([out, step], dim=1)
        return out

    return run
