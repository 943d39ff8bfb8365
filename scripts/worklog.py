"""The seed worklog, executable.

Every table the worklog prints ("Inside a Transformer: A Worklog", in ../shared/seed/) is
recomputed here with hookedattn rather than with loose matrices: a one-layer, one-head,
attention-only model with d_model = d_head = 8 holds the worklog's W_V and W_O, its X_IN
goes in as the residual stream, its random attention scores go in through a hook on
`hook_attn_scores`, and every intermediate is read back out of the cache. Then the
worklog's open questions are answered with numbers.

    python scripts/worklog.py [--json PATH]
"""

import argparse
import json
import math
from pathlib import Path

import torch
from einops import einsum, rearrange

from hookedattn import HookedTransformer, HookedTransformerConfig, KeyValueCache
from hookedattn.testing import tiny_model

SEED_TABLES = Path(__file__).parent / "data" / "seed_worklog_tables.json"
TOKENS = ["The", "cat", "sat"]


def seed_tensors() -> dict[str, torch.Tensor]:
    """The worklog's random tensors, regenerated exactly as it made them."""
    torch.manual_seed(42)
    scores = torch.randn(3, 3)
    torch.manual_seed(42)
    x_in, w_v, w_o = torch.randn(3, 8), torch.randn(8, 8), torch.randn(8, 8)
    return {"scores": scores, "X_IN": x_in, "W_V": w_v, "W_O": w_o}


def sublayer_model(d_model: int, n_heads: int, d_vocab: int, **extra) -> HookedTransformer:
    """One attention layer of heads 8 wide, no norm, no positional embedding, no MLP: the
    worklog's sub-layer alone (its input goes in as the residual stream)."""
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=d_model, n_heads=n_heads, d_head=8, n_ctx=8, d_vocab=d_vocab,
        attn_only=True, normalization_type=None, positional_embedding_type="none", seed=0,
        **extra,
    )  # fmt: skip
    return HookedTransformer(cfg)


def seed_model(w_v: torch.Tensor, w_o: torch.Tensor) -> HookedTransformer:
    """The sub-layer with one head, holding the worklog's W_V and W_O."""
    model = sublayer_model(d_model=8, n_heads=1, d_vocab=3)
    with torch.no_grad():
        model.blocks[0].attn.W_V.copy_(w_v[None])
        model.blocks[0].attn.W_O.copy_(w_o[None])
        for bias in ("b_Q", "b_K", "b_V", "b_O"):
            getattr(model.blocks[0].attn, bias).zero_()
    return model


def run_seed(model: HookedTransformer, seed: dict[str, torch.Tensor]):
    """Feed X_IN as the residual stream and the worklog's scores through the hook."""
    causal = torch.triu(torch.ones(3, 3, dtype=torch.bool), 1)
    # The worklog masks its random scores, then divides by sqrt(4) (its `q_last_layer`),
    # not by sqrt(d_head): hook_attn_scores holds exactly what enters the softmax.
    replaced = seed["scores"].masked_fill(causal, -math.inf) / math.sqrt(4)

    def use_seed_scores(scores, hook):
        return rearrange(replaced, "query_pos key_pos -> 1 1 query_pos key_pos").to(scores.dtype)

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", use_seed_scores)]):
        _, cache = model.run_with_cache(seed["X_IN"][None], start_at_layer=0)
    return cache


def computed_tables(model: HookedTransformer, cache, seed) -> dict[str, torch.Tensor]:
    """The worklog's tables, as read from the cache."""
    return {
        "attn_scores": seed["scores"],
        # hook_attn_scores holds masked scores / sqrt(4); the worklog prints them unscaled.
        "attn_scores_w_causal_mask": cache["attn_scores", 0][0, 0] * math.sqrt(4),
        "attn_w": cache["pattern", 0][0, 0],
        "W_V": model.W_V[0, 0],
        "V": cache["v", 0][0, :, 0],
        "attended": cache["z", 0][0, :, 0],
        "output_projection": cache["attn_out", 0][0],
        "residual_stream": cache["resid_post", 0][0],
    }


def compare(name: str, ours: torch.Tensor, theirs: list) -> float:
    """Print our table beside the worklog's; return the largest difference."""
    theirs = torch.tensor([[float(v) for v in row] for row in theirs])
    finite = torch.isfinite(theirs)
    same_infs = torch.equal(torch.isinf(ours), ~finite)
    diff = (ours[finite] - theirs[finite]).abs().max().item() if same_infs else math.inf
    print(f"\n{name}  (max |ours - worklog| = {diff:.1e})")
    for row_ours, row_theirs in zip(ours.tolist(), theirs.tolist(), strict=True):
        left = " ".join(f"{v:8.4f}" for v in row_ours)
        right = " ".join(f"{v:8.4f}" for v in row_theirs)
        print(f"  ours [{left}]   worklog [{right}]")
    return diff


def parallel_equals_sequential() -> float:
    """Running all positions at once equals running them one at a time (KV cache)."""
    # Two layers with MLPs (TINY_CONFIG's), d_model 32: the worklog's width.
    model = tiny_model(0, d_model=32, n_ctx=8, d_vocab=10, dtype=torch.float32)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 32)
    parallel = model(x, start_at_layer=0)
    past = KeyValueCache.empty(model.cfg, batch=1)
    steps = [model(x[:, [i]], start_at_layer=0, past_kv_cache=past) for i in range(3)]
    sequential = torch.cat(steps, dim=1)
    diff = (parallel - sequential).abs().max().item()
    print("\nQ2. What happens in parallel, what in sequence?")
    print("  Every position of a layer is computed at once: position i only reads keys and values")
    print("  of positions <= i (the causal mask), so the same numbers come out when the tokens")
    print("  are run one at a time, each reading the keys/values cached from earlier steps.")
    print(f"  2-layer model, 3 tokens: max |parallel - one at a time| over all logits = {diff:.1e}")
    print("  What is sequential is the layers: block 1 reads what block 0 wrote.")
    return diff


def output_projection_answers() -> dict[str, float]:
    """Concatenate-then-W_O equals the sum of each head's write; W_OV does it in one step."""
    # The worklog's first section: d_model 32, d_head 8, 4 heads, 3 tokens.
    batch, seqlen, d_model, d_head = 1, 3, 32, 8
    heads = d_model // d_head
    model = sublayer_model(d_model, heads, d_vocab=10, use_attn_result=True)
    torch.manual_seed(0)
    x = torch.randn(batch, seqlen, d_model)
    _, cache = model.run_with_cache(x, start_at_layer=0)
    attn, z, pattern = model.blocks[0].attn, cache["z", 0], cache["pattern", 0]
    # The worklog's recipe: concatenate the heads, then one [32, 32] output matrix.
    concatenated = rearrange(z, "batch pos head d_head -> batch pos (head d_head)")
    w_o_full = rearrange(attn.W_O, "head d_head d_model -> (head d_head) d_model")
    worklog_out = concatenated @ w_o_full + attn.b_O
    per_head_sum = cache["result", 0].sum(dim=2) + attn.b_O
    # The OV circuit: each head's write is pattern @ x @ (W_V W_O), plus the value bias term.
    w_ov = attn.W_V @ attn.W_O  # [head d_model d_model]
    moved = einsum(
        pattern, x, w_ov,
        "batch head query_pos key_pos, batch key_pos d_in, head d_in d_out "
        "-> batch query_pos head d_out",
    )  # fmt: skip
    bias_term = einsum(attn.b_V, attn.W_O, "head d_head, head d_head d_model -> head d_model")
    ov_result = moved + bias_term  # pattern rows sum to 1, so b_V passes through unweighted
    out = {
        "concat_vs_sum_of_heads": (worklog_out - cache["attn_out", 0]).abs().max().item(),
        "sum_of_head_results_vs_attn_out": (per_head_sum - cache["attn_out", 0]).abs().max().item(),
        "w_ov_vs_head_results": (ov_result - cache["result", 0]).abs().max().item(),
        "rank_w_ov": int(torch.linalg.matrix_rank(w_ov[0].detach()).item()),
    }
    print("\nQ3. Why is there an output projection?")
    print(
        f"  Each of the {heads} heads reads a {d_head}-dim summary (z) of what it attends to; W_O"
    )
    print("  writes it back into the 32-dim residual stream. Concatenating the heads and")
    print("  multiplying by one [32, 32] W_O is the same as each head writing z_h @ W_O[h]:")
    print(f"    max |concat @ W_O - attn_out|              = {out['concat_vs_sum_of_heads']:.1e}")
    summed = out["sum_of_head_results_vs_attn_out"]
    print(f"    max |sum_h z_h @ W_O[h] + b_O - attn_out|  = {summed:.1e}")
    print("  and W_OV = W_V @ W_O moves each head's information in one step:")
    print(f"    max |A_h x W_OV[h] (+ b_V W_O) - result_h| = {out['w_ov_vs_head_results']:.1e}")
    print(f"  W_OV is 32x32 but has rank {out['rank_w_ov']} (= d_head): a head can only move a")
    print(
        "  d_head-dimensional subspace of what it reads; W_O chooses where in the stream it lands."
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write every computed number here")
    args = parser.parse_args()

    seed = seed_tensors()
    model = seed_model(seed["W_V"], seed["W_O"])
    cache = run_seed(model, seed)
    ours = computed_tables(model, cache, seed)
    worklog = json.loads(SEED_TABLES.read_text())
    print("The seed worklog's tables, recomputed with hookedattn (ours beside the worklog's):")
    diffs = {name: compare(name, ours[name], worklog[name]) for name in ours}

    pattern = ours["attn_w"]
    print('\nQ1. What is the attention weight telling us?  Row "sat" of the pattern:')
    for j, token in enumerate(TOKENS):
        print(f'  "sat" reads {pattern[2, j].item():.4f} of its update from "{token}"')
    print("  Each row is a probability distribution over earlier positions: how much of each")
    print("  position's value vector (x W_V) the head copies into this position. The QK circuit")
    print("  decides the weights; the OV circuit decides what is copied.")

    sequential_diff = parallel_equals_sequential()
    projection = output_projection_answers()
    if args.json:
        result = {
            "tables": {name: t.tolist() for name, t in ours.items()},
            "max_abs_diff_vs_worklog": diffs,
            "sat_attention": pattern[2].tolist(),
            "parallel_vs_sequential_max_abs_diff": sequential_diff,
            "output_projection": projection,
        }
        args.json.write_text(json.dumps(result, indent=1, allow_nan=True))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    with torch.no_grad():
        main()
