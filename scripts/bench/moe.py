"""The mixture-of-experts row of `scripts/bench`: our forward against transformers' own on
the same weights.

An OLMoE-shaped model (many small experts, several per token, q/k norms) is built from
`transformers.OlmoeConfig` with random weights and imported with `from_hf`. The group's
reference is HF's eager forward (eager attention, and its eager experts: a loop over the
experts each token chose); HF's default forward (sdpa attention, `grouped_mm` experts) and
ours (idle hooks; caching the routing; caching everything; one hook on the chosen experts)
run in the same interleaved rounds, each checked against the reference's logits first.
"""

from typing import Any

import torch

from hookedattn import HookedTransformer

# OLMoE's shape, scaled down to run in seconds on a CPU: 32 experts of width 256, 4 a token.
FULL = dict(
    vocab_size=5000, hidden_size=512, intermediate_size=256, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=8, num_experts=32, num_experts_per_tok=4,
    max_position_embeddings=256,
)  # fmt: skip
QUICK = dict(
    vocab_size=50, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
    max_position_embeddings=32,
)  # fmt: skip
BATCH = {"full": (4, 128), "quick": (2, 16)}


def hf_olmoe(shape: dict, attention: str, experts: str) -> Any:
    """An OLMoE model of `shape` with random weights (seed 0) and the given implementations,
    or None without `transformers`."""
    try:
        import transformers
    except ImportError:
        return None
    config = transformers.OlmoeConfig(
        **shape, attn_implementation=attention, experts_implementation=experts,
        eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.OlmoeForCausalLM(config).eval()


def _routing(name: str) -> bool:
    return name.endswith(("hook_router_logits", "hook_expert_indices", "hook_expert_weights"))


def _noop(x: torch.Tensor, hook: Any) -> None:
    return None


def moe_section(run: Any, agrees: Any, hf_name: str, ours_name: str) -> None:
    """Time the group (module docstring) into `run`; skipped without `transformers`."""
    shape, (batch, pos) = (QUICK, BATCH["quick"]) if run.quick else (FULL, BATCH["full"])
    eager = hf_olmoe(shape, "eager", "eager")
    if eager is None:
        run.skip("moe", "mixture of experts", "transformers is not installed")
        return
    default = hf_olmoe(shape, "sdpa", "grouped_mm")
    default.load_state_dict(eager.state_dict())
    model = HookedTransformer.from_hf(eager)
    layers = model.cfg.n_layers
    description = (
        f"OLMoE-shaped: {layers}L d{model.cfg.d_model} {model.cfg.n_heads}h, "
        f"{model.cfg.num_experts} experts of d_mlp {model.cfg.d_mlp}, "
        f"{model.cfg.experts_per_token} a token, batch {batch}x{pos}"
    )
    print(f"moe [{description}]")
    run.extra.setdefault("moe_setting", description)
    tokens = torch.randint(0, shape["vocab_size"], (batch, pos),
                           generator=torch.Generator().manual_seed(1))  # fmt: skip
    chosen = f"blocks.{layers - 1}.mlp.hook_expert_indices"
    group = {
        ("forward, eager attention and experts", hf_name): lambda: eager(tokens).logits,
        ("forward, sdpa attention, grouped_mm experts", hf_name): lambda: default(tokens).logits,
        ("forward, no hooks attached", ours_name): lambda: model(tokens),
        ("run_with_cache, routing only", ours_name): lambda: model.run_with_cache(
            tokens, names_filter=_routing
        ),
        ("run_with_cache, everything", ours_name): lambda: model.run_with_cache(tokens),
        (f"one hook on {chosen}", ours_name): lambda: model.run_with_hooks(
            tokens, fwd_hooks=[(chosen, _noop)]
        ),
    }
    with torch.no_grad():
        reference = eager(tokens).logits
        for (measure, contender), fn in group.items():
            if not agrees(fn(), reference):
                raise AssertionError(f"{contender} {measure}: logits differ from HF's eager")
        run.time_group("moe", "moe", group)
