"""What a decoder layer's pieces are, by their names and their modules' types.

The names architectures give each linear map (`ATTENTION_ROLES`, `MLP_ROLES`) and each
sublayer (`ATTENTION_NAMES`, `MLP_NAMES`), and the readers `_anatomy` asks of one module at
a time: which child is the attention or the MLP, each weight-bearing child's role, the q/k
norms and whether they act per head, the head width and the softmax scale. Nothing here
runs a model; `_wiring` reads what the twin's run passed between the pieces.
"""

from typing import Any

from torch import nn

# A linear map's role -> the names architectures give it.
ATTENTION_ROLES: dict[str, tuple[str, ...]] = {
    "q": ("q_proj", "query", "wq", "q", "Wq"),
    "k": ("k_proj", "key", "wk", "k", "Wk"),
    "v": ("v_proj", "value", "wv", "v", "Wv"),
    "o": ("o_proj", "out_proj", "dense", "wo", "o", "o_linear", "c_proj", "Wo"),
    # [q; k; v] along the outputs, or [q_h; k_h; v_h] head by head (`Anatomy.qkv_layout`)
    "qkv": ("qkv_proj", "Wqkv", "qkv", "wqkv", "c_attn", "query_key_value"),
    "gate": ("g_proj", "gate_proj"),  # an output gate's own map (Laguna, AFMoE)
    "q_gate": ("q_gate_proj",),  # [q_h; gate_h] for each head h (MiniCPM 5 MoE)
}
MLP_ROLES: dict[str, tuple[str, ...]] = {
    "gate": ("gate_proj", "w1", "wi_0"),
    # "0", "2": an `nn.Sequential` of a map, the activation and a map (CTRL's `ffn`)
    "up": ("up_proj", "w3", "wi_1", "fc1", "fc_in", "c_fc", "dense_h_to_4h", "0"),
    "down": ("down_proj", "w2", "wo", "fc2", "fc_out", "c_proj", "dense_4h_to_h", "2", "Wo"),
    "gate_up": ("gate_up_proj", "Wi"),  # [gate; up] along the outputs (ModernBERT's Wi)
}
# Llama 4's `qk_norm`: one weightless norm the queries and the keys both go through.
QK_NORMS = {"q_norm": ("q_norm", "query_layernorm", "q_layernorm", "qk_norm"),
            "k_norm": ("k_norm", "key_layernorm", "k_layernorm", "qk_norm")}  # fmt: skip
ATTENTION_NAMES = ("self_attn", "attention", "attn", "self_attention")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mlp_block")


def child(children: dict[str, nn.Module], names: tuple[str, ...], kind: str, what: str) -> str:
    """The one child named one of `names` (else whose type ends in `kind`); a ValueError
    naming what was found when there is not exactly one."""
    found = [n for n in names if n in children]
    found = found or [n for n, m in children.items() if type(m).__name__.endswith(kind)]
    if len(found) != 1:
        raise ValueError(f"a decoder layer holds {len(found)} {what}s ({found}); one recognised")
    return found[0]


def mlp_child(children: dict[str, nn.Module]) -> str:
    """The MLP sublayer's name; "" where the layer holds its MLP's maps itself."""
    if flat_mlp(children):
        return ""
    return child(children, MLP_NAMES, "MLP", "MLP sublayer")


def flat_mlp(children: dict[str, nn.Module]) -> tuple[str, ...]:
    """The names of an MLP's input and output maps held by the layer itself (BioGPT,
    Whisper's decoder: `fc1`, `fc2`), or ()."""
    if any(n in children for n in MLP_NAMES):
        return ()
    up = next((n for n in MLP_ROLES["up"] if n in children), None)
    down = next((n for n in MLP_ROLES["down"] if n in children), None)
    return (up, down) if up and down else ()


def is_cross(name: str) -> bool:
    """Whether a layer's child is cross-attention (fed by an encoder) by its name."""
    return "encoder" in name or "cross" in name


def is_norm(module: nn.Module) -> bool:
    """Whether a module is a norm, by its type's name."""
    return "norm" in type(module).__name__.lower()


def qk_norms(attn: nn.Module) -> tuple[str, str] | None:
    """The names of the attention's query and key norms; None without them."""
    children = dict(attn.named_children())
    q = next((n for n in QK_NORMS["q_norm"] if n in children), None)
    k = next((n for n in QK_NORMS["k_norm"] if n in children), None)
    if (q is None) != (k is None):
        raise ValueError("a norm of the queries or the keys, not both: not recognised")
    return None if q is None else (q, k)


def qk_norm_kind(attn: nn.Module, names: tuple[str, str] | None, d_head: int) -> str | None:
    """ "per_head" or "whole" (over the projection), by the width of the norms' gains."""
    if names is None:
        return None
    gain = getattr(getattr(attn, names[0]), "weight", None)
    if gain is None:
        return "per_head"  # without parameters: per head (the verification will tell)
    width = gain.shape
    if tuple(width) == (d_head,):
        return "per_head"
    if len(width) == 1 and width[0] % d_head == 0 and width[0] > d_head:
        return "whole"
    raise ValueError(f"q/k norm gains of shape {tuple(width)}: neither one head's nor all heads'")


def linear_maps(
    module: nn.Module,
    roles: dict[str, tuple[str, ...]],
    skip: tuple[str, ...],
    own_allowed: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
) -> tuple[tuple[str, str, bool], ...]:
    """Each weight-bearing child (of those named `only`, when given) as (role, name, has a
    bias): every one must have a role, and a module must hold no parameter of its own but
    those `own_allowed`."""
    own = [n for n, _ in module.named_parameters(recurse=False) if n not in own_allowed]
    if own:
        raise ValueError(f"{type(module).__name__} holds parameters not recognised: {own}")
    found = []
    for name, child in module.named_children():
        if name in skip or (only is not None and name not in only):
            continue
        if not any(True for _ in child.parameters()):
            continue
        role = next((r for r, names in roles.items() if name in names), None)
        if role is None or not isinstance(child, nn.Linear):  # a subclass: verified anyway
            raise ValueError(f"{type(module).__name__}.{name} ({type(child).__name__}) has no role")
        found.append((role, name, child.bias is not None))
    return tuple(found)


def attention_head_width(attn: nn.Module, config: Any) -> int:
    """The attention's head width: its own `head_dim`, the config's, or d_model / heads."""
    d_head = getattr(attn, "head_dim", None) or getattr(config, "head_dim", None)
    return int(d_head or config.hidden_size // config.num_attention_heads)


def attention_scaling(attn: nn.Module, d_head: int) -> float | None:
    """The softmax scale the attention keeps (`scaling`), None where it keeps none (the
    verification then chooses among the usual ones); a ValueError if it is not causal."""
    if not getattr(attn, "is_causal", True):
        raise ValueError(f"{type(attn).__name__} is not causal")
    scaling = getattr(attn, "scaling", None)
    return None if scaling is None else float(scaling)


def unwrapped_attention(attn: nn.Module) -> tuple[str, nn.Module]:
    """The module that holds the attention's maps, and its name under `attn`: `attn` itself
    ("", attn), or the one attention it wraps (GPT-Neo's `attn.attention`)."""
    own = [n for n, m in attn.named_children() if isinstance(m, nn.Linear)]
    inner = [(n, m) for n, m in attn.named_children() if type(m).__name__.endswith("Attention")]
    if own or len(inner) != 1:
        return "", attn
    return f".{inner[0][0]}", inner[0][1]


def gated_queries(
    maps: tuple[tuple[str, str, bool], ...], attn: nn.Module, n_heads: int, d_head: int
) -> tuple[tuple[tuple[str, str, bool], ...], bool | None]:
    """The maps with a query projection twice as wide as the heads relabelled `q_gate`
    (Qwen3-Next's `q_proj`: `[q_h; gate_h]` per head), and whether the output gate gives
    one factor per head (True), one per dimension (False), or there is none (None)."""
    widths = {name: getattr(attn, name).out_features for _, name, _ in maps}
    relabel = (
        {"q": "q_gate"}
        if any(r == "q" and widths[n] == 2 * n_heads * d_head for r, n, _ in maps)
        else {}
    )
    maps = tuple((relabel.get(r, r), n, bias) for r, n, bias in maps)
    roles = {r: n for r, n, _ in maps}
    if "gate" in roles:
        width = widths[roles["gate"]]
        if width not in (n_heads, n_heads * d_head):
            raise ValueError(
                f"an output gate {width} wide: neither one per head ({n_heads}) nor one per "
                f"dimension ({n_heads * d_head})"
            )
        return maps, width == n_heads
    return maps, (False if "q_gate" in roles else None)


def latent_gate(
    attn: nn.Module, n_heads: int
) -> tuple[tuple[tuple[str, str, bool], ...], bool | None]:
    """A latent attention's output gate, as `gated_queries` gives it: its own map (one of
    the "gate" role's names) as the only map read here, one factor per head (Bailing
    Hybrid's `g_proj`); nothing where it has none. A gate of another width is refused."""
    maps = [n for n in ATTENTION_ROLES["gate"] if isinstance(getattr(attn, n, None), nn.Linear)]
    if not maps:
        return (), None
    name, gate = maps[0], getattr(attn, maps[0])
    if gate.out_features != n_heads:
        raise ValueError(
            f"a latent attention's output gate {name} {gate.out_features} wide: only one "
            f"factor per head ({n_heads}) is recognised"
        )
    return (("gate", name, gate.bias is not None),), True
