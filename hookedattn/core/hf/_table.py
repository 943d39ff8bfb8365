"""A family's conversion as a table: each of our tensors, the HF tensor it is read from, and
the einops pattern that reshapes one into the other.

    Rule("blocks.{layer}.attn._W_K", "model.layers.{layer}.self_attn.k_proj.weight",
         "(kv_head d_head) d_model -> kv_head d_model d_head")

`{layer}` expands to every block. The axis names are our glossary's (`head`, `kv_head`,
`d_head`, `d_model`, `d_mlp`, `d_vocab`, `d_vocab_out`, `n_ctx`, and `qkv` = 3 for fused
projections; latent attention's in `axis_sizes`), sized from our config, so the left side of
a pattern is also the shape the HF tensor must have: a checkpoint is checked against the
config, tensor by tensor, before any tensor is read. A fused tensor is one rule per part,
each `pick`ing its index of the pattern's first output axis; where the parts differ in size
(Phi-3's q, k, v with grouped keys), each rule takes its `part` of the HF tensor's first
axis, which is the pieces `split` lists one after another. A rule without an HF tensor is a
constant: zeros (a bias the family does not have), its `fill` (the gain of a norm without
parameters), or what its `adjust` computes (a fixed sinusoidal table). `adjust` is for
the few values that are not a reshape (Gemma's `1 + w` gain,
its scaled embedding; the order of DeepSeek's rotated dimensions); it receives the tensor
already cast to the target dtype.

A mixture of experts' weights are one tensor of ours per kind, stacked over experts
(`W_in: [expert d_model d_mlp]`); files store one HF tensor per expert. A rule with
`experts=n` names them with `{expert}` (`...experts.{expert}.up_proj.weight`), its pattern
converts one of them, and the converted ones fill our tensor expert by expert.
"""

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, runtime_checkable

import torch
from einops import rearrange, repeat
from torch import Tensor

from hookedattn.core._weights_io import CheckpointError
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf._joined import joined

# An MLP's maps as HF keeps them (`[out in]`) and as ours are (`[in out]`).
MLP_IN, MLP_OUT = "d_mlp d_model -> d_model d_mlp", "d_model d_mlp -> d_mlp d_model"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One of our tensors, read from one HF tensor (or zeros, when `hf` is None)."""

    ours: str
    hf: str | None
    pattern: str
    pick: int | None = None
    adjust: Callable[[Tensor], Tensor] | None = None
    # The HF tensor's first axis as consecutive pieces (each a product of axis names, e.g.
    # ("head d_head", "kv_head d_head", "kv_head d_head")); the rule reads piece `part`.
    split: tuple[str, ...] | None = None
    part: int = 0
    # The axis (of our sizes) along which the `split` pieces repeat: the HF tensor's first
    # axis is `(split_within pieces)`, one run of all the pieces per index (Qwen3-Next's
    # `[q; k; v; z]` per key head), and the rule reads piece `part` of each run.
    split_within: str | None = None
    # How many HF tensors (`{expert}` in `hf`) are stacked along our first axis; 0: one.
    experts: int = 0
    # The value of every entry of a rule without an HF tensor.
    fill: float = 0.0
    # An HF table `[rows d_model]` whose first row is added to every row of ours: BERT's
    # token type 0, the same for every token of an input, folded into the positions.
    plus_first_row: str | None = None

    def expand(self, n_layers: int) -> list["Rule"]:
        """This rule for every block, when it names `{layer}`; else itself."""
        if "{layer}" not in self.ours:
            return [self]
        at = lambda name, layer: name.replace("{layer}", str(layer))
        return [
            dataclasses.replace(
                self,
                ours=at(self.ours, layer),
                hf=None if self.hf is None else at(self.hf, layer),
            )
            for layer in range(n_layers)
        ]

    def hf_names(self) -> list[str]:
        """The HF tensors this rule reads: one, or one per expert."""
        if self.hf is None:
            return []
        if not self.experts:
            return [self.hf]
        return [self.hf.replace("{expert}", str(e)) for e in range(self.experts)]

    def read_names(self) -> list[str]:
        """Every HF tensor this rule reads: `hf_names` and the table of `plus_first_row`."""
        return self.hf_names() + ([self.plus_first_row] if self.plus_first_row else [])


def zeros(ours: str, axes: str) -> Rule:
    """A tensor the family does not have (a bias), as zeros of shape `axes`."""
    return Rule(ours, None, f"-> {axes}")


def ones(ours: str, axes: str, times: float = 1.0) -> Rule:
    """A gain the family does not have (a norm without parameters), as `times` everywhere."""
    return Rule(ours, None, f"-> {axes}", fill=times)


@runtime_checkable
class TensorSource(Protocol):
    """Named HF tensors: their shapes and dtypes without reading them, and each one on
    demand."""

    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, torch.dtype]

    def get(self, name: str) -> Tensor:
        """The tensor called `name`, as stored: someone else's memory (a live model's
        parameter, a view of a memory-mapped file), which no converted tensor shares."""
        ...


class StateDict:
    """A live HF model's state dict as a `TensorSource`."""

    def __init__(self, state_dict: Mapping[str, Tensor]) -> None:
        self._tensors = state_dict
        self.shapes = {name: tuple(t.shape) for name, t in state_dict.items()}
        self.dtypes = {name: t.dtype for name, t in state_dict.items()}

    def get(self, name: str) -> Tensor:
        """The tensor called `name`."""
        return self._tensors[name]


def axis_sizes(cfg: HookedTransformerConfig) -> dict[str, int]:
    """The size of every axis name a rule's pattern may use, from our config."""
    return {
        "d_model": cfg.d_model,
        "d_model_out": cfg.d_model,  # the other side of a square map
        # The embeddings' width and the head's, where they are not the stream's (ELECTRA).
        "d_embed": cfg.embed_width,
        "d_unembed": cfg.unembed_width,
        "d_head": cfg.d_head,
        "head": cfg.n_heads,
        "kv_head": cfg.n_kv_heads,
        "d_mlp": cfg.d_mlp or 0,
        "d_vocab": cfg.d_vocab,
        "d_vocab_out": cfg.d_vocab_out,
        "n_ctx": cfg.n_ctx,
        "qkv": 3,
        # CodeGen's fused q/k/v: 4 shards (its hard-coded `mp_num`), each [q; v; k] of a
        # quarter of the heads.
        "mp_shard": 4,
        "shard_head": cfg.n_heads // 4,
        "expert": cfg.num_experts or 0,
        "group": cfg.n_heads // cfg.n_kv_heads,  # query heads per key/value head
        "d_mlp_shared": cfg.d_mlp_shared or 0,
        "gate_up": 2,  # a fused gated MLP's two reads
        "one": 1,
        "pos_offset": 2,  # OPT's position table starts two rows early
        # Latent attention: the latents' widths, the rotated part of a head, and a head's
        # unrotated key and value side by side.
        "q_rank": cfg.q_lora_rank or 0,
        "kv_rank": cfg.kv_lora_rank or 0,
        "d_rope": cfg.rotary_dim or 0,
        "d_kv": cfg.d_head - (cfg.rotary_dim or 0) + cfg.d_value,
        "d_head_v": cfg.d_value,
        "d_mlp_dense": cfg.d_mlp_dense or 0,
        "d_mlp_kv_shared": cfg.d_mlp_kv_shared or 0,  # Gemma 4's double-wide MLPs
        # A lightning indexer's heads and their width (`components.indexer`).
        "index_head": cfg.index_n_heads,
        "d_index": cfg.index_head_dim or 0,
        # Differential attention's pairs of query heads, each pair's z two heads wide.
        "pair": cfg.n_heads // 2,
        "d_pair": 2 * cfg.d_head,
        # Per-layer inputs (`components.per_layer_input`): their width and table's rows.
        "layer": cfg.n_layers,
        "d_ple": cfg.d_per_layer_input or 0,
        "d_vocab_ple": cfg.d_vocab_per_layer_input or cfg.d_vocab,
        **_mixer_axes(cfg),
    }


def sizes_by_rule(cfg: HookedTransformerConfig) -> Callable[[Rule], dict[str, int]]:
    """The axis sizes of each rule: `axis_sizes` of the config, or, for a rule of a block
    (`blocks.L.`) of a model whose blocks' attention shapes differ (`n_heads_layers`,
    ...), of that block's own (`cfg.attention_config(L)`): its heads and widths."""
    every = axis_sizes(cfg)
    if not cfg.has_layer_shapes:
        return lambda rule: every
    by_layer: dict[int, dict[str, int]] = {}

    def sizes(rule: Rule) -> dict[str, int]:
        found = re.match(r"blocks\.(\d+)\.", rule.ours)
        if found is None:
            return every
        layer = int(found.group(1))
        if layer not in by_layer:
            by_layer[layer] = axis_sizes(cfg.attention_config(layer))
        return by_layer[layer]

    return sizes


def _mixer_axes(cfg: HookedTransformerConfig) -> dict[str, int]:
    """A hybrid's mixers' axes: a short convolution's channels (d_model) and width, a
    Mamba-2 layer's heads, inner width and convolved width (`components.mamba2`), a Mamba-1
    layer's state and step rank (`components.mamba`), a gated delta net's key heads and
    widths."""
    m = cfg.mixers
    if m is None:
        return {}
    return {
        "channel": cfg.d_model,
        "d_conv": m.d_conv,
        "ssm_head": m.n_ssm_heads,
        "d_inner": m.d_inner,
        "d_xbc": m.d_inner + 2 * m.n_ssm_groups * m.d_state,
        "d_state": m.d_state,
        "dt_rank": m.dt_rank,
        # A gated delta net's key heads (`group`) and widths (`components.gated_delta`).
        "group": m.n_ssm_groups,
        "per_group": m.n_ssm_heads // m.n_ssm_groups,
        "d_key": m.n_ssm_groups * m.d_state,
        "d_ssm_head": m.d_ssm_head,
        "d_ssm_head_out": m.d_ssm_head,  # an RG-LRU gate block's outputs (`components.rg_lru`)
        "d_qkv": m.d_inner + 2 * m.n_ssm_groups * m.d_state,
        # Kimi Delta Attention's `A_log`, kept as `[1 1 ssm_head 1]` to broadcast over the
        # batch, the positions and the key channels (`_kimi_delta`).
        "at_batch": 1,
        "at_pos": 1,
    }


def side_shape(side: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape one side of an einops pattern describes: `"(head d_head) d_model"` ->
    `(n_heads * d_head, d_model)`."""
    shape = []
    for group in re.findall(r"\(([^)]*)\)|(\S+)", side):
        names = (group[0] or group[1]).split()
        size = 1
        for name in names:
            size *= sizes[name]
        shape.append(size)
    return tuple(shape)


def hf_shape(rule: Rule, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape the HF tensor of `rule` must have (the whole tensor, when it is split)."""
    shape = side_shape(rule.pattern.split("->")[0], sizes)
    if rule.split is None:
        return shape
    runs = sizes[rule.split_within] if rule.split_within else 1
    return (runs * sum(_pieces(rule, sizes)), *shape[1:])


def _pieces(rule: Rule, sizes: Mapping[str, int]) -> list[int]:
    return [side_shape(f"({piece})", sizes)[0] for piece in rule.split or ()]


def our_shape(rule: Rule, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape `rule` produces (with the expert axis first for a stacked rule)."""
    shape = side_shape(rule.pattern.split("->")[1], sizes)
    shape = shape[1:] if rule.pick is not None else shape
    return (rule.experts, *shape) if rule.experts else shape


@dataclasses.dataclass(frozen=True)
class Table:
    """A whole model's rules, expanded per block, with the names HF may store them under."""

    rules: tuple[Rule, ...]
    # HF names that may stand for another (a tied unembedding absent from the file is the
    # embedding; an older name of the same tensor).
    aliases: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # HF names that carry no weights (masks, rotary frequencies older versions saved).
    ignored: tuple[str, ...] = ()
    label: str = "HF"
    # The base model's prefix ("transformer.", "model."): a checkpoint of the base model
    # (as the original GPT-2 files are) stores every name without it.
    base_prefix: str = ""

    def source_names(self, present: Mapping[str, object]) -> dict[str, str]:
        """For each HF name the rules read, the name it is stored under in `present`."""
        found = {}
        for rule in self.rules:
            for hf in rule.read_names():
                names = (hf, *self.aliases.get(hf, ()))
                candidates = (*names, *(n.removeprefix(self.base_prefix) for n in names))
                found[hf] = next((c for c in candidates if c in present), hf)
        return found


def check_source(table: Table, source: TensorSource, cfg: HookedTransformerConfig) -> None:
    """A `CheckpointError` listing every HF tensor missing, unexpected, misshapen, or not
    floating point (an integer, bool or complex weight is refused, never cast)."""
    sizes_of = sizes_by_rule(cfg)
    source = joined(source, table)  # a tensor kept in pieces read as one (`_joined`)
    names = table.source_names(source.shapes)
    missing = sorted({hf for hf, stored in names.items() if stored not in source.shapes})
    read = set(names.values())
    extra = sorted(
        name
        for name in source.shapes
        if name not in read and not any(re.search(pattern, name) for pattern in table.ignored)
    )
    wrong = []
    for rule in table.rules:
        sizes = sizes_of(rule)
        for hf in rule.hf_names():
            stored = names[hf]
            if stored in source.shapes and tuple(source.shapes[stored]) != hf_shape(rule, sizes):
                shape = tuple(source.shapes[stored])
                entry = f"{stored}: {shape} instead of {hf_shape(rule, sizes)}"
                if entry not in wrong:
                    wrong.append(entry)
        added = names.get(rule.plus_first_row or "")
        if added in source.shapes and tuple(source.shapes[added])[1:] != (cfg.embed_width,):
            wrong.append(f"{added}: {tuple(source.shapes[added])} instead of (rows, d_embed)")
    kinds = sorted(
        f"{stored}: {source.dtypes[stored]}"
        for stored in read
        if stored in source.dtypes and not source.dtypes[stored].is_floating_point
    )
    labelled = (
        ("missing", missing),
        ("unexpected", extra),
        ("wrong shapes", wrong),
        ("not floating point (weights are never cast from integers, bools or complex)", kinds),
    )
    problems = [f"{label} {items}" for label, items in labelled if items]
    if problems:
        raise CheckpointError(
            f"the {table.label} state dict does not match its config: " + "; ".join(problems)
        )


def convert(
    table: Table,
    source: TensorSource,
    cfg: HookedTransformerConfig,
    dtype: torch.dtype,
    device: str | torch.device,
) -> Iterator[tuple[str, Tensor]]:
    """Each of our tensors in turn, in `dtype` on `device`, owning its memory.

    One HF tensor is read per rule and dropped before the next, so converting holds the
    finished tensors plus one HF tensor at a time; each is cast before it is reshaped, so a
    bfloat16 checkpoint loaded as bfloat16 never passes through float32.
    """
    sizes_of = sizes_by_rule(cfg)
    source = joined(source, table)
    names = table.source_names(source.shapes)
    for rule in table.rules:
        sizes = sizes_of(rule)
        if rule.hf is None:
            yield rule.ours, constant(rule, our_shape(rule, sizes), dtype, device)
        elif rule.experts:
            stacked = torch.empty(our_shape(rule, sizes), dtype=dtype, device=device)
            for e, hf in enumerate(rule.hf_names()):  # one HF tensor held at a time
                stacked[e] = _converted(rule, source.get(names[hf]), sizes, dtype, device)
            yield rule.ours, stacked
        else:
            stored = source.get(names[rule.hf])
            tensor = _owning(_converted(rule, stored, sizes, dtype, device), stored)
            yield rule.ours, plus_first_row(rule, tensor, source, names)


def plus_first_row(
    rule: Rule,
    tensor: Tensor,
    source: TensorSource,
    names: Mapping[str, str],
    columns: tuple[int, int] | None = None,
) -> Tensor:
    """`tensor` with the first row of the rule's `plus_first_row` table added to each of
    its rows (its `columns` only, where `tensor` holds a slice of `d_model`); `tensor`
    itself for a rule without one."""
    if rule.plus_first_row is None:
        return tensor
    first = source.get(names[rule.plus_first_row])[0]
    if columns is not None:
        first = first[columns[0] : columns[1]]
    return tensor + first.to(device=tensor.device, dtype=tensor.dtype)


def _converted(
    rule: Rule,
    stored: Tensor,
    sizes: Mapping[str, int],
    dtype: torch.dtype,
    device: str | torch.device,
) -> Tensor:
    """One HF tensor as `rule` makes it: its piece, cast, rearranged, picked and adjusted."""
    tensor = stored
    if rule.split is not None:  # a view: only this piece is cast and copied
        pieces = _pieces(rule, sizes)
        runs = sizes[rule.split_within] if rule.split_within else 1
        tensor = tensor.unflatten(0, (runs, sum(pieces)))
        tensor = tensor.narrow(1, sum(pieces[: rule.part]), pieces[rule.part]).flatten(0, 1)
    tensor = tensor.to(device=device, dtype=dtype)
    used = set(re.findall(r"\w+", rule.pattern))
    axes = {name: size for name, size in sizes.items() if name in used}
    tensor = reshaped(tensor, rule.pattern, axes)
    if rule.pick is not None:
        tensor = tensor[rule.pick]
    if rule.adjust is not None:
        tensor = rule.adjust(tensor).to(dtype)
    return tensor


def reshaped(tensor: Tensor, pattern: str, axes: Mapping[str, int]) -> Tensor:
    """`tensor` by the einops `pattern`: rearranged, or repeated along the axes its right
    side names and its left does not (one HF tensor that several of ours hold, as JetMoE's
    router row is every head of its expert's)."""
    left, right = (set(re.findall(r"\w+", side)) for side in pattern.split("->"))
    return (repeat if right - left else rearrange)(tensor, pattern, **axes)


def _owning(tensor: Tensor, stored: Tensor) -> Tensor:
    """`tensor`, contiguous, in memory of its own: never a view of a live HF model's tensor
    (which would then share our weights) or of a mapped file (whose pages would be read as
    the model runs), nor a slice keeping a fused tensor alive."""
    tensor = tensor.contiguous()
    shares = tensor.untyped_storage().data_ptr() == stored.untyped_storage().data_ptr()
    if shares or tensor.untyped_storage().nbytes() != tensor.nbytes:
        tensor = tensor.clone()
    return tensor


def constant(
    rule: Rule, shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device
) -> Tensor:
    """A rule without an HF tensor: its `fill` everywhere, or what its `adjust` computes
    from that (a fixed sinusoidal table, `_sinusoids`)."""
    tensor = torch.full(shape, rule.fill, dtype=dtype, device=device)
    return tensor if rule.adjust is None else rule.adjust(tensor).to(dtype)


def times(factor: float) -> Callable[[Tensor], Tensor] | None:
    """An `adjust` multiplying a tensor by `factor` (a scalar folded into the weights it
    multiplies); None for 1."""
    if factor == 1.0:
        return None
    return lambda t: t * factor
