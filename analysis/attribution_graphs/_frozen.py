"""The replacement model linearised on one prompt (`docs/guide/transcoders.md`): attention
patterns, norm scales, error terms and feature activations frozen at their forward's values.
The patterns are kept as the queries and keys they are made from, their rows made again a
block at a time where a transposed map reads them (`_patterns`): what a frozen forward
holds grows linearly with the prompt.

With the patterns and scales fixed, everything between the features is linear: a norm is
`w ⊙ centre(x) / s + b` (no centring for RMS), an attention layer is
`Σ_h A_h (ln1(x) W_V[h] + b_V[h]) W_O[h] + b_O`, and the residual stream adds. What a
target reads is then an affine function of what the sources wrote:

    target = Σ_sources g(source's point) · source's write  +  bias

where `g` is the gradient of the target with respect to the stream at the point where the
source writes (found by running the transposed maps down from the target: `sweep`), and
`bias` collects every constant term on the way (norm biases, `b_V` through each pattern row,
`b_O`, the transcoders' `b_dec`, a skip term's share of `ln2`'s bias, the target's own
`b_enc` or `b_U`). The sources write at these points:

- an input token (with its positional embedding, when the model has one): into the stream
  entering block 0 (`blocks.0.hook_resid_pre`);
- a feature of layer `l`: into the MLP output of each layer it writes to (`l` alone, or
  `l..n-1` for a cross-layer transcoder), i.e. the stream after that block;
- an error node `(l, p)`: into the MLP output of layer `l` at position `p`.

The MLPs themselves are not on any path: in the replacement model their output is the
features' writes plus the error term (a skip transcoder's linear skip is, as a map from
the MLP's input to its output).
"""

import dataclasses
from typing import Any

import torch
from einops import einsum, rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from analysis.attribution_graphs import _patterns
from hookedattn.core import is_text
from hookedattn.core.components.norm import LayerNormPre, NoNorm
from hookedattn.core.names import get_act_name
from hookedattn.sae import TranscoderSet, replaced

Stream = Float[Tensor, "target pos d_model"]


@dataclasses.dataclass(frozen=True)
class AttentionWeights:
    """One attention layer's weights that the linearisation reads, whole (every head; on a
    tensor-parallel model gathered from the ranks) and detached."""

    W_V: Float[Tensor, "head d_model d_head"]
    b_V: Float[Tensor, "head d_head"]
    W_O: Float[Tensor, "head d_head d_model"]
    b_O: Float[Tensor, " d_model"]


@dataclasses.dataclass(frozen=True)
class Frozen:
    """What one forward of the replacement model fixed (batch of one, batch axis dropped)."""

    tset: TranscoderSet
    n_layers: int
    tokens: Int[Tensor, " pos"]
    logits: Float[Tensor, "pos d_vocab_out"]
    embed: Float[Tensor, "pos d_model"]
    scores: tuple[_patterns.FrozenScores, ...]  # each layer's pattern, as its q and k
    ln1: tuple[nn.Module, ...]
    ln2: tuple[nn.Module, ...]
    ln_final: nn.Module
    scale1: tuple[Tensor | None, ...]  # None where the model has no norm
    scale2: tuple[Tensor | None, ...]
    scale_final: Tensor | None
    reads_normed: tuple[bool, ...]
    acts: tuple[Float[Tensor, "pos _"], ...]  # d_sae may differ between layers
    pre: tuple[Float[Tensor, "pos _"], ...]
    errors: tuple[Float[Tensor, "pos d_model"], ...]
    attn: tuple[AttentionWeights, ...]
    attn_constants: tuple[Float[Tensor, "pos d_model"], ...]  # `attention_constant`
    W_U: Float[Tensor, "d_model d_vocab_out"]
    b_U: Float[Tensor, " d_vocab_out"]


def prompt_tokens(model: Any, prompt: Any) -> Int[Tensor, " pos"]:
    """The token ids of one prompt: text through the model's tokenizer, or ids `[pos]`,
    `[1 pos]`."""
    tokens = model.to_tokens(prompt) if is_text(prompt) else torch.as_tensor(prompt)
    if (
        tokens.dtype.is_floating_point
        or tokens.ndim not in (1, 2)
        or (tokens.ndim == 2 and tokens.shape[0] != 1)
    ):
        raise ValueError(
            f"prompt must be text or the token ids of one sequence ([pos] or [1 pos]), "
            f"got {tuple(tokens.shape)} {tokens.dtype}"
        )
    return tokens.reshape(-1)


def token_texts(model: Any, ids: list[int]) -> list[str]:
    """The tokens as text (their ids as text when the model has no tokenizer)."""
    if getattr(model, "tokenizer", None) is None:
        return [str(i) for i in ids]
    return [str(s) for s in model.to_str_tokens(torch.tensor(ids))]


def prompt_text(model: Any, tokens: Int[Tensor, " pos"]) -> str:
    """The prompt of token ids as text: decoded by the model's tokenizer (as circuit-tracer
    decodes its input), or without one the ids' texts joined by spaces."""
    if getattr(model, "tokenizer", None) is None:
        return " ".join(token_texts(model, tokens.tolist()))
    return str(model.to_string(tokens))


def check_model(model: nn.Module, tset: TranscoderSet) -> None:
    """Refuse the model shapes whose linearisation this module does not write out."""
    cfg = model.cfg
    cfg.require_attention("an attribution graph (attention frozen head by head)")
    problems = {
        "attn_only": "an attention-only model has no MLPs to replace",
        "parallel_attn_mlp": "parallel blocks (the MLP reads resid_pre) are not supported",
        "use_split_qkv_input": "per-head q/k/v inputs are not supported",
        "use_attn_in": "per-head attention inputs are not supported",
    }
    for field, why in problems.items():
        if getattr(cfg, field, False):
            raise ValueError(f"attribution graphs: {why} ({field}=True)")
    if getattr(cfg, "index_topk", None) is not None:
        raise ValueError(
            f"attribution graphs: a lightning indexer's choice of keys (index_topk="
            f"{cfg.index_topk}) is not kept with the frozen patterns, which are made again "
            f"from the queries and keys without it"
        )
    if cfg.placements != ("pre",):
        raise ValueError(
            f"attribution graphs need norms before the sublayers only, not "
            f"normalization_placement={cfg.normalization_placement!r} "
            f"(placement_layers={cfg.placement_layers})"
        )
    if tset.layers != tuple(range(cfg.n_layers)):
        raise ValueError(
            f"an attribution graph replaces every MLP: the transcoders cover layers "
            f"{tset.layers}, the model has {cfg.n_layers}"
        )
    for layer in tset.layers:
        allowed = (f"blocks.{layer}.ln2.hook_out", f"blocks.{layer}.hook_resid_mid")
        if tset.input_hook(layer) not in allowed or tset.output_hook(layer) != get_act_name(
            "mlp_out", layer
        ):
            raise ValueError(
                f"layer {layer}'s transcoder maps {tset.input_hook(layer)} to "
                f"{tset.output_hook(layer)}; a graph needs one of {allowed} to "
                f"blocks.{layer}.hook_mlp_out"
            )


def _names_kept(model: nn.Module) -> list[str]:
    """The hook names whose values the linearisation fixes or reads."""
    n = model.cfg.n_layers
    per_layer = ["attn.hook_q", "attn.hook_k", "ln1.hook_scale", "ln2.hook_scale"]
    per_layer += [f"transcoder.{h}" for h in ("hook_in", "hook_acts", "hook_error")]
    names = [f"blocks.{layer}.{h}" for layer in range(n) for h in per_layer]
    return [*names, "ln_final.hook_scale", "blocks.0.hook_resid_pre"]


@torch.no_grad()
def freeze(
    model: nn.Module,
    tset: TranscoderSet,
    tokens: Int[Tensor, " pos"],
    pattern_bytes: int = _patterns.PATTERN_BYTES,
) -> Frozen:
    """Run the replacement model (error terms kept: the model's own forward) on `tokens`
    and keep what the linearisation fixes: nothing of size `pos²` (no hook on the
    patterns, so a fused kernel may run; their rows are made again in blocks of at most
    `pattern_bytes`, `_patterns`)."""
    n = model.cfg.n_layers
    with replaced(model, tset):
        wanted = [name for name in _names_kept(model) if name in model.hook_dict]
        logits, cache = model.run_with_cache(tokens[None], names_filter=wanted)

    def per_layer(hook: str) -> tuple[Tensor | None, ...]:
        names = [f"blocks.{layer}.{hook}" for layer in range(n)]
        return tuple(cache[name][0] if name in cache else None for name in names)

    inputs = per_layer("transcoder.hook_in")
    blocks = model.blocks
    f = Frozen(
        tset=tset, n_layers=n, tokens=tokens, logits=logits[0],
        embed=cache["blocks.0.hook_resid_pre"][0],
        scores=_patterns.frozen_scores(model, cache, len(tokens), pattern_bytes),
        ln1=tuple(b.ln1 for b in blocks), ln2=tuple(b.ln2 for b in blocks),
        ln_final=model.ln_final, scale1=per_layer("ln1.hook_scale"),
        scale2=per_layer("ln2.hook_scale"),
        scale_final=cache["ln_final.hook_scale"][0] if "ln_final.hook_scale" in cache else None,
        reads_normed=tuple(tset.input_hook(i).endswith("ln2.hook_out") for i in range(n)),
        acts=per_layer("transcoder.hook_acts"),
        pre=tuple(tset.pre_activations(i, x) for i, x in enumerate(inputs)),
        errors=per_layer("transcoder.hook_error"), attn=attention_weights(model),
        attn_constants=(), W_U=model.W_U.detach(), b_U=model.b_U.detach(),
    )  # fmt: skip
    constants = tuple(_attention_constant(f, layer) for layer in range(n))
    return dataclasses.replace(f, attn_constants=constants)


def attention_weights(model: nn.Module) -> tuple[AttentionWeights, ...]:
    """Every layer's `AttentionWeights`: a split model's heads gathered from its ranks."""
    return tuple(
        AttentionWeights(
            *(model.layer_weight(layer, "attn", w).detach() for w in ("W_V", "b_V", "W_O")),
            model.blocks[layer].attn.b_O.detach(),
        )
        for layer in range(model.cfg.n_layers)
    )


def prefix(f: Frozen, m: int) -> Frozen:
    """The frozen forward on the prompt's first `m` positions. Attention is causal, so this
    is what the same forward fixes on the shorter prompt: targets at positions below `m`
    are swept on it alone (the gradients at later positions are zero)."""
    if m == len(f.tokens):
        return f

    def cut(x: Tensor | None) -> Tensor | None:
        return None if x is None else x[:m]

    return dataclasses.replace(
        f, tokens=f.tokens[:m], logits=f.logits[:m], embed=f.embed[:m],
        scores=tuple(s.prefix(m) for s in f.scores), scale1=tuple(map(cut, f.scale1)),
        scale2=tuple(map(cut, f.scale2)), scale_final=cut(f.scale_final),
        acts=tuple(a[:m] for a in f.acts), pre=tuple(a[:m] for a in f.pre),
        errors=tuple(e[:m] for e in f.errors),
        attn_constants=tuple(c[:m] for c in f.attn_constants),
    )  # fmt: skip


# ---------------------------------------------------------------------- transposed maps
def norm_transpose(norm: nn.Module, g: Stream, scale: Tensor | None) -> Stream:
    """The gradient through a norm with its scale frozen: `centre(w ⊙ g) / s`."""
    if isinstance(norm, NoNorm):
        return g
    w = getattr(norm, "w", None)
    if w is not None:
        g = g * w.detach()
    if isinstance(norm, LayerNormPre):
        g = g - g.mean(-1, keepdim=True)
    return g / scale


def norm_bias(norm: nn.Module) -> Tensor | float:
    """The constant a norm adds (its `b`, or nothing)."""
    b = getattr(norm, "b", None)
    return 0.0 if b is None else b.detach()


def attention_transpose(f: Frozen, layer: int, g: Stream) -> Stream:
    """The gradient at the stream entering block `layer`, through its attention (pattern and
    `ln1` scale frozen), from the gradient `g` at the attention's output. The pattern's
    rows come a block at a time, only the blocks where some target's `g` is not zero."""
    attn, scores = f.attn[layer], f.scores[layer]
    n_targets = len(g)
    g_z = rearrange(einsum(g, attn.W_O, "t q d, h e d -> t q h e"), "t q h e -> h q (t e)")
    g_v = torch.zeros_like(g_z)  # h k (t e)
    live = g.ne(0).any(-1).any(0)
    for start, stop in scores.blocks(live):
        rows = scores.rows(start, stop)  # h q k
        # g_v[h, k] += Σ_q rows[h, q, k] g_z[h, q], in place: no block-sized temporary
        g_v[:, :stop].baddbmm_(rows.transpose(1, 2), g_z[:, start:stop])
    g_v = rearrange(g_v, "h k (t e) -> t k h e", t=n_targets)
    g_in = einsum(g_v, attn.W_V, "t k h e, h d e -> t k d")
    return norm_transpose(f.ln1[layer], g_in, f.scale1[layer])


def attention_constant(f: Frozen, layer: int) -> Float[Tensor, "pos d_model"]:
    """What block `layer`'s attention writes whatever its input: `ln1`'s bias and `b_V`
    carried by each pattern row (which sums to one, to rounding), and `b_O` (made once, by
    `freeze`)."""
    return f.attn_constants[layer]


def _attention_constant(f: Frozen, layer: int) -> Float[Tensor, "pos d_model"]:
    attn = f.attn[layer]
    value_bias = einsum(norm_bias(f.ln1[layer]) + torch.zeros_like(f.embed[0]),
                        attn.W_V, "d, h d e -> h e") + attn.b_V  # fmt: skip
    per_head = einsum(value_bias, attn.W_O, "h e, h e d -> h d")
    rows = f.scores[layer].row_sums()  # head pos
    return einsum(rows, per_head, "h q, h d -> q d") + attn.b_O


def input_transpose(f: Frozen, layer: int, g: Float[Tensor, "target pos d_in"]) -> Stream:
    """The gradient at `resid_mid` of block `layer` from one at the transcoder's input."""
    if not f.reads_normed[layer]:
        return g
    return norm_transpose(f.ln2[layer], g, f.scale2[layer])


def input_constant(f: Frozen, layer: int) -> Tensor | float:
    """The constant the transcoder's input carries (`ln2`'s bias, if it reads `ln2`)."""
    return norm_bias(f.ln2[layer]) if f.reads_normed[layer] else 0.0


def skip_transpose(f: Frozen, layer: int, g: Stream) -> Stream | None:
    """The gradient at `resid_mid` through layer `layer`'s skip term (None without one)."""
    W_skip = f.tset.W_skip(layer)
    if W_skip is None:
        return None
    return input_transpose(f, layer, einsum(g, W_skip.detach(), "t p o, o i -> t p i"))


def mlp_constant(f: Frozen, layer: int) -> Float[Tensor, " d_model"]:
    """What layer `layer`'s replaced MLP writes whatever its features: `b_dec`, and the skip
    term's image of the input's constant."""
    constant = f.tset.b_dec(layer).detach()
    W_skip = f.tset.W_skip(layer)
    if W_skip is not None:
        c = input_constant(f, layer)
        if isinstance(c, Tensor):
            constant = constant + einsum(c, W_skip.detach(), "i, o i -> o")
    return constant


@dataclasses.dataclass(frozen=True)
class Sweep:
    """The gradients of a batch of targets at every point below them: `post[l]` at the
    stream after block `l` (where layer `l`'s MLP writes), `mid[l]` at `resid_mid` of block
    `l` (where its attention writes), `embed` at the stream entering block 0."""

    post: dict[int, Stream]
    mid: dict[int, Stream]
    embed: Stream


def sweep(f: Frozen, g: Stream, reads_mid_of: int | None) -> Sweep:
    """Run the transposed maps down from targets that read `resid_mid` of block
    `reads_mid_of` (features), or the final stream (None: logits), seeded with `g`."""
    post: dict[int, Stream] = {}
    mid: dict[int, Stream] = {}
    top = f.n_layers - 1 if reads_mid_of is None else reads_mid_of
    if reads_mid_of is None:
        post[top] = g
        g = _through_mlp(f, top, g)
    for layer in range(top, -1, -1):
        mid[layer] = g
        g = g + attention_transpose(f, layer, g)
        if layer > 0:
            post[layer - 1] = g
            g = _through_mlp(f, layer - 1, g)
    return Sweep(post, mid, g)


def _through_mlp(f: Frozen, layer: int, g: Stream) -> Stream:
    """From the stream after block `layer` to its `resid_mid`: the residual, plus the skip."""
    skipped = skip_transpose(f, layer, g)
    return g if skipped is None else g + skipped
