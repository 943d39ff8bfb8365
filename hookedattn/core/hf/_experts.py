"""A mixture of experts, recognised for the importer by convention (`_anatomy`, `_convention`).

`transformers` 5 builds most mixtures alike: a block (`mlp`, `block_sparse_moe`) holding a
router (`gate` or `router`, a weight `[expert d_model]`), the experts stacked
(`experts.gate_up_proj [expert (gate_up d_mlp) d_model]`, or `[expert d_model (gate_up
d_mlp)]` as Aria keeps them, and `experts.down_proj`), and maybe a shared expert every token
uses (`shared_expert(s)`, a gated MLP; its gate `shared_expert_gate`). What differs is read
here:

    sizes     the config fields the expert count, the experts per token and the widths come
              from, found by their names and checked against the twin's tensors
    files     how `save_pretrained` writes the experts back (one tensor per expert and
              projection, `experts.{e}.gate_proj.weight` / `w1`..., or stacked): the twin is
              saved once and its names read
    routing   a softmax over the experts and the `k` best, renormalised over them or not
              (`norm_topk_prob`: the config's when it has one; otherwise both are candidates
              and the verification keeps the one `transformers` computes), the sum plus
              an epsilon where the router keeps one (`norm_topk_prob_eps`) or
              `transformers` writes one in (`_RENORM_EPS`)

A router with a learned choice bias (`e_score_correction_bias`: sigmoid routing) or any
other piece is refused by name.
"""

import dataclasses
from typing import Any

from torch import nn

from hookedattn.core.hf import _moe_layers, _saved

_BLOCKS = ("mlp", "block_sparse_moe", "feed_forward", "moe")
_ROUTERS = ("gate", "router")
_SHARED = ("shared_experts", "shared_expert", "shared_mlp")
# A norm of the whole mixture's output, routed and shared experts (A.X-K1's).
_OUT_NORMS = ("post_mlp_layernorm",)
_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k_experts", "moe_k")
_WIDTHS = ("moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
# The shared experts' width: a field, or one expert's width times their count (DeepSeek's
# `moe_intermediate_size * n_shared_experts`, Aria's `intermediate_size *
# moe_num_shared_experts`), read before that width alone.
_SHARED_COUNTS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
_SHARED_WIDTHS = ("shared_expert_intermediate_size", "shared_intermediate_size",
                  "shared_experts_intermediate_size",
                  *(f"{width}*{count}" for width in ("moe_intermediate_size", "intermediate_size")
                    for count in _SHARED_COUNTS),
                  "moe_intermediate_size", "intermediate_size")  # fmt: skip
_CHOICE_BIASES = ("e_score_correction_bias", "expert_bias")
_DENSE_WIDTHS = ("intermediate_size_mlp", "intermediate_size", "first_dense_intermediate_size",
                 "dense_intermediate_size")  # fmt: skip
# The epsilon added to the chosen weights' sum where `transformers` writes a constant into
# the router (LFM2-MoE's 1e-6). Others write 1e-20 (DeepSeek V3's and its kind): below
# float64's resolution for a sum of chosen scores, read as 0.
_RENORM_EPS = {"lfm2_moe": 1e-6}
# A saved expert's projections: (gate, up, down) by the names checkpoints give them.
_FILE_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


@dataclasses.dataclass(frozen=True)
class Experts:
    """Where a layer's mixture keeps its pieces (names relative to the layer) and which
    config fields size it."""

    block: str  # "mlp"
    router: str  # "mlp.gate"
    stacked: str  # "mlp.experts"
    transposed: bool  # gate_up_proj [expert d_model (gate_up d_mlp)] (Aria)
    files: tuple[str, str, str] | None  # saved per expert: "mlp.experts.{expert}.w1.weight"...
    saved_stacked: tuple[str, str] | None  # saved stacked instead (Aria: experts.fc1.weight)
    saved_router: str  # the router's weight as saved ("block_sparse_moe.gate.weight")
    saved_shared: str | None  # the shared expert as saved ("mlp.shared_experts")
    shared: str | None  # "mlp.shared_experts"
    shared_gate: str | None  # "mlp.shared_expert_gate"
    count_field: str
    top_k_field: str
    width_field: str
    shared_width_field: str | None
    norm_topk_field: str | None  # the config's `norm_topk_prob`, when it has one
    act_fn: str
    # A learned bias added to the scores for choosing only (sigmoid routing, DeepSeek V3's
    # `e_score_correction_bias`), live and as saved; None without.
    choice_bias: str | None
    saved_choice_bias: str | None
    first_moe: int  # the twin's first layer with experts (others may hold a dense MLP)
    moe_field: str | None  # the config field saying which layers (`_moe_layers`)
    dense_width_field: str | None  # the dense MLPs' width, where some layer holds one
    # The files' stacked experts transposed (`transposed`) or not; None: as the live ones.
    saved_transposed: bool | None = None
    # The choice bias's shape as the files keep it: `[expert]`, or `[1 expert]` (Ernie).
    choice_bias_pattern: str = "expert -> expert"
    # The shared expert's gate and up maps fused in one `input_linear` `[gate; up]`, its down
    # map `output_linear` (Granite's `shared_mlp`, beside the block in the layer).
    shared_fused: bool = False
    # A norm of the block's whole output, its name in the layer ("mlp.post_mlp_layernorm"):
    # our blocks' `ln2_post` where they hold experts (`moe_out_norm`); None without.
    out_norm: str | None = None
    # Added to the chosen weights' sum before they are divided by it (`norm_topk_eps`).
    renorm_eps: float = 0.0


def block_name(children: dict[str, nn.Module]) -> str | None:
    """The layer's mixture-of-experts block, if it has one."""
    for name in _BLOCKS:
        if name in children and hasattr(children[name], "experts"):
            return name
    return None


def recognise(
    block_name: str,
    block: nn.Module,
    twin: nn.Module,
    config: Any,
    act_fn: str,
    layers: str,
    held: tuple[bool, ...] = (),
    beside: tuple[str, nn.Module] | None = None,
) -> Experts:
    """The mixture in `block` (the first such layer's; `held`: which layers hold one), its
    config fields, and its saved names (the twin saved once); a ValueError names a piece
    not recognised. `beside`: a shared expert the layer holds beside the block (its name in
    the layer, the module), whose write the layer adds to the block's."""
    first = held.index(True) if True in held else 0
    children = dict(block.named_children())
    router, choice = _router(block, children)
    router_map = _router_map(children[router])  # "" or the Linear it holds (AFMoE's "gate")
    count, d_model = children[router].get_submodule(router_map).weight.shape
    transposed, width = _stacked(children["experts"], int(d_model))
    out_norm = next((n for n in _OUT_NORMS if n in children), None)
    shared, gate = _shared_pieces(block, children, router, out_norm)
    shared, shared_module = beside or (shared, children[shared] if shared else None)
    shared_width = None
    if shared:
        shared_width = _field(config, _SHARED_WIDTHS, _width(shared_module), "shared width")
    files, saved_stacked, saved_router, saved_shared, saved_transposed = _saved_experts(
        twin, f"{layers}.{first}.", (int(count), int(d_model)), width, transposed
    )
    return Experts(
        block=block_name,
        saved_transposed=saved_transposed,
        router=f"{block_name}.{router}" + (f".{router_map}" if router_map else ""),
        stacked=f"{block_name}.experts",
        transposed=transposed,
        files=files,
        saved_stacked=saved_stacked,
        saved_router=saved_router,
        saved_shared=saved_shared,
        shared=(shared if beside else f"{block_name}.{shared}") if shared else None,
        shared_gate=f"{block_name}.{gate}" if gate else None,
        count_field=_field(config, _COUNTS, count, "expert count"),
        top_k_field=_field(config, _TOP_K, None, "experts per token"),
        width_field=_field(config, _WIDTHS, width, "expert width"),
        shared_width_field=shared_width,
        norm_topk_field="norm_topk_prob" if hasattr(config, "norm_topk_prob") else None,
        act_fn=act_fn,
        choice_bias=f"{block_name}.{choice}" if choice else None,
        choice_bias_pattern=_choice_bias_pattern(block, choice),
        saved_choice_bias=_saved_choice_bias(twin, f"{layers}.{first}.") if choice else None,
        first_moe=first,
        moe_field=_moe_layers.pattern_field(config, held) if held else None,
        dense_width_field=None if all(held) else _field(config, _DENSE_WIDTHS, None, "dense width"),
        shared_fused=shared_module is not None and hasattr(shared_module, "input_linear"),
        out_norm=f"{block_name}.{out_norm}" if out_norm else None,
        renorm_eps=_renorm_eps(children[router], config),
    )


def _renorm_eps(router: nn.Module, config: Any) -> float:
    """The epsilon the router adds to the chosen weights' sum: the router's own
    (`norm_topk_prob_eps`), or the constant `transformers` writes in for the model type."""
    kept = getattr(router, "norm_topk_prob_eps", None)
    return float(kept if kept is not None else _RENORM_EPS.get(config.model_type, 0.0))


def _saved_experts(
    twin: nn.Module, prefix: str, shape: tuple[int, int], width: int, transposed: bool
) -> tuple:
    """The layer's saved names (`_saved_names`: the files, the stacked experts, the router,
    the shared expert) and whether the saved experts are transposed: as held in memory,
    unless the files stack them otherwise (which is [gate; up], and how: `_saved_layout`)."""
    files, saved_stacked, saved_router, saved_shared = _saved_names(twin, prefix, shape)
    if saved_stacked is not None:
        saved_stacked, transposed = _saved_layout(twin, prefix, saved_stacked, width, shape[1])
    return files, saved_stacked, saved_router, saved_shared, transposed


def _shared_pieces(
    block: nn.Module, children: dict[str, nn.Module], router: str, out_norm: str | None
) -> tuple[str | None, str | None]:
    """The names of the block's shared expert and of its gate (None where it holds none);
    a ValueError names any other piece with parameters beside the router, the experts and
    the output norm."""
    shared = next((n for n in _SHARED if n in children), None)
    gate = "shared_expert_gate" if "shared_expert_gate" in children else None
    known = {router, "experts", *(n for n in (shared, gate, out_norm) if n)}
    others = [n for n, m in children.items()
              if n not in known and any(True for _ in m.parameters())]  # fmt: skip
    if others:
        raise ValueError(f"{type(block).__name__} holds pieces not recognised: {others}")
    return shared, gate


def _saved_layout(
    twin: nn.Module, at: str, saved_stacked: tuple[str, str], width: int, d_model: int
) -> tuple[tuple[str, str], bool]:
    """The files' stacked experts as (the [gate; up] name, the down name), told apart by
    their shapes under the layer `at`, and whether the files keep them transposed."""
    shapes = _saved_shapes(twin, at)
    gate_up = [n for n in saved_stacked if 2 * width in shapes[at + n]]
    if len(gate_up) > 1:  # 2 x width is d_model too (a twin's): the down map has width
        gate_up = [n for n in gate_up if width not in shapes[at + n]]
    if len(gate_up) != 1:
        raise ValueError(f"the stacked experts' [gate; up] is not told apart: {saved_stacked}")
    down = next(n for n in saved_stacked if n != gate_up[0])
    return (gate_up[0], down), shapes[at + gate_up[0]][1] == d_model != 2 * width


def beside_block(children: dict[str, nn.Module], block: str) -> str | None:
    """The name of a shared expert a layer holds beside its mixture-of-experts `block`
    (Granite's `shared_mlp`), or None."""
    if block not in children or not hasattr(children[block], "experts"):
        return None
    return next((n for n in _SHARED if n in children and n != block), None)


def _router(block: nn.Module, children: dict[str, nn.Module]) -> tuple[str, str | None]:
    """The router's name and its choice bias's (None without one); anything else the
    router or the block keeps is a ValueError."""
    router = next((n for n in _ROUTERS if n in children), None)
    if router is None:
        raise ValueError(f"{type(block).__name__} has no router ({_ROUTERS})")
    kept = {f"{router}.{n}": n.rsplit(".", 1)[-1] for n, _ in children[router].named_buffers()}
    linear = _router_map(children[router])
    mapped = ("weight", "bias") if not linear else (f"{linear}.weight", f"{linear}.bias")
    own = [n for n, _ in children[router].named_parameters() if n not in mapped]
    kept |= {f"{router}.{n}": n.rsplit(".", 1)[-1] for n in own}  # Ernie's: moe_statics.*
    kept |= {n: n for n, _ in block.named_buffers(recurse=False)}
    kept |= {n: n for n, _ in block.named_parameters(recurse=False)}
    choice = next((k for k, n in kept.items() if n in _CHOICE_BIASES), None)
    if set(kept) - {choice}:
        raise ValueError(
            f"{type(block).__name__}'s router keeps {sorted(set(kept) - {choice})} beside its "
            f"weight, not imported by convention"
        )
    return router, choice


def _router_map(router: nn.Module) -> str:
    """ "" where the router keeps its weight itself; the name of the one linear map it
    holds where it does not (AFMoE's `router.gate`)."""
    if isinstance(getattr(router, "weight", None), nn.Parameter):
        return ""
    linears = [n for n, m in router.named_children() if isinstance(m, nn.Linear)]
    if len(linears) != 1:
        raise ValueError(
            f"the router {type(router).__name__} keeps no weight and {len(linears)} linear "
            f"maps ({linears}); one is recognised"
        )
    return linears[0]


def _stacked(experts: nn.Module, d_model: int) -> tuple[bool, int]:
    """Whether the stacked experts keep `[expert d_model (gate_up d_mlp)]` (transposed),
    and their width."""
    params = dict(experts.named_parameters(recurse=False))
    if set(params) != {"gate_up_proj", "down_proj"}:
        raise ValueError(f"{type(experts).__name__} holds {sorted(params)}, not stacked "
                         "gate_up_proj and down_proj")  # fmt: skip
    gate_up = params["gate_up_proj"].shape
    transposed = gate_up[1] == d_model and gate_up[2] != d_model
    return transposed, (gate_up[2] if transposed else gate_up[1]) // 2


def _width(mlp: nn.Module) -> int:
    downs = ("down_proj", "w2", "fc2", "output_linear")
    down = next((m for n, m in mlp.named_children() if n in downs), None)
    if down is None:
        raise ValueError(f"the shared expert {type(mlp).__name__} has no down projection")
    return int(down.weight.shape[1])


def _field(config: Any, names: tuple[str, ...], value: int | None, what: str) -> str:
    """The first of `names` the config sets (to `value`, when given); a name "a*b" is the
    product of two fields (`field_value`)."""
    for name in names:
        held = field_value(config, name)
        if held is not None and value in (None, held):
            return name
    raise ValueError(f"no config field gives the {what} ({value}): tried {names}")


def field_value(config: Any, name: str) -> Any:
    """The config's value of field `name`, or of the product "a*b" of two integer fields
    (None where it sets either to no integer)."""
    if "*" not in name:
        return getattr(config, name, None)
    factors = [getattr(config, part, None) for part in name.split("*")]
    if not all(isinstance(f, int) and not isinstance(f, bool) for f in factors):
        return None
    return factors[0] * factors[1]


def _saved_names(
    twin: nn.Module, prefix: str, router_shape: tuple[int, int]
) -> tuple[tuple[str, str, str] | None, tuple[str, str] | None, str, str | None]:
    """How `save_pretrained` writes the first layer's mixture (its own names: a file's
    layout may rename the block): the experts per expert (the gate, up and down names with
    `{expert}`) or stacked (two names), the router's weight, the shared expert's prefix; all
    relative to the layer."""
    shapes = {n.removeprefix(prefix): shape for n, shape in _saved_shapes(twin, prefix).items()}
    routers = [
        n for n, shape in shapes.items()
        if shape == router_shape and n.endswith(".weight")
        and not any(other in n for other in ("expert", "attn", "attention"))
    ]  # fmt: skip
    if len(routers) != 1:
        raise ValueError(f"the router is saved under names not recognised: {routers}")
    return _experts_saved(shapes, routers[0])


def _saved_shapes(twin: nn.Module, prefix: str) -> dict[str, tuple[int, ...]]:
    """The names and shapes `save_pretrained` writes for the twin, those under `prefix`."""
    return {n: tuple(t.shape) for n, t in _saved.saved(twin).items() if n.startswith(prefix)}


def _experts_saved(
    shapes: dict[str, tuple[int, ...]], router: str
) -> tuple[tuple[str, str, str] | None, tuple[str, str] | None, str, str | None]:
    shared = sorted({n.rsplit(".", 2)[0] for n in shapes if "shared" in n and "gate." not in n})
    files, stacked = None, None
    for gate, up, down in _FILE_NAMES:
        first = [n for n in shapes if n.endswith(f"experts.0.{gate}.weight")]
        if first:
            block = first[0].removesuffix(f"0.{gate}.weight")
            files = tuple(f"{block}{{expert}}.{p}.weight" for p in (gate, up, down))
            break
    else:
        block = router.split(".")[0]  # not a hybrid's convolutions, [channel 1 d_conv]
        three_d = sorted(n for n, shape in shapes.items()
                         if len(shape) == 3 and n.split(".")[0] == block)  # fmt: skip
        if len(three_d) != 2:
            raise ValueError(f"the experts are saved under names not recognised: {three_d}")
        stacked = (three_d[0], three_d[1])
    return files, stacked, router, shared[0] if len(shared) == 1 else None


def _saved_choice_bias(twin: nn.Module, prefix: str) -> str | None:
    """Where the files keep the router's choice bias, relative to the layer; None where it
    is not saved (a buffer outside the state dict: zeros, as the model starts with)."""
    names = [n.removeprefix(prefix) for n in _saved_shapes(twin, prefix)
             if n.endswith(_CHOICE_BIASES)]  # fmt: skip
    if len(names) > 1:
        raise ValueError(f"the router's choice bias is saved under several names: {names}")
    return names[0] if names else None


def _choice_bias_pattern(block: nn.Module, choice: str | None) -> str:
    """How the choice bias is laid out: `[expert]`, or `[1 expert]` (Ernie 4.5's)."""
    if choice is None:
        return "expert -> expert"
    bias = dict((*block.named_parameters(), *block.named_buffers()))[choice]
    if bias.dim() == 2 and bias.shape[0] == 1:
        return "one expert -> (one expert)"
    if bias.dim() != 1:
        raise ValueError(
            f"a choice bias of shape {tuple(bias.shape)}: neither [expert] nor [1 expert]"
        )
    return "expert -> expert"
