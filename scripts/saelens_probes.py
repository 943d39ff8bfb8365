"""SAELens 6's `HookedSAETransformer` workflow, for a by-value comparison with hookedattn_tl's.

`probes(api, given)` is SAELens code: `api` answers `HookedSAETransformer`,
`HookedTransformerConfig` and `sae(spec)` (an SAE from a spec: `kind` "standard" or "topk",
`d_in`, `d_sae`, `k`, `hook_name`, `reshape_activations`, and SAELens's four weights), either
with SAELens and TransformerLens themselves or with `hookedattn_tl` and `hookedattn.sae`.
On one model (TL's config and state dict) and tokens it records: the logits and the whole
cache of `run_with_cache_with_saes` with and without the error term, `run_with_saes`, an
ablated feature through `run_with_hooks` on a permanently added SAE (with the error term),
`acts_to_saes` as SAEs are added, replaced and reset, the `saes()` context manager, and the
logits after `reset_saes`.

Run as a program with real SAELens (in its own environment, `.ci/saelens.sh`):

    python scripts/saelens_probes.py IN.pt OUT.pt

reads `{"config", "weights", "tokens", "saes"}` from IN.pt and writes the probes' results
and the SAELens version to OUT.pt. tests/tl/test_tl_sae_transformer.py runs it so, and the
same probes on hookedattn_tl.
"""

import importlib.metadata
import sys
from types import SimpleNamespace
from typing import Any

import torch


@torch.no_grad()
def probes(api: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The named results of the SAELens workflow on one model (module docstring)."""
    model = api.HookedSAETransformer(api.HookedTransformerConfig(**given["config"]))
    model.load_state_dict(given["weights"], strict=False)
    model.eval()
    tokens = given["tokens"]
    saes = [api.sae(spec) for spec in given["saes"]]
    out: dict[str, Any] = {"clean": model(tokens)}
    for use_error_term in (False, True):
        logits, cache = model.run_with_cache_with_saes(
            tokens, saes=saes, use_error_term=use_error_term
        )
        out[f"logits/error={use_error_term}"] = logits
        out[f"cache/error={use_error_term}"] = dict(cache.items())
    out["run_with_saes"] = model.run_with_saes(tokens, saes=[saes[0]])
    out["acts_to_saes/after_runs"] = sorted(model.acts_to_saes)

    # A permanently added SAE with the error term: zeroing a feature changes the output by
    # exactly that feature's write.
    first = given["saes"][0]["hook_name"]
    model.add_sae(saes[0], use_error_term=True)
    out["added/logits"] = model(tokens)

    def ablate(acts: torch.Tensor, hook: Any) -> torch.Tensor:
        acts = acts.clone()
        acts[..., :3] = 0.0
        return acts

    hook = (f"{first}.hook_sae_acts_post", ablate)
    out["added/ablated"] = model.run_with_hooks(tokens, fwd_hooks=[hook])
    model.add_sae(saes[1])
    out["acts_to_saes/added"] = sorted(model.acts_to_saes)
    with model.saes(saes=[saes[2]]):
        out["context/logits"] = model(tokens)
        out["acts_to_saes/context"] = sorted(model.acts_to_saes)
    out["acts_to_saes/after_context"] = sorted(model.acts_to_saes)
    out["after_context/logits"] = model(tokens)
    model.reset_saes(first)
    out["acts_to_saes/reset_one"] = sorted(model.acts_to_saes)
    model.reset_saes()
    out["acts_to_saes/reset"] = sorted(model.acts_to_saes)
    out["reset/logits"] = model(tokens)
    return out


def saelens_api() -> Any:
    """SAELens's and TransformerLens's classes, and `sae(spec)` building SAELens's SAEs."""
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata
    from transformer_lens import HookedTransformerConfig

    def sae(spec: dict[str, Any]) -> Any:
        common = dict(
            d_in=spec["d_in"],
            d_sae=spec["d_sae"],
            reshape_activations=spec["reshape_activations"],
            metadata=SAEMetadata(hook_name=spec["hook_name"]),
        )
        if spec["kind"] == "topk":
            built = sae_lens.TopKSAE(sae_lens.TopKSAEConfig(k=spec["k"], **common))
        else:
            built = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(**common))
        built.load_state_dict(spec["weights"])
        return built

    return SimpleNamespace(
        HookedSAETransformer=sae_lens.HookedSAETransformer,
        HookedTransformerConfig=HookedTransformerConfig,
        sae=sae,
    )


def hookedattn_api() -> Any:
    """hookedattn_tl's classes, and `sae(spec)` building `hookedattn.sae` SAEs."""
    import hookedattn_tl
    from hookedattn.sae import SAEConfig, SparseAutoencoder

    def sae(spec: dict[str, Any]) -> Any:
        topk = spec["kind"] == "topk"
        cfg = SAEConfig(
            spec["d_in"],
            spec["d_sae"],
            spec["hook_name"],
            activation="topk" if topk else "relu",
            k=spec["k"] if topk else None,
            reshape_activations=spec["reshape_activations"],
        )
        built = SparseAutoencoder(cfg)
        built.load_state_dict(spec["weights"])
        return built

    return SimpleNamespace(
        HookedSAETransformer=hookedattn_tl.HookedSAETransformer,
        HookedTransformerConfig=hookedattn_tl.HookedTransformerConfig,
        sae=sae,
    )


def main() -> None:
    """`python scripts/saelens_probes.py IN.pt OUT.pt`, with real SAELens importable."""
    source, target = sys.argv[1], sys.argv[2]
    given = torch.load(source, weights_only=False)
    results = {"probes": probes(saelens_api(), given)}
    results["version"] = importlib.metadata.version("sae_lens")
    torch.save(results, target)


if __name__ == "__main__":
    main()
