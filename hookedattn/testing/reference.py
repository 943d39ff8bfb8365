"""The independent reference: a model's weights run by a hook-free forward in plain torch.

    logits = reference_forward(model, tokens)        # what model(tokens) must give
    reference = ReferenceTransformer(model)          # the weights laid out once, then
    logits = reference(tokens)                       # called like a model

It follows the usual hand-written recipe (the one the project's worklog derives,
`docs/guide/worklog.md`) rather than the model's code: one `[d_model, n_heads * d_head]`
matrix per projection, `view` + `transpose` to split the heads, the heads
concatenated and multiplied by one `[n_heads * d_head, d_model]` output matrix, the causal
mask by `masked_fill`, the norms and rotary written out. It shares no module, layout or
einsum with `HookedTransformer`, so a test of the model against it is a test of the math.
The weights are copied and laid out when it is built, so that timing a call (as `scripts/bench`
does, for "the same math without hook points") times the forward alone.

It covers the block shape of the GPT-2 family and its common options: LN, LNPre, RMS,
RMSPre or no norm before each sublayer; learned, rotary (GPT-NeoX rotate-half, partial
`rotary_dim`) or no positions; attention-only models; relu, gelu, gelu_new and silu MLPs,
plain or gated; grouped keys and values (`repeat_interleave` over the heads); parallel
attention and MLP; any `d_head` and `d_vocab_out`. A config outside it is refused, naming
the fields.

Its constants (the attention scale, the norms' epsilon, the rotary base) are the published
ones (`hookedattn.testing.published`), not the model's config: a model whose config differs
is refused, naming the constant, unless the caller states it
(`ReferenceTransformer(model, published_constants(d_head, eps=1e-6))`), so that a wrong
default in the config cannot move the model and its reference together.
"""

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.core.model import HookedTransformer
from hookedattn.testing.published import Constants, gelu_tanh, published_constants

# (field, the value the reference supports): every other value builds a block the reference
# does not write out.
_SUPPORTED = (
    ("normalization_placement", "pre"),
    ("placement_layers", None),
    ("embed_norm", False),
    ("unembed_transform", None),
    ("use_qk_norm", False),
    ("attn_scores_soft_cap", None),
    ("output_logits_soft_cap", None),
    ("window_size", None),
    ("attn_types", None),
    ("rotary_layers", None),
    ("rotary_scaling_factor", 1.0),
    ("rotary_pairs", None),
    ("use_NTK_by_parts_rope", False),
)


def _checked(constants: Constants, cfg: Any) -> Constants:
    """`constants`, if the model's config agrees with them; else a `ValueError` naming each
    constant on which it does not."""
    disagree = constants.disagreements(cfg)
    if disagree:
        raise ValueError(
            "the model's config disagrees with the constants the reference uses:\n  "
            + "\n  ".join(disagree)
            + "\nFor a model that sets its own, state them from its source: "
            "ReferenceTransformer(model, published_constants(d_head, eps=...))"
        )
    return constants


class ReferenceTransformer:
    """A model's weights in the worklog's layout, and the forward written out over them.

    `constants` are the attention scale, the norms' epsilon and the rotary base it computes
    with: `published_constants(d_head)` unless given. A model whose config disagrees with
    them is refused (`ValueError`, naming each constant).
    """

    # Subclasses may swap one for an equal kernel (the bench times torch's one-kernel gelu).
    activations: ClassVar[dict[str, Callable[[Tensor], Tensor]]] = {
        "relu": F.relu,
        "gelu": F.gelu,
        "silu": F.silu,
        "gelu_new": gelu_tanh,
    }

    def __init__(self, model: HookedTransformer, constants: Constants | None = None) -> None:
        cfg = model.cfg
        unsupported = [f"{f}={getattr(cfg, f)!r}" for f, v in _SUPPORTED if getattr(cfg, f) != v]
        # TransformerLens's toy-model variants (tests/core/test_toy_variants.py writes them out).
        if cfg.positional_embedding_type in ("shortformer", "alibi"):
            unsupported.append(f"positional_embedding_type={cfg.positional_embedding_type!r}")
        if cfg.has_mlp and cfg.act_fn not in self.activations:
            unsupported.append(f"act_fn={cfg.act_fn!r}")
        if unsupported:
            raise NotImplementedError(
                f"the reference forward writes out pre-norm blocks with plain attention and "
                f"MLPs; this config has {', '.join(unsupported)}"
            )
        self.constants = _checked(constants or published_constants(cfg.d_head), cfg)
        self.cfg = cfg
        # A copy: the reference is the weights as they were when it was built.
        w = {name: t.detach().clone() for name, t in model.state_dict().items()}
        self.W_E = w["embed.W_E"]
        self.W_pos = (
            w.get("pos_embed.W_pos") if cfg.positional_embedding_type == "standard" else None
        )
        self.layers = [self._layer(w, f"blocks.{i}.") for i in range(cfg.n_layers)]
        self.ln_final = self._norm(w, "ln_final.")
        self.W_U, self.b_U = w["unembed.W_U"], w["unembed.b_U"]
        self.act = self.activations[cfg.act_fn]
        self.blocked = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool, device=cfg.device).triu(1)
        self.cos, self.sin = (
            self._rotary_angles() if cfg.positional_embedding_type == "rotary" else (None, None)
        )

    def _norm(self, w: dict[str, Tensor], prefix: str) -> dict[str, Any] | None:
        """The norm's gain and bias (absent ones None); None for no norm."""
        if self.cfg.normalization_type is None:
            return None
        return {"w": w.get(prefix + "w"), "b": w.get(prefix + "b")}

    def _layer(self, w: dict[str, Tensor], p: str) -> dict[str, Any]:
        """One block's weights: each projection one matrix over every head (over every
        key/value head for keys and values: the stored `_W_K`, `_W_V` of grouped attention)."""
        d_model = self.cfg.d_model
        kv = "attn._" if p + "attn._W_K" in w else "attn."

        def flat(name: str) -> Tensor:  # [head d_model d_head] -> [d_model (head d_head)]
            return w[p + name].permute(1, 0, 2).reshape(d_model, -1)

        layer = {
            "ln1": self._norm(w, p + "ln1."),
            "W_Q": flat("attn.W_Q"), "W_K": flat(kv + "W_K"), "W_V": flat(kv + "W_V"),
            "b_Q": w[p + "attn.b_Q"].reshape(-1), "b_K": w[p + kv + "b_K"].reshape(-1),
            "b_V": w[p + kv + "b_V"].reshape(-1),
            "W_O": w[p + "attn.W_O"].reshape(-1, d_model), "b_O": w[p + "attn.b_O"],
        }  # fmt: skip
        if not self.cfg.attn_only:
            layer["ln2"] = self._norm(w, p + "ln2.")
            for name in ("W_in", "b_in", "W_out", "b_out", "W_gate", "b_gate"):
                if p + "mlp." + name in w:
                    layer[name] = w[p + "mlp." + name]
        return layer

    def _rotary_angles(self) -> tuple[Tensor, Tensor]:
        """cos and sin of every position's angles, `[pos rotary_dim]` (rotate-half halves).

        Frequencies in float32, as the reference implementations compute them (the numbers
        the checkpoints were trained with); angles and their cosines in float32, or in
        float64 for a float64 model."""
        r, base = self.cfg.rotary_dim, self.constants.rotary_base
        wide = self.cfg.dtype == torch.float64 and not self.cfg.rotary_table_float32
        exact = torch.float64 if wide or self.cfg.rotary_angles_float64 else torch.float32
        if self.cfg.rotary_angles_float64:  # RoFormer's: frequencies in float64 too
            inverse = 1.0 / base ** (torch.arange(0, r, 2).double() / r)
        else:
            inverse = (1.0 / base ** (torch.arange(0, r, 2).float() / r)).to(exact)
        angles = torch.arange(self.cfg.n_ctx).to(exact)[:, None] * inverse[None, :]
        angles = torch.cat([angles, angles], -1).to(self.cfg.device)
        cos, sin = angles.cos(), angles.sin()
        if self.cfg.rotary_table_float32:
            cos, sin = cos.float(), sin.float()
        return cos.to(self.cfg.dtype), sin.to(self.cfg.dtype)

    def norm(self, x: Float[Tensor, "batch pos d_model"], weights: dict | None) -> Tensor:
        """LayerNorm (mean removed) or RMSNorm, then the gain and bias where there are."""
        if weights is None:
            return x
        if self.cfg.normalization_type.startswith("LN"):
            x = x - x.mean(-1, keepdim=True)
        x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.constants.eps)
        if weights["w"] is not None:
            x = x * weights["w"]
        if weights["b"] is not None:
            x = x + weights["b"]
        return x

    def rotate(self, x: Float[Tensor, "batch head pos d_head"]) -> Tensor:
        """GPT-NeoX rotary on the first `rotary_dim` features (rotate-half)."""
        r, pos = self.cfg.rotary_dim, x.shape[2]
        cos, sin = self.cos[:pos], self.sin[:pos]
        rotated, passed = x[..., :r], x[..., r:]
        x1, x2 = rotated[..., : r // 2], rotated[..., r // 2 :]
        return torch.cat([rotated * cos + torch.cat([-x2, x1], -1) * sin, passed], -1)

    def attention(self, layer: dict, x: Float[Tensor, "batch pos d_model"]) -> Tensor:
        """Causal multi-head attention: split, attend, concatenate, project. Grouped keys
        and values are repeated for the query heads of their group (`h // group`)."""
        batch, pos, _ = x.shape
        d_head = self.cfg.d_head

        def heads(name: str) -> Tensor:  # [batch head pos d_head]
            y = x @ layer["W_" + name] + layer["b_" + name]
            y = y.view(batch, pos, -1, d_head).transpose(1, 2)
            return y.repeat_interleave(self.cfg.n_heads // y.shape[1], dim=1)

        q, k, v = heads("Q"), heads("K"), heads("V")
        if self.cos is not None:
            q, k = self.rotate(q), self.rotate(k)
        scores = (q @ k.transpose(-2, -1)) / self.constants.attn_scale
        pattern = torch.softmax(scores.masked_fill(self.blocked[:pos, :pos], -math.inf), dim=-1)
        z = (pattern @ v).transpose(1, 2).reshape(batch, pos, -1)
        return z @ layer["W_O"] + layer["b_O"]

    def mlp(self, layer: dict, x: Float[Tensor, "batch pos d_model"]) -> Tensor:
        """`act(x W_in + b_in) W_out + b_out`; gated: `(act(x W_gate + b_gate) * (x W_in +
        b_in)) W_out + b_out` (`b_gate` 0 where the gate has none)."""
        hidden = x @ layer["W_in"] + layer["b_in"]
        gate = x @ layer["W_gate"] + layer.get("b_gate", 0.0) if "W_gate" in layer else None
        hidden = self.act(hidden) if gate is None else hidden * self.act(gate)
        return hidden @ layer["W_out"] + layer["b_out"]

    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab_out"]:
        """The logits: embed, each block's residual additions, final norm, unembed."""
        x = self.W_E[tokens]
        if self.W_pos is not None:
            x = x + self.W_pos[: tokens.shape[1]]
        for layer in self.layers:
            attn_out = self.attention(layer, self.norm(x, layer["ln1"]))
            if self.cfg.attn_only:
                x = x + attn_out
            elif self.cfg.parallel_attn_mlp:  # GPT-NeoX, GPT-J: both read the block's input
                x = x + attn_out + self.mlp(layer, self.norm(x, layer["ln2"]))
            else:
                x = x + attn_out
                x = x + self.mlp(layer, self.norm(x, layer["ln2"]))
        return self.norm(x, self.ln_final) @ self.W_U + self.b_U


def reference_forward(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], constants: Constants | None = None
) -> Float[Tensor, "batch pos d_vocab_out"]:
    """`model(tokens)` computed independently: `ReferenceTransformer(model, constants)(tokens)`."""
    return ReferenceTransformer(model, constants)(tokens)
