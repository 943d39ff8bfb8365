"""TransformerLens's toy-model variants (shortformer positions, SoLU-LN MLPs), run by TL itself.

Run as a program with real TransformerLens (in its own environment):

    python scripts/tl_toy_variants.py IN.pt OUT.pt

IN.pt holds `{"runs": {name: {"config", "seed", "tokens", "prefix"}}}`. For each run it
builds `transformer_lens.HookedTransformer(HookedTransformerConfig(**config))`, draws every
parameter at random here (seeded; gains around 1, so that every term of every sum matters),
and writes to OUT.pt, per run: the state dict; `run_with_cache(tokens)` (logits and every
cached activation); the logits of the last position of a KV-cache run, `tokens[:, :prefix]`
then one token at a time (so that the positions at decode are TL's); and the same state
dict, logits and cache after the weight processing that TL's `from_pretrained` applies for
this config (`process_weights_` with its flags: for a shortformer model `fold_ln`,
`center_writing_weights` and `center_unembed` are turned off there, as TL's
`from_pretrained` turns them off). tests/core/test_toy_variants.py runs it so, and holds
hookedattn's model, loaded from those state dicts, against the results.
"""

import importlib.metadata
import sys
from typing import Any

import torch


def from_pretrained_flags(config: dict) -> dict[str, bool]:
    """The processing flags TL 3.5.1's `from_pretrained` passes on for this config (its
    defaults, with the three it turns off for a shortformer model)."""
    on = config.get("positional_embedding_type") != "shortformer"
    return dict(fold_ln=on, center_writing_weights=on, center_unembed=on)


def random_state(model: Any, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter of `model` drawn at random (its buffers kept)."""
    generator = torch.Generator().manual_seed(seed)
    state = model.state_dict()
    for name, parameter in model.named_parameters():
        drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
        state[name] = (drawn * 0.3 + name.endswith(".w")).to(parameter.dtype)
    return state


def _parameters(model: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _cached(model: Any, tokens: torch.Tensor) -> dict[str, Any]:
    logits, cache = model.run_with_cache(tokens)
    return {"logits": logits, "cache": dict(cache.cache_dict)}


def _decoded(tl: Any, model: Any, tokens: torch.Tensor, prefix: int) -> torch.Tensor:
    """The last logits of each step of a KV-cache run: the prefix, then one token at a time."""
    batch = tokens.shape[0]
    cache = tl.TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch)

    def step(chunk: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(chunk.shape, dtype=torch.long)  # as scripts/tl_probes.py passes it
        return model(chunk, past_kv_cache=cache, attention_mask=mask)[:, -1]

    steps = [step(tokens[:, :prefix])]
    steps += [step(tokens[:, p : p + 1]) for p in range(prefix, tokens.shape[1])]
    return torch.stack(steps, dim=1)


def run(tl: Any, config: dict, seed: int, tokens: torch.Tensor, prefix: int) -> dict[str, Any]:
    """One variant: raw and processed weights, each with its logits and cache."""
    model = tl.HookedTransformer(tl.HookedTransformerConfig(**config))
    model.load_state_dict(random_state(model, seed))
    model.eval()
    out: dict[str, Any] = {"raw": {"state": _parameters(model), **_cached(model, tokens)}}
    out["raw"]["decoded"] = _decoded(tl, model, tokens, prefix)
    flags = from_pretrained_flags(config)
    model.process_weights_(**flags)
    out["processed"] = {"state": _parameters(model), "flags": flags, **_cached(model, tokens)}
    out["processed"]["normalization_type"] = model.cfg.normalization_type
    return out


def main() -> None:
    """`python scripts/tl_toy_variants.py IN.pt OUT.pt`, with TransformerLens importable."""
    import transformer_lens

    source, target = sys.argv[1], sys.argv[2]
    given = torch.load(source, weights_only=False)
    torch.set_grad_enabled(False)
    results = {
        name: run(transformer_lens, r["config"], r["seed"], r["tokens"], r["prefix"])
        for name, r in given["runs"].items()
    }
    version = importlib.metadata.version("transformer_lens")
    torch.save({"runs": results, "version": version}, target)


if __name__ == "__main__":
    main()
