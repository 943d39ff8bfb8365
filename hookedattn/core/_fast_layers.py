"""The equations of the model without its modules: what the fast decode step (`_decode`)
and the fast forward (`_fast_forward`) run where nothing is listening.

Each `Layer` is one block's residual-stream equations written against the block's own
weights and the components' own kernels (`kernels.normalize`, the kept fused q/k/v
product, `Rotary.rotate`, `kernels.fused_attention`, `Attention.written_out`, the MLP's
`F.linear` products), with no module call, no hook-point test and no per-layer
synchronisation:

    resid = resid_pre + ln1_post(attn(ln1(resid_pre)))      (+ the MLP, as the block says:
    resid = resid_mid + ln2_post(mlp(ln2(resid_mid)))         sequential, parallel, none)

A `Step` is what the layers of one pass share: the attention context (masks, positions),
the hook points recorded at (`tap`, the decode step's recording) and the sums that decide,
in one synchronisation per pass, whether every value was finite (`NotFiniteError`
otherwise, and the caller runs the hooked pass instead). `supported` says whether a model
is built only from the components these equations know; a model with a module of its own
in their place always runs through its modules.
"""

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core import kernels
from hookedattn.core.components.attention import Attention, GroupedQueryAttention
from hookedattn.core.components.block import AttnOnlyBlock, Block, ParallelBlock
from hookedattn.core.components.embed import Embed, PosEmbed, Unembed
from hookedattn.core.components.mlp import MLP, GatedMLP
from hookedattn.core.components.norm import LayerNorm, LayerNormPre, NoNorm, RMSNorm, RMSNormPre
from hookedattn.core.components.soft_cap import SoftCap
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCache

Resid = Float[Tensor, "batch pos d_model"]
_NORMS = (NoNorm, LayerNorm, LayerNormPre, RMSNorm, RMSNormPre)
_CAPS = (NoNorm, SoftCap)


class NotFiniteError(Exception):
    """A fast pass met a value that is not finite: undo it, run the hooked pass."""


class Step:
    """What every layer of one pass shares: the KV cache the layers extend (`cache`, None
    for none) and how many positions it held before; the attention context (positions per
    row and masks; None for an unpadded decode step whose layers all run fused, where every
    row is at position `past`); whether the pass is a decode step (`decoding`: its cache's
    past was checked to be finite before); the hook points recorded at (`taps`, by
    `record`) and the written-out records deferred."""

    def __init__(
        self,
        past: int,
        context: AttentionContext | None,
        taps: dict[str, Any],
        record: Callable | None,
        defers: bool = False,
        *,
        cache: KeyValueCache | None = None,
        decoding: bool = False,
    ) -> None:
        self.cache, self.decoding = cache, decoding
        self.past, self.context = past, context
        self.per_row = context is not None
        self.taps, self.record = taps, record
        # Whether written-out records wait for `Decoder.record_deferred`, and what waits.
        self.defers = defers
        self.deferred: list[tuple[Any, tuple]] = []

    def tap(self, name: str, x: Tensor, like: Tensor | None = None) -> Tensor:
        """`x`, recorded as the hook point `name` would record it, if it is one of the
        step's taps (`like`: the shape the hooked step has there, of which `x` is one row)."""
        point = self.taps.get(name)
        if point is not None:
            self.record(x if like is None else x.expand_as(like), point)
        return x

    def position_rows(self, W_pos: Float[Tensor, "n_ctx d_model"]) -> Tensor:
        """Each row's row of `W_pos` at its position: `[batch 1 d_model]`, or unpadded the
        one row `[1 d_model]` every row shares."""
        if self.per_row:
            return W_pos[self.context.positions]
        return W_pos.narrow(0, self.past, 1)

    def angle_rows(self, table: Float[Tensor, "1 n_pos 1 rot"]) -> Tensor:
        """Each row's entry of a rotary table at its position: `[batch 1 1 rot]`, or
        unpadded the one `[1 1 1 rot]` every row shares."""
        if self.per_row:
            return table[0][self.context.positions]
        return table.narrow(1, self.past, 1)


def module_hooked(modules: list[nn.Module]) -> bool:
    """Whether a torch hook (`register_forward_hook` and the like, forward or backward, on
    one of `modules` or globally) would run in the model's forward: the fast passes call no
    module, so then the hooked pass runs. (A hook point is called without
    `nn.Module.__call__`, so torch hooks on one never run, here or in the forward.)"""
    from torch.nn.modules import module

    if module._global_forward_hooks or module._global_forward_pre_hooks:
        return True
    if module._global_backward_hooks or module._global_backward_pre_hooks:
        return True
    return any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for m in modules
    )


def supported(model: Any) -> bool:
    """Whether the model is built only from the components the fast step knows (a model
    with a module of its own in their place runs the hooked step)."""
    if type(model.embed) is not Embed or type(model.unembed) is not Unembed:
        return False
    if hasattr(model, "pos_embed") and type(model.pos_embed) is not PosEmbed:
        return False
    if type(model.ln_final) not in _NORMS or type(model.unembed.soft_cap) not in _CAPS:
        return False
    return all(_supported_block(block) for block in model.blocks)


def _supported_block(block: Any) -> bool:
    if type(block) not in (AttnOnlyBlock, Block, ParallelBlock):
        return False
    attn = block.attn
    if type(attn) not in (Attention, GroupedQueryAttention) or type(attn.soft_cap) not in _CAPS:
        return False
    if attn.sinks is not None:  # a sink's extra logit in every row: the hooked step has it
        return False
    norms = [block.ln1, block.ln1_post, attn.q_norm, attn.k_norm]
    if type(block) is not AttnOnlyBlock:
        if type(block.mlp) not in (MLP, GatedMLP):
            return False
        norms += [block.ln2, block.ln2_post]
    return all(type(norm) in _NORMS for norm in norms)


def _is_point(block: Any, full_name: str, index: int) -> bool:
    """Whether `blocks.{index}.<path>` names a hook point of `block` (a norm that is the
    identity has none; a parallel block has no resid_mid)."""
    module = block
    for part in full_name.split(".")[2:]:
        module = module._modules.get(part) if hasattr(module, "_modules") else None
        if module is None:
            return False
    return isinstance(module, HookPoint)


def norm_step(norm: Any, name: str) -> Callable[[Tensor, "Step"], Tensor]:
    """The norm `name`'s output in a step, without its module call or `hook_out`; the
    identity for none."""
    if isinstance(norm, NoNorm):
        return _identity
    return _NormStep(norm, name)


def _identity(x: Tensor, step: "Step") -> Tensor:
    return x


class _NormStep:
    """A norm in a decode step: `kernels.normalize` (written out where its scale or
    normalised stream is recorded), or, where the step defers those records, the fused
    kernel, its input kept for `Decoder.record_deferred`."""

    def __init__(self, norm: Any, name: str) -> None:
        self.norm = norm
        self.inner = (f"{name}.hook_scale", f"{name}.hook_normalized")

    def __call__(self, x: Tensor, step: "Step") -> Tensor:
        norm = self.norm
        scale, normalized = self.inner
        if step.defers and norm.fused and (scale in step.taps or normalized in step.taps):
            step.deferred.append((norm, (x,)))
            return kernels.fused_normalize(norm, x)
        return kernels.normalize(norm, x)


class View:
    """A view of a weight (`W.T`), made again only when the weight is replaced or moved, or
    the autograd mode changes (a view made without grad carries none back to its weight):
    made at every step, a view is a dispatcher call, as costly on one token as a kernel."""

    def __init__(self, make: Callable[[Tensor], Tensor]) -> None:
        self.make = make
        self.weight: Tensor | None = None
        self.address = 0
        self.mode = (False, False)
        self.view: Tensor | None = None

    def __call__(self, weight: Tensor) -> Tensor:
        mode = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        if weight is not self.weight or weight.data_ptr() != self.address or mode != self.mode:
            self.weight, self.address, self.mode = weight, weight.data_ptr(), mode
            self.view = self.make(weight)
        return self.view


class RotaryTables:
    """Each rotary module's `cos` and `sin` for positions `0..capacity-1`, computed once by
    the module itself (`Rotary.cos_sin`, the numbers its forward uses)."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity, self.device = capacity, device
        self._tables: dict[int, tuple[Tensor, Tensor]] = {}

    def cos_sin(self, rotary: Any, step: Step, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """`cos` and `sin` at the step's positions, `[batch 1 1 rot]` (or `[1 1 1 rot]`)."""
        table = self._tables.get(id(rotary))
        if table is None or table[0].dtype != dtype:
            every = torch.arange(self.capacity, device=self.device)[None]
            table = self._tables[id(rotary)] = rotary.cos_sin(every, dtype)
        return step.angle_rows(table[0]), step.angle_rows(table[1])


class PositionAngles:
    """The rotary `cos` and `sin` of a pass over a whole sequence: the module's own, at the
    context's positions (`Rotary.cos_sin`, as its forward computes them)."""

    def cos_sin(self, rotary: Any, step: Step, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """`cos` and `sin` at every position of the pass, `[batch pos 1 rot]`."""
        return rotary.cos_sin(step.context.positions, dtype)


class Layer:
    """One block's equations over a decode step's one new position or over a sequence, the
    new keys and values appended to the step's KV cache (if any); the block's shape picks
    its equation when this is built. `tables`: the rotary angles (`RotaryTables` or
    `PositionAngles`)."""

    def __init__(
        self, block: Any, index: int, tables: "RotaryTables | PositionAngles", cfg: Any
    ) -> None:
        attn = block.attn
        # The hook points this step records at, where the components' hook points are.
        self.at = {
            name: f"blocks.{index}.{name}"
            for name in (
                *("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out"),
                *("hook_mlp_out", "ln1.hook_out", "ln1_post.hook_out", "ln2.hook_out"),
                *("ln2_post.hook_out", "attn.hook_q", "attn.hook_k", "attn.hook_v"),
                *("attn.q_norm.hook_out", "attn.k_norm.hook_out", "attn.hook_rot_q"),
                *("attn.hook_rot_k", "attn.hook_z", "mlp.hook_pre", "mlp.hook_pre_linear"),
                *("mlp.hook_post", "attn.hook_attn_scores", "attn.hook_pattern"),
            )
        }
        # Recorded by the norms' written-out equations (`kernels.normalize`), not tapped.
        norms = ("ln1", "ln1_post", "ln2", "ln2_post", "attn.q_norm", "attn.k_norm")
        inner = [f"{norm}.{point}" for norm in norms for point in ("hook_scale", "hook_normalized")]
        names = [*self.at.values(), *(f"blocks.{index}.{name}" for name in inner)]
        self.tapped = {full for full in names if _is_point(block, full, index)}
        # Recorded by `Attention.written_out`: a step recording them runs the layer written out.
        self.patterns = {self.at["attn.hook_attn_scores"], self.at["attn.hook_pattern"]}
        self.attn, self.index, self.tables = attn, index, tables
        at = f"blocks.{index}"
        self.ln1, self.ln1_post = (
            norm_step(block.ln1, f"{at}.ln1"),
            norm_step(block.ln1_post, f"{at}.ln1_post"),
        )
        self.q_norm = norm_step(attn.q_norm, f"{at}.attn.q_norm")
        self.k_norm = norm_step(attn.k_norm, f"{at}.attn.k_norm")
        self.rotary = getattr(attn, "rotary", None)
        self.widths = attn.fused_qkv.widths
        self.equal_widths = len(set(self.widths)) == 1
        # Without q/k norms or rotation, q and k are slices of the product: one sum checks them.
        self.q_is_projected = self.rotary is None and not cfg.use_qk_norm
        self.window = cfg.window_size if attn.attn_type == "local" else None
        # head d_head d_model -> (head d_head) d_model, transposed as `F.linear` takes it
        self.W_O = View(lambda W: W.flatten(0, 1).T)
        if type(block) is AttnOnlyBlock:
            self.run = self._attn_only
            return
        self.ln2, self.ln2_post = (
            norm_step(block.ln2, f"{at}.ln2"),
            norm_step(block.ln2_post, f"{at}.ln2_post"),
        )
        self.mlp, self.W_in, self.W_out = block.mlp, View(lambda W: W.T), View(lambda W: W.T)
        self.mlp_of = self._gated_mlp if type(block.mlp) is GatedMLP else self._plain_mlp
        self.run = self._parallel if type(block) is ParallelBlock else self._sequential

    def __call__(self, resid: Resid, step: Step, checks: list[Tensor]) -> Resid:
        resid = step.tap(self.at["hook_resid_pre"], resid)
        return step.tap(self.at["hook_resid_post"], self.run(resid, step, checks))

    def _attn_only(self, resid: Resid, step: Step, checks: list) -> Resid:
        return resid + self.attend(resid, step, checks)

    def _sequential(self, resid: Resid, step: Step, checks: list) -> Resid:
        resid_mid = step.tap(self.at["hook_resid_mid"], resid + self.attend(resid, step, checks))
        return resid_mid + self.feed_forward(resid_mid, step)

    def _parallel(self, resid: Resid, step: Step, checks: list) -> Resid:
        attn_out = self.attend(resid, step, checks)
        return resid + attn_out + self.feed_forward(resid, step)

    def feed_forward(self, resid: Resid, step: Step) -> Resid:
        """`ln2_post(mlp(ln2(resid)))`."""
        at = self.at
        mlp_out = self.mlp_of(step.tap(at["ln2.hook_out"], self.ln2(resid, step)), step)
        mlp_out = step.tap(at["ln2_post.hook_out"], self.ln2_post(mlp_out, step))
        return step.tap(at["hook_mlp_out"], mlp_out)

    def attend(self, resid: Resid, step: Step, checks: list) -> Resid:
        """`ln1_post(attn(ln1(resid)))`, the new key and value stored in the cache."""
        attn, at = self.attn, self.at
        qkv, (q, k, v) = self.project(step.tap(at["ln1.hook_out"], self.ln1(resid, step)))
        q, k, v = (step.tap(at[f"attn.hook_{c}"], t) for c, t in zip("qkv", (q, k, v), strict=True))
        q = step.tap(at["attn.q_norm.hook_out"], self.q_norm(q, step))
        k = step.tap(at["attn.k_norm.hook_out"], self.k_norm(k, step))
        if self.rotary is not None:
            cos, sin = self.tables.cos_sin(self.rotary, step, q.dtype)
            q = step.tap(at["attn.hook_rot_q"], self.rotary.rotate(q, cos, sin))
            k = step.tap(at["attn.hook_rot_k"], self.rotary.rotate(k, cos, sin))
        records_patterns = not self.patterns.isdisjoint(step.taps)
        fused = attn.fused and (step.defers or not records_patterns)
        if step.cache is not None:
            k, v = step.cache[self.index].append(k, v)
        if fused:  # what a fused kernel could hide
            checks += self._checked(qkv, q, k, v, step)
        if fused:
            z = self._fused(q, k, v, step)
            if records_patterns:  # recorded by `Decoder.record_deferred`
                step.deferred.append((attn, (q,)))
        else:  # a soft cap, use_fused_kernels=False, or recording the pattern: written out
            z = attn.written_out(q, k, v, step.context).flatten(-2)
        if at["attn.hook_z"] in step.taps:  # batch pos (head d_head) -> batch pos head d_head
            step.tap(at["attn.hook_z"], z.unflatten(-1, (-1, q.shape[-1])))
        # Per-head results (use_attn_result) sum to this one product, to rounding.
        attn_out = nn.functional.linear(z, self.W_O(attn.W_O), attn.b_O)
        attn_out = step.tap(at["ln1_post.hook_out"], self.ln1_post(attn_out, step))
        return step.tap(at["hook_attn_out"], attn_out)

    def _checked(
        self, qkv: Tensor, q: Tensor, k: Tensor, v: Tensor, step: Step
    ) -> tuple[Tensor, ...]:
        """The sums that check a fused layer's inputs (`k`, `v`: the cache's and the new).
        A decode step: the new q and k only (its past was checked before, and a value that
        is not finite spreads to every logit of its one position). Over a sequence also
        every key and value (one at a padded position reaches no logit). Without rotation
        or q/k norms, q, k and v are slices of the product: one sum checks the new ones."""
        if step.decoding:
            return (qkv.sum(),) if self.q_is_projected else (q.sum(), k.sum())
        if self.q_is_projected and step.cache is None:
            return (qkv.sum(),)
        return q.sum(), k.sum(), v.sum()

    def project(self, x: Resid) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        """`x @ [W_Q W_K W_V] + [b_Q b_K b_V]` by the kept fused weights (`FusedQKV`), and
        its q, k and v per head (views). Per-head input copies (use_split_qkv_input,
        use_attn_in) are copies of this one input, so the shared product gives their
        numbers to rounding."""
        attn = self.attn
        W_K, b_K, W_V, b_V = attn.key_value_weights()
        W, b = attn.fused_qkv.weights((attn.W_Q, W_K, W_V, attn.b_Q, b_K, b_V))
        qkv = nn.functional.linear(x, W, b)
        batch, pos, _ = x.shape
        d_head = attn.W_Q.shape[-1]
        if self.equal_widths:  # batch pos (qkv head d_head) -> qkv x batch pos head d_head
            return qkv, qkv.view(batch, pos, 3, -1, d_head).unbind(2)
        q, k, v = qkv.split(self.widths, dim=-1)
        return qkv, tuple(t.view(batch, pos, -1, d_head) for t in (q, k, v))

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, step: Step) -> Float[Tensor, "batch pos d_z"]:
        """`z` by one fused kernel, its heads side by side: with the step's masks for a
        padded batch, otherwise with none (one query reads every key; in a local layer,
        every key of its window)."""
        attn = self.attn
        if step.per_row:
            z = kernels.fused_attention(
                q, k, v, step.context, attn.attn_type, attn.attn_scale, attn.group
            )
            return z.flatten(-2)
        window, n_keys = self.window, k.shape[1]
        if window is not None and n_keys > window:
            k, v = k.narrow(1, n_keys - window, window), v.narrow(1, n_keys - window, window)
        z = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),  # batch pos head d_head -> batch head pos d_head
            k.transpose(1, 2),
            v.transpose(1, 2),
            scale=1.0 / attn.attn_scale,
            enable_gqa=attn.group > 1,
        )
        # batch head 1 d_head -> batch 1 (head d_head): with one position, the same memory.
        return z.view(z.shape[0], 1, -1)

    def _plain_mlp(self, x: Resid, step: Step) -> Resid:
        """`act(x @ W_in + b_in) @ W_out + b_out`, as `MLP.forward` computes it."""
        mlp, at = self.mlp, self.at
        pre = step.tap(at["mlp.hook_pre"], nn.functional.linear(x, self.W_in(mlp.W_in), mlp.b_in))
        post = step.tap(at["mlp.hook_post"], mlp.act_fn(pre))
        return nn.functional.linear(post, self.W_out(mlp.W_out), mlp.b_out)

    def _gated_mlp(self, x: Resid, step: Step) -> Resid:
        """`(act(x @ W_gate) * (x @ W_in + b_in)) @ W_out + b_out`, as `GatedMLP.forward`."""
        mlp, at = self.mlp, self.at
        pre = step.tap(at["mlp.hook_pre"], x @ mlp.W_gate)
        pre_linear = nn.functional.linear(x, self.W_in(mlp.W_in), mlp.b_in)
        pre_linear = step.tap(at["mlp.hook_pre_linear"], pre_linear)
        post = step.tap(at["mlp.hook_post"], mlp.act_fn(pre) * pre_linear)
        return nn.functional.linear(post, self.W_out(mlp.W_out), mlp.b_out)
