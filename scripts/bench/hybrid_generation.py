"""Greedy generation of a hybrid model with its mixers' cache against the whole sequence
rerun at each step (`use_past_kv_cache=False`, what every hybrid did before the mixers kept
a cache), in one process, interleaved.

    python scripts/bench/hybrid_generation.py                       # every kind, 64 and 192
    python scripts/bench/hybrid_generation.py --kinds mamba2 --new-tokens 64 --rounds 7

Each model: 4 blocks, the first three a mixer of one kind and the last attention, d_model
256, 8 heads, a gated MLP 768 wide, random weights, a 32-token prompt. Each round times both
calls back to back (the order alternating) in CPU time, and checks they chose the same
tokens. Reported: the median of the per-round ratios (cached / rerun) with their range, and
the median seconds. One torch thread unless `--threads`.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hookedattn import HookedTransformer
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.mixer_config import MixerConfig

GROUPED = dict(d_conv=4, n_ssm_heads=8, d_ssm_head=32, d_state=32, n_ssm_groups=4)
KINDS = {  # settings of the width of a small hybrid's mixers
    "short_conv": dict(d_conv=3),
    "mamba2": GROUPED | dict(d_state=16, n_ssm_groups=1),
    "gated_delta": GROUPED,
    "mamba": dict(d_conv=4, n_ssm_heads=512, d_ssm_head=1, n_ssm_groups=1, d_state=16,
                  dt_rank=16),
    "rg_lru": dict(d_conv=4, n_ssm_heads=8, d_ssm_head=32),
    "kimi_delta": dict(d_conv=4, n_ssm_heads=8, d_ssm_head=32, dt_rank=32),
    "lightning": dict(n_ssm_heads=8, d_ssm_head=32, n_ssm_groups=1),
}  # fmt: skip


def model_of(kind: str) -> HookedTransformer:
    """Three blocks of `kind`, then one of attention (module docstring)."""
    cfg = HookedTransformerConfig(
        n_layers=4, d_model=256, n_ctx=1024, d_vocab=1000, n_heads=8, d_mlp=768,
        normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
        act_fn="silu", seed=0,
        mixers=MixerConfig(layers=(kind, kind, kind, "attention"), **KINDS[kind]),
    )  # fmt: skip
    return HookedTransformer(cfg)


def measure(kind: str, new_tokens: int, rounds: int) -> dict[str, float]:
    """The per-round ratios' median and range, and each call's median seconds."""
    model = model_of(kind)
    prompt = torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        tokens = {}
        for cached in (True, False) if r % 2 == 0 else (False, True):
            start = time.process_time()
            tokens[cached] = model.generate(
                prompt, max_new_tokens=new_tokens, stop_at_eos=False, use_past_kv_cache=cached
            )
            seconds[cached].append(time.process_time() - start)
        if not torch.equal(tokens[True], tokens[False]):
            raise AssertionError(f"{kind}: the cached generation chose other tokens")
    ratios = [a / b for a, b in zip(seconds[True], seconds[False], strict=True)]
    median = statistics.median
    return dict(ratio=median(ratios), low=min(ratios), high=max(ratios),
                cached=median(seconds[True]), rerun=median(seconds[False]))  # fmt: skip


def main(argv: list[str]) -> int:
    """Measure each kind and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS), help="mixer kinds, comma-separated")
    parser.add_argument("--new-tokens", default="64,192", help="lengths, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kind(s) {unknown}; the kinds are {list(KINDS)}")
    print("| mixer | new tokens | cached / rerun (range) | cached s | rerun s |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        for n in (int(n) for n in args.new_tokens.split(",")):
            m = measure(kind, n, args.rounds)
            print(f"| `{kind}` | {n} | {m['ratio']:.3f} ({m['low']:.3f}–{m['high']:.3f}) | "
                  f"{m['cached']:.2f} | {m['rerun']:.2f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
