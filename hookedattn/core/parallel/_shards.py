"""Which part of each sharded axis a rank holds, and which models can be split.

An axis of `size` is cut as `torch.chunk` (and DTensor's `Shard`) cuts it: `ceil(size /
ranks)` indices to each rank in turn, the last ones shorter. Heads must divide evenly (a
query head and the key/value head it reads stay on one rank); neurons and the vocabulary
need not (GPT-2's 50257 tokens over 2 ranks are 25129 and 25128).
"""

import dataclasses
import math

from hookedattn.core.config import HookedTransformerConfig


@dataclasses.dataclass(frozen=True)
class LocalSlice:
    """This rank's part of a sharded tensor: indices `start..stop-1` of `axis`, out of `size`.

    `axis` may be negative (counted from the end, as for `[batch pos d_mlp]` activations).
    """

    axis: int
    start: int
    stop: int
    size: int

    @property
    def length(self) -> int:
        """How many indices of the axis this rank holds."""
        return self.stop - self.start


def chunk_range(size: int, rank: int, n_ranks: int) -> tuple[int, int]:
    """`(start, stop)` of rank `rank`'s chunk of an axis of `size` over `n_ranks` ranks."""
    per_rank = -(-size // n_ranks)
    start = min(rank * per_rank, size)
    return start, min(start + per_rank, size)


def chunk_lengths(size: int, n_ranks: int) -> list[int]:
    """Every rank's chunk length, in rank order."""
    return [stop - start for start, stop in (chunk_range(size, r, n_ranks) for r in range(n_ranks))]


def local_slice(size: int, axis: int, rank: int, n_ranks: int) -> LocalSlice:
    """Rank `rank`'s `LocalSlice` of an axis of `size` at `axis`."""
    return LocalSlice(axis, *chunk_range(size, rank, n_ranks), size)


def check_tp_size(cfg: HookedTransformerConfig, tp_size: object) -> int:
    """`tp_size` if this model can be split over that many ranks; else a ValueError naming
    the reason and the sizes that would do."""
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(f"tp_size must be an int >= 1 (the number of ranks), got {tp_size!r}")
    if tp_size == 1:
        return tp_size
    heads = math.gcd(cfg.n_heads, cfg.n_kv_heads)
    valid = [n for n in range(1, heads + 1) if heads % n == 0]
    for field, count in (("n_heads", cfg.n_heads), ("n_key_value_heads", cfg.n_kv_heads)):
        if count % tp_size:
            raise ValueError(
                f"tp_size={tp_size} does not divide {field}={count}: each rank takes whole "
                f"heads, as many on every rank (and the key/value heads its query heads "
                f"read); tp_size can be {', '.join(map(str, valid))} for this model"
            )
    if cfg.is_latent_attention:
        raise ValueError(
            f"tp_size={tp_size}: this model's attention is latent (kv_lora_rank="
            f"{cfg.kv_lora_rank}), whose latents and shared rotary key every head reads, and "
            f"whose heads are not split over ranks yet; load it in one process, or place its "
            f"blocks with device_map="
        )
    if cfg.differential_attention:
        raise ValueError(
            f"tp_size={tp_size}: this model's attention is differential, whose query heads "
            f"i and i + n_heads/2 are subtracted before W_O reads them, and whose pairs of "
            f"heads are not split over ranks yet; load it in one process, or place its "
            f"blocks with device_map="
        )
    if cfg.mixers is not None and cfg.mixers.holds_mixers:
        raise ValueError(
            f"tp_size={tp_size}: this hybrid model's mixers "
            f"({sorted(set(cfg.mixers.layers) | {cfg.mixers.beside_attention} - {None})}) "
            f"are not split over ranks yet; load it in one process, or place its blocks with "
            f"device_map="
        )
    if cfg.is_moe:
        raise ValueError(
            f"tp_size={tp_size}: this model is a mixture of experts "
            f"(num_experts={cfg.num_experts}), whose experts are not split over ranks yet; "
            f"load it in one process, or place its blocks with device_map="
        )
    if cfg.has_mlp and cfg.act_fn == "solu_ln":
        raise ValueError(
            f"tp_size={tp_size}: this model's MLPs are SoLU-LN (act_fn='solu_ln'), whose "
            f"softmax and LayerNorm over the neurons read every neuron of a token at once, "
            f"so no rank can compute its own neurons alone; load it in one process, or "
            f"place its blocks with device_map="
        )
    if cfg.use_qk_norm and not cfg.qk_norm_per_head:
        raise ValueError(
            f"tp_size={tp_size}: this model normalises its queries and keys over all heads "
            f"together (OLMo 2's q/k norm), which no rank can do with its own heads alone; "
            f"tensor parallelism needs per-head q/k norms or none"
        )
    sizes = [("d_vocab", cfg.d_vocab, "token"), ("d_vocab_out", cfg.d_vocab_out, "token")]
    if not cfg.attn_only:
        sizes.append(("d_mlp", cfg.d_mlp or 0, "neuron"))
    for field, count, what in sizes:
        lengths = chunk_lengths(count, tp_size)
        if min(lengths) == 0:  # ceil-sized chunks: 5 over 4 ranks is 2, 2, 1, 0
            raise ValueError(
                f"tp_size={tp_size} leaves rank {lengths.index(0)} no {what} of "
                f"{field}={count} (the ranks' parts would be {lengths}): use fewer ranks"
            )
    return tp_size
