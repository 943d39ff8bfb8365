"""Greedy generation of a prompt both ways, with the KV cache and recomputing every step,
for the tests that check a variant's cache against its full forward."""

import torch

from hookedattn import HookedTransformer


def greedy_with_and_without_cache(
    model: HookedTransformer, prompt: torch.Tensor, max_new_tokens: int = 5
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens `model` generates greedily from `prompt` with its KV cache, and without."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, stop_at_eos=False)
    with_cache = model.generate(prompt, **kwargs)
    return with_cache, model.generate(prompt, use_past_kv_cache=False, **kwargs)


def greedy_ours_and_transformers(
    reference: torch.nn.Module, prompt: torch.Tensor, max_new_tokens: int = 8
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens our import of `reference` (a live `transformers` model) generates greedily
    from `prompt`, and those `reference.generate` does; neither stops at or avoids EOS."""
    ours = HookedTransformer.from_hf(reference)
    reference.generation_config.eos_token_id = None
    with torch.no_grad():
        expected = reference.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
    got = ours.generate(prompt, max_new_tokens=max_new_tokens, stop_at_eos=False)
    return got, expected
