"""The benchmark's settings (model shapes and batches, full and quick) and its targets.

Each target is on the median ratio of hookedattn's row to a reference timed in the same
rounds; `scripts/bench` measures them and `report.py` writes them out.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Setting:
    """A model shape and the batch it runs on; `name` says what the shape stands for."""

    key: str
    cfg: dict
    batch: int
    pos: int
    name: str = ""

    @property
    def description(self) -> str:
        """The shape and batch in a few words, read from the config: they cannot disagree."""
        c = self.cfg
        mlp = "attention only" if c.get("attn_only") else "MLP"
        shape = f"{c['n_layers']}L d{c['d_model']} {c['n_heads']}h vocab {c['d_vocab']}"
        size = f"{shape}, {mlp}, n_ctx {c['n_ctx']}, batch {self.batch}x{self.pos}"
        return f"{self.name}: {size}" if self.name else size


def _cfg(n_layers, d_model, n_heads, d_vocab, n_ctx, attn_only=False, act_fn="gelu") -> dict:
    mlp = {} if attn_only else {"d_mlp": 4 * d_model}
    return dict(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        attn_only=attn_only,
        act_fn=act_fn,
        normalization_type="LN",
        seed=0,
        **mlp,
    )


def _by_key(*settings: Setting) -> dict[str, Setting]:
    return {s.key: s for s in settings}


FULL = _by_key(
    Setting("a", _cfg(2, 256, 8, 5000, 128), 8, 128),
    Setting("b", _cfg(12, 768, 12, 50257, 1024, act_fn="gelu_new"), 4, 128, "GPT-2 small shape"),
    Setting("s64", _cfg(2, 64, 4, 100, 64), 8, 64),
    Setting("s512", _cfg(2, 512, 8, 5000, 256), 8, 256),
    Setting("long", _cfg(2, 256, 8, 5000, 2048), 4, 2048, "(a) at long context"),
)
QUICK = _by_key(
    Setting("a", _cfg(2, 32, 4, 50, 32), 2, 16, "tiny"),
    Setting("b", _cfg(3, 48, 4, 60, 32, act_fn="gelu_new"), 2, 16, "tiny"),
    Setting("s64", _cfg(2, 16, 2, 20, 8), 2, 8, "tiny"),
    Setting("s512", _cfg(2, 32, 4, 40, 16), 2, 16, "tiny"),
    Setting("long", _cfg(2, 32, 4, 50, 256), 2, 256, "tiny, long context"),
)

# The two references of the forward groups; `SAME_MATH` rows are also contender "bare".
BARE_REF, SAME_MATH, TL_REF = "bare", "same math", "transformer_lens"
# TransformerLens 4's columns (`tl4.py`): its bridge in compatibility mode, and as booted.
BRIDGE, NATIVE = "transformer_lens 4 bridge", "transformer_lens 4 native"
SAME_MATH_MEASURE = "plain forward, same math without hooks (hook-free reference)"

# (section, setting, measure, target, source, reference): a target on the median ratio of
# hookedattn's row to the reference ("bare": the group's first row; "same math").
TARGETS = [
    ("forward", "a", "forward, no hooks attached", 1.05, "first targets", BARE_REF),
    ("forward", "b", "forward, no hooks attached", 1.02, "first targets", BARE_REF),
    ("forward", "a", "run_with_cache, everything", 1.25, "first targets", BARE_REF),
    ("forward", "a", "no-op hook on every hook point", 1.15, "first targets", BARE_REF),
    ("forward", "s64", "forward, no hooks attached", 1.05, "hook cost", BARE_REF),
    ("forward", "s64", "run_with_cache, everything", 1.30, "hook cost", BARE_REF),
    ("forward", "s64", "forward, no hooks attached", 1.05, "hook cost", SAME_MATH),
    ("forward", "s64", "run_with_cache, everything", 1.30, "hook cost", SAME_MATH),
    ("forward", "s512", "forward, no hooks attached", 1.05, "hook cost", SAME_MATH),
    ("generation", "a", "greedy 32 tokens, KV cache", 1.5, "first targets", BARE_REF),
    ("analysis", "b", "composition scores, all head pairs", 1.5, "first targets", BARE_REF),
    ("analysis", "b", "factored SVD of one OV circuit", 1.2, "first targets", BARE_REF),
    # against the loop of one forward per patch: at least 10x faster
    ("analysis", "c", "activation patching, every head x position", 0.1, "first targets", BARE_REF),
    # Idle hook points cost nothing, down to the attention kernel.
    ("forward", "a", "forward, no hooks attached", 1.02, "idle hooks", BARE_REF),
    ("forward", "b", "forward, no hooks attached", 1.01, "idle hooks", BARE_REF),
    ("forward", "s64", "forward, no hooks attached", 1.10, "idle hooks", BARE_REF),
    ("forward", "a", "run_with_cache, everything", 1.10, "idle hooks", BARE_REF),
    ("forward", "a", "one hook on blocks.1.hook_resid_post", 1.03, "idle hooks", BARE_REF),
    ("generation", "a", "greedy 32 tokens, KV cache", 1.30, "idle hooks", BARE_REF),
    # Interpretability during generation: the decode step with idle hooks, and
    # return_cache=True against our own generation without it (that group's reference).
    ("generation", "a", "greedy 32 tokens, KV cache", 1.15, "generation", BARE_REF),
    ("generation", "b", "greedy 32 tokens, KV cache", 1.15, "generation", BARE_REF),
    (
        "generation",
        "a",
        "greedy 32 tokens, return_cache=True (every hook point)",
        1.3,
        "generation",
        BARE_REF,
    ),
    (
        "generation",
        "b",
        "greedy 32 tokens, return_cache=True (every hook point)",
        1.3,
        "generation",
        BARE_REF,
    ),
    # Speed, round 3: caching no slower than any peer, lighter caches (at 2 threads, where
    # the issue set them; the 1-thread run reports against the same numbers).
    ("forward", "a", "run_with_cache, everything", 1.25, "speed round 3", BARE_REF),
    ("forward", "a", "run_with_cache, everything", 1.15, "speed round 3", SAME_MATH),
    ("forward", "a", "no-op hook on every hook point", 1.10, "speed round 3", BARE_REF),
    ("forward", "a", "run_with_cache, residual stream only", 1.05, "speed round 3", BARE_REF),
    ("forward", "a", "forward, no hooks attached", 1.02, "speed round 3", BARE_REF),
    ("forward", "b", "forward, no hooks attached", 1.02, "speed round 3", BARE_REF),
    ("forward", "s64", "forward, no hooks attached", 1.15, "speed round 3", BARE_REF),
    ("analysis", "c", "activation patching, every head x position", 0.1, "speed round 3", BARE_REF),
    # The full cache's peak against TransformerLens's for the same names (ours has five
    # more: the norms' `hook_out`), in resident memory and in live tensor bytes; against
    # TransformerLens 3.5.1, or TransformerLens 4's bridges where that is installed.
    *(
        (
            "memory",
            key,
            f"hookedattn run_with_cache, TransformerLens's names{live}",
            1.0,
            "speed round 3",
            column,
        )
        for column in ("transformer_lens", BRIDGE, NATIVE)
        for key in ("a", "b")
        for live in ("", " (live tensors)")
    ),
    # peak resident memory of one forward, against the bare model's (memory section)
    ("memory", "long", "hookedattn forward", 1.10, "idle hooks", BARE_REF),
    # a mixture of experts, against transformers' eager forward on the same weights
    ("moe", "moe", "forward, no hooks attached", 1.0, "mixtures of experts", "transformers eager"),
    # hookedattn_tl's cache methods against TransformerLens 3.5.1's, the same call on the
    # same weights (its row leads the group)
    *(
        ("analysis", key, measure, 1.0, "TL cache methods", TL_REF)
        for key in ("a", "b")
        for measure in (
            "cache.stack_head_results(layer=-1)",
            "cache.stack_head_results(layer=-1), first call on the cache",
            "cache.decompose_resid()",
            "cache.accumulated_resid()",
        )
    ),
    # Each equation in one place: the forward through the components, with no second copy
    # of the model for speed (the targets of that change; "below every peer" for the full
    # cache is read beside the TransformerLens column).
    ("forward", "a", "forward, no hooks attached", 1.03, "one place", BARE_REF),
    ("forward", "b", "forward, no hooks attached", 1.03, "one place", BARE_REF),
    ("forward", "s64", "forward, no hooks attached", 1.20, "one place", BARE_REF),
    ("generation", "a", "greedy 32 tokens, KV cache", 1.25, "one place", BARE_REF),
    ("generation", "b", "greedy 32 tokens, KV cache", 1.25, "one place", BARE_REF),
]
