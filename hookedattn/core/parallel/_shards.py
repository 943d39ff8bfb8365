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
    # A model without attention (Falcon Mamba's mixers alone) has no heads to divide.
    counts = (("n_heads", cfg.n_heads), ("n_key_value_heads", cfg.n_kv_heads))
    for field, count in counts if cfg.attention_layers else ():
        if count % tp_size:
            raise ValueError(
                f"tp_size={tp_size} does not divide {field}={count}: each rank takes whole "
                f"heads, as many on every rank (and the key/value heads its query heads "
                f"read); tp_size can be {', '.join(map(str, valid))} for this model"
            )
    unsplit = _not_split(cfg)
    if unsplit is not None:
        raise ValueError(f"tp_size={tp_size}: {unsplit}")
    _check_every_rank_holds_some(cfg, tp_size)
    return tp_size


# Where no rank can compute its part alone yet: load in one process or place blocks.
_ELSEWHERE = "load it in one process, or place its blocks with device_map="


def _not_split(cfg: HookedTransformerConfig) -> str | None:
    """Why this model's layers cannot be split over ranks (yet), or None."""
    if cfg.has_layer_shapes:
        return (
            "this model's blocks differ in their attention's heads or widths (the config's "
            "n_heads_layers, d_head_layers, n_key_value_heads_layers, attn_sinks_layers), "
            f"whose heads are not split over ranks yet; {_ELSEWHERE}"
        )
    if cfg.n_kv_shared_layers:
        return (
            f"this model's last {cfg.n_kv_shared_layers} blocks read earlier blocks' keys and "
            f"values (n_kv_shared_layers), which are not split over ranks yet; {_ELSEWHERE}"
        )
    if cfg.differential_attention:
        return (
            "this model's attention is differential, whose query heads i and i + n_heads/2 "
            "are subtracted before W_O reads them, and whose pairs of heads are not split "
            f"over ranks yet; {_ELSEWHERE}"
        )
    if cfg.has_mlp and cfg.act_fn == "solu_ln":
        return (
            "this model's MLPs are SoLU-LN (act_fn='solu_ln'), whose softmax and LayerNorm "
            "over the neurons read every neuron of a token at once, so no rank can compute "
            f"its own neurons alone; {_ELSEWHERE}"
        )
    if cfg.use_qk_norm and not cfg.qk_norm_per_head:
        return (
            "this model normalises its queries and keys over all heads together (OLMo 2's "
            "q/k norm), which no rank can do with its own heads alone; tensor parallelism "
            "needs per-head q/k norms or none"
        )
    return None


def _check_every_rank_holds_some(cfg: HookedTransformerConfig, tp_size: int) -> None:
    """Refuse a split that leaves a rank no token of the vocabularies or no neuron."""
    sizes = [("d_vocab", cfg.d_vocab, "token"), ("d_vocab_out", cfg.d_vocab_out, "token")]
    if not cfg.attn_only:
        sizes.append(("d_mlp", cfg.d_mlp or 0, "neuron"))
    if cfg.is_moe and cfg.d_mlp_shared is not None:
        sizes.append(("d_mlp_shared", cfg.d_mlp_shared, "neuron"))
    for field, count, what in sizes:
        lengths = chunk_lengths(count, tp_size)
        if min(lengths) == 0:  # ceil-sized chunks: 5 over 4 ranks is 2, 2, 1, 0
            raise ValueError(
                f"tp_size={tp_size} leaves rank {lengths.index(0)} no {what} of "
                f"{field}={count} (the ranks' parts would be {lengths}): use fewer ranks"
            )
