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
              and the verification keeps the one `transformers` computes)

A router with a learned choice bias (`e_score_correction_bias`: sigmoid routing) or any
other piece is refused by name.
"""

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from safetensors import safe_open
from torch import nn

from hookedattn.core.hf import _loading

_BLOCKS = ("mlp", "block_sparse_moe", "feed_forward", "moe")
_ROUTERS = ("gate", "router")
_SHARED = ("shared_experts", "shared_expert", "shared_mlp")
_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k_experts", "moe_k")
_WIDTHS = ("moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
_SHARED_WIDTHS = ("shared_expert_intermediate_size", "shared_intermediate_size",
                  "shared_experts_intermediate_size", "moe_intermediate_size",
                  "intermediate_size")  # fmt: skip
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


def block_name(children: dict[str, nn.Module]) -> str | None:
    """The layer's mixture-of-experts block, if it has one."""
    for name in _BLOCKS:
        if name in children and hasattr(children[name], "experts"):
            return name
    return None


def recognise(
    block_name: str, block: nn.Module, twin: nn.Module, config: Any, act_fn: str, layers: str
) -> Experts:
    """The mixture in `block` (the first layer's), its config fields, and its saved names
    (the twin saved once); a ValueError names a piece not recognised."""
    children = dict(block.named_children())
    router = next((n for n in _ROUTERS if n in children), None)
    if router is None:
        raise ValueError(f"{type(block).__name__} has no router ({_ROUTERS})")
    buffers = [n for n, _ in children[router].named_buffers()] + [
        n for n, _ in block.named_buffers(recurse=False)
    ]
    if buffers or [n for n, _ in block.named_parameters(recurse=False)]:
        raise ValueError(
            f"{type(block).__name__}'s router keeps {buffers or 'parameters'} beside its "
            f"weight (a choice bias: sigmoid routing), not imported by convention"
        )
    experts = children["experts"]
    params = dict(experts.named_parameters(recurse=False))
    if set(params) != {"gate_up_proj", "down_proj"}:
        raise ValueError(f"{type(experts).__name__} holds {sorted(params)}, not stacked "
                         "gate_up_proj and down_proj")  # fmt: skip
    count, d_model = children[router].weight.shape
    gate_up = params["gate_up_proj"].shape
    transposed = gate_up[1] == d_model and gate_up[2] != d_model
    width = (gate_up[2] if transposed else gate_up[1]) // 2
    shared = next((n for n in _SHARED if n in children), None)
    gate = "shared_expert_gate" if "shared_expert_gate" in children else None
    known = {router, "experts", *([shared] if shared else []), *([gate] if gate else [])}
    others = [n for n, m in children.items() if n not in known and any(m.parameters())]
    if others:
        raise ValueError(f"{type(block).__name__} holds pieces not recognised: {others}")
    shared_width = None
    if shared:
        shared_width = _field(config, _SHARED_WIDTHS, _width(children[shared]), "shared width")
    files, saved_stacked, saved_router, saved_shared = _saved_names(
        twin, f"{layers}.0.", (int(count), int(d_model))
    )
    return Experts(
        block=block_name,
        router=f"{block_name}.{router}",
        stacked=f"{block_name}.experts",
        transposed=transposed,
        files=files,
        saved_stacked=saved_stacked,
        saved_router=saved_router,
        saved_shared=saved_shared,
        shared=f"{block_name}.{shared}" if shared else None,
        shared_gate=f"{block_name}.{gate}" if gate else None,
        count_field=_field(config, _COUNTS, count, "expert count"),
        top_k_field=_field(config, _TOP_K, None, "experts per token"),
        width_field=_field(config, _WIDTHS, width, "expert width"),
        shared_width_field=shared_width,
        norm_topk_field="norm_topk_prob" if hasattr(config, "norm_topk_prob") else None,
        act_fn=act_fn,
    )


def _width(mlp: nn.Module) -> int:
    down = next((m for n, m in mlp.named_children() if n in ("down_proj", "w2", "fc2")), None)
    if down is None:
        raise ValueError(f"the shared expert {type(mlp).__name__} has no down projection")
    return int(down.weight.shape[1])


def _field(config: Any, names: tuple[str, ...], value: int | None, what: str) -> str:
    """The first of `names` the config sets (to `value`, when given)."""
    for name in names:
        if getattr(config, name, None) is not None and value in (None, getattr(config, name)):
            return name
    raise ValueError(f"no config field gives the {what} ({value}): tried {names}")


def _saved_names(
    twin: nn.Module, prefix: str, router_shape: tuple[int, int]
) -> tuple[tuple[str, str, str] | None, tuple[str, str] | None, str, str | None]:
    """How `save_pretrained` writes the first layer's mixture (its own names: a file's
    layout may rename the block): the experts per expert (the gate, up and down names with
    `{expert}`) or stacked (two names), the router's weight, the shared expert's prefix; all
    relative to the layer."""
    shapes: dict[str, tuple[int, ...]] = {}
    with tempfile.TemporaryDirectory(prefix="hookedattn-experts-") as folder:
        logging = _loading.transformers_module().utils.logging
        shown = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()
        try:
            twin.save_pretrained(folder)
        finally:
            if shown:
                logging.enable_progress_bar()
        for path in sorted(Path(folder).glob("*.safetensors")):
            with safe_open(path, "pt") as file:
                for name in file.keys():  # noqa: SIM118 - not iterable itself
                    if name.startswith(prefix):
                        shape = tuple(file.get_slice(name).get_shape())
                        shapes[name.removeprefix(prefix)] = shape
    routers = [
        n for n, shape in shapes.items()
        if shape == router_shape and "expert" not in n and n.endswith(".weight")
    ]  # fmt: skip
    if len(routers) != 1:
        raise ValueError(f"the router is saved under names not recognised: {routers}")
    shared = sorted({n.rsplit(".", 2)[0] for n in shapes if "shared" in n and "gate." not in n})
    files, stacked = None, None
    for gate, up, down in _FILE_NAMES:
        first = [n for n in shapes if n.endswith(f"experts.0.{gate}.weight")]
        if first:
            block = first[0].removesuffix(f"0.{gate}.weight")
            files = tuple(f"{block}{{expert}}.{p}.weight" for p in (gate, up, down))
            break
    else:
        three_d = sorted(n for n, shape in shapes.items() if len(shape) == 3)
        if len(three_d) != 2:
            raise ValueError(f"the experts are saved under names not recognised: {three_d}")
        stacked = (three_d[0], three_d[1])
    return files, stacked, routers[0], shared[0] if len(shared) == 1 else None
