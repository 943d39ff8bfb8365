"""What TransformerLens 4's `TransformerBridge` computes on a saved model, for the comparison.

    python scripts/tl4_probes.py IN.pt OUT.pt

IN.pt holds `{"folder": a transformers save_pretrained folder, "text": [prompts]}`. For each
mode (`"raw"`: `boot_transformers` as it returns; `"compat"`: after
`enable_compatibility_mode()`) OUT.pt gets the tokens, the logits, every cached activation
by TL 4's names (canonical and alias), and the logits of two hooked runs by TL 4's names.
tests/tl/test_tl_bridge.py runs it in TL 4.3's environment and `probes` here with
hookedattn_tl after the alias line, and compares the two.
"""

import importlib.metadata
import sys
from typing import Any

import torch


def ablate_head(z: torch.Tensor, hook: Any) -> torch.Tensor:
    """Zero head 1 of the per-head attention output."""
    z = z.clone()
    z[:, :, 1] = 0.0
    return z


def probes(folder: str, text: list[str], names: list[str] | None = None) -> dict[str, Any]:
    """`{mode: {"tokens", "logits", "cache", "ablated", "patched"}}` for both modes; the
    cache read by `names` (those it has), or every name it lists."""
    from transformer_lens.model_bridge import TransformerBridge

    answer = {}
    for mode in ("raw", "compat"):
        bridge = TransformerBridge.boot_transformers(folder, device="cpu", dtype=torch.float32)
        if mode == "compat":
            bridge.enable_compatibility_mode(disable_warnings=True)
        tokens = bridge.to_tokens(text)
        logits, cache = bridge.run_with_cache(tokens)
        ablated = bridge.run_with_hooks(
            tokens, fwd_hooks=[("blocks.1.attn.o.hook_in", ablate_head)]
        )
        donor = cache["blocks.1.hook_in"].flip(0)

        def patch(resid: torch.Tensor, hook: Any, donor: torch.Tensor = donor) -> torch.Tensor:
            return donor

        patched = bridge.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_in", patch)])
        answer[mode] = {
            "tokens": tokens,
            "logits": logits.detach(),
            "cache": {
                name: cache[name].detach().clone()
                for name in (list(cache.keys()) if names is None else names)
                if name in cache
            },
            "ablated": ablated.detach(),
            "patched": patched.detach(),
        }
    return answer


def main() -> None:
    """`python scripts/tl4_probes.py IN.pt OUT.pt`, with TransformerLens 4 importable."""
    torch.set_num_threads(1)
    source, target = sys.argv[1], sys.argv[2]
    given = torch.load(source, weights_only=False)
    answer = probes(given["folder"], given["text"])
    answer["version"] = importlib.metadata.version("transformer_lens")
    torch.save(answer, target)


if __name__ == "__main__":
    main()
