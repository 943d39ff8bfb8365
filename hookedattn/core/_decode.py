"""The decode step of generation: one more token per row through every layer, fast where
nothing is listening.

A generation step through the model's forward pays for what makes the forward an
instrument: a module call per component, a test at every hook point, the attention
kernel's guard against non-finite values with one synchronisation per layer, the rotary
angles recomputed by every layer, a view of a weight made again by every product. On one
token those cost as much as the arithmetic. When no hook (and so no cache) is attached
anywhere in the model, `Decoder.step` runs the same equations without them:

    resid  = W_E[token] + W_pos[position]
    resid  = block(resid)   for each block: ln1, the fused q/k/v product, q/k norms and
                            rotation, the new key and value written into the cache's
                            preallocated buffers, one fused attention kernel, W_O, ln2 and
                            the MLP, added as the block's equation says (sequential,
                            parallel, attention only)
    logits = unembed(ln_final(resid))

with the same torch calls as the components (`kernels.normalize`, the kept fused q/k/v
weights, `Rotary.rotate` on angles computed once per generation, `affine`'s product), so the
numbers are the hooked step's (bit for bit where the layers are the same; to rounding for
per-head inputs or results, which sum to the shared product). It falls back to the hooked
step (`model._next_token_step`, or the forward with the mask for padded rows) exactly when
a hook is attached anywhere, checked once per step.

Recording: where the only hooks attached are a generation's own caching hooks
(`generate(..., return_cache=True)`, `generate_steps`), the fast step records what they ask
for itself: the activations it computes anyway (the residual stream, q, k, v, z, each
sublayer's output, the norms' outputs, the MLP's neurons, the logits) by `_Step.tap`, at the
places the components' hook points are; a norm's scale and normalised stream, and a layer's
attention scores and pattern, which exist only written out, by the components' own
written-out equations (`kernels.normalize` takes `written_out` when those points are active;
`Attention.written_out`), whose hook points record them, as on the hooked step.

A generation that hands its steps' activations over only at the end (`return_cache=True`:
the recorder `keep`s every step) defers those written-out equations: each step runs its
fused kernels as a step that records nothing does, keeping each deferred norm's input and
each deferred layer's queries; after the last step `record_deferred` runs every equation
once over all those positions (the keys and values are the cache's), through the same
hook points, and hands each step its rows. One call per equation instead of one per step,
the same numbers to rounding (with `use_fused_kernels=False` nothing is deferred: every
step runs written out, and its records are those of the forward bit for bit).

Non-finite values: the hooked step keeps a fused attention result only when q, k, v and z
are finite (`kernels.attend`). Here one synchronisation per step decides instead: the
cache's keys and values are checked once (and again after any hooked step), then each step
sums every fused layer's new q and k, and the logits. A NaN or inf in a value or in z
spreads to every logit (the residual stream adds it, every norm and product reads all of
it), so the logits stand for them; q and k are what a fused kernel may hide (torch's CPU
kernel returns 0 for a NaN query at some sizes). If the sum is not finite, the step is
undone (the cache's transaction) and run again by the hooked step, whose numbers are then
the result.
"""

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core import hook_points, kernels
from hookedattn.core import names as _names
from hookedattn.core.components.attention import Attention, GroupedQueryAttention
from hookedattn.core.components.block import AttnOnlyBlock, Block, ParallelBlock
from hookedattn.core.components.embed import Embed, PosEmbed, Unembed
from hookedattn.core.components.mlp import MLP, GatedMLP
from hookedattn.core.components.norm import LayerNorm, LayerNormPre, NoNorm, RMSNorm, RMSNormPre
from hookedattn.core.components.soft_cap import SoftCap
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCache, KeyValueCacheEntry

Resid = Float[Tensor, "batch pos d_model"]
Logits = Float[Tensor, "batch d_vocab_out"]
_is_active = operator.attrgetter("_active")
_NORMS = (NoNorm, LayerNorm, LayerNormPre, RMSNorm, RMSNormPre)
_CAPS = (NoNorm, SoftCap)


class _NotFiniteError(Exception):
    """A fast step met a value that is not finite: undo it, run the hooked step."""


class Decoder:
    """The decode steps of one generation over `cache` (built by the generation loop).

    `step(tokens, new_mask)` returns the logits after one more token per row: by the fast
    path when every hook point of the model is idle, otherwise by the hooked step. Weights
    are read at every step (an edit between steps, in place or by assignment, is seen); the
    rotary angles are computed once, for positions up to the cache's capacity.
    """

    def __init__(self, model: Any, cache: KeyValueCache, recorder: Any = None) -> None:
        self.model, self.cache, self.recorder = model, cache, recorder
        self.fast = _supported(model)
        self.defers = recorder is not None and recorder.keep
        # (index of the recorder's store, position, what the step deferred) per fast step
        self.deferred: list[tuple[int, int, list[tuple[Any, tuple]]]] = []
        self._past_finite = False  # checked before the first fast step, and after a hooked one
        self._taps_version, self._taps_now = -1, None
        self._modules = [m for m in model.modules() if not isinstance(m, HookPoint)]
        if not self.fast:
            return
        cfg = model.cfg
        device = model.W_E.device
        tables = _RotaryTables(max(cache[0].capacity, cache.length + 1), device)
        self.layers = [_Layer(b, i, cache[i], tables, cfg) for i, b in enumerate(model.blocks)]
        self.written_out = any(not block.attn.fused for block in model.blocks)
        self.patterns = {name for layer in self.layers for name in layer.patterns}
        self.tapped = {"hook_embed", "ln_final.hook_out", "unembed.hook_in", "unembed.hook_out"}
        self.tapped |= {"ln_final.hook_scale", "ln_final.hook_normalized"}
        self.tapped |= {"hook_pos_embed"} if hasattr(model, "pos_embed") else set()
        self.tapped = {n for n in self.tapped if n in model.hook_dict}
        self.tapped |= {n for layer in self.layers for n in layer.tapped}
        self.ln_final = _norm(model.ln_final, "ln_final")
        self.pos_embed = model.pos_embed if hasattr(model, "pos_embed") else None
        self.W_U = _View(lambda W: W.T)
        self._ones = torch.ones((cache.batch, 1), dtype=torch.long, device=device)

    def step(
        self, tokens: Int[Tensor, "batch 1"], new_mask: Int[Tensor, "batch 1"] | None
    ) -> Logits:
        """The logits after `tokens`, one per row; `new_mask` marks padding (None: no row
        of the batch is padded, now or before)."""
        taps = self._taps() if self.fast and not self._module_hooked() else None
        if taps is not None:
            if not self._past_finite:
                self._past_finite = _finite_past(self.cache)
            if self._past_finite:
                try:
                    return self._fast_step(tokens, new_mask, taps)
                except _NotFiniteError:
                    if self.recorder is not None:
                        self.recorder.take()  # what the undone step recorded
        self._past_finite = False  # a hooked step may store what the fast path has not checked
        return self.hooked_step(tokens, new_mask)

    def _module_hooked(self) -> bool:
        """Whether a torch hook (`register_forward_hook` and the like, on any module or
        globally) would run in the model's forward: the fast step calls no module, so
        then the hooked step runs. (A hook point is called without `nn.Module.__call__`,
        so torch hooks on one never run, here or in the forward.)"""
        if _global_module_hooks():
            return True
        return any(m._forward_hooks or m._forward_pre_hooks for m in self._modules)

    def _taps(self) -> dict[str, Any] | None:
        """The hook points the fast step records at (none where every point is idle), or
        None where some hook asks for the hooked step; worked out again only after a hook
        was attached or removed somewhere."""
        version = hook_points.hooks_version()
        if version != self._taps_version:
            self._taps_now, self._taps_version = self._current_taps(), version
        return self._taps_now

    def _current_taps(self) -> dict[str, Any] | None:
        active = [p for p in self.model.hook_dict.values() if p._active]
        if not active:
            return {}
        record = None if self.recorder is None else self.recorder.hook
        for point in active:
            only_recorded = not point._bwd and all(h.fn is record for h in point._fwd)
            if not (only_recorded and point.name in self.tapped):
                return None
        return {point.name: point for point in active}

    def hooked_step(
        self, tokens: Int[Tensor, "batch 1"], new_mask: Int[Tensor, "batch 1"] | None
    ) -> Logits:
        """The step through the model's forward, hooks and all."""
        if new_mask is None:
            return self.model._next_token_step(tokens, self.cache)
        return self.model(tokens, attention_mask=new_mask, past_kv_cache=self.cache)[:, -1]

    def _fast_step(
        self,
        tokens: Int[Tensor, "batch 1"],
        new_mask: Int[Tensor, "batch 1"] | None,
        taps: dict[str, Any],
    ) -> Logits:
        model, cache = self.model, self.cache
        with cache.transaction():
            record = None if self.recorder is None else self.recorder.hook
            records_patterns = not self.defers and not self.patterns.isdisjoint(taps)
            past = cache.length  # before `_context` extends the cache's mask
            context = self._context(new_mask, self.written_out or records_patterns)
            step = _Step(past, context, taps, record, self.defers)
            resid = step.tap("hook_embed", nn.functional.embedding(tokens, model.embed.W_E))
            if self.pos_embed is not None:
                rows = step.position_rows(self.pos_embed.W_pos)
                resid = resid + step.tap("hook_pos_embed", rows, like=resid)
            checks: list[Tensor] = []
            for layer in self.layers:
                resid = layer(resid, step, checks)
            unembed = model.unembed
            normed = self.ln_final(resid, step)
            x = step.tap("unembed.hook_in", step.tap("ln_final.hook_out", normed))
            logits = unembed.soft_cap(nn.functional.linear(x, self.W_U(unembed.W_U), unembed.b_U))
            logits = step.tap("unembed.hook_out", logits)[:, -1]
            checks.append(logits.sum())
            # One synchronisation per step (module docstring): a sum is finite only when
            # every term is (or it overflows, and then the hooked step runs for nothing worse).
            if not math.isfinite(torch.stack(checks).sum().item()):
                raise _NotFiniteError
        if step.deferred:
            self.deferred.append((len(self.recorder.stores), step.past, step.deferred))
        return logits

    def record_deferred(self) -> None:
        """Record what the fast steps deferred (module docstring): each deferred norm's
        written-out equation over the inputs of every step that deferred it, each deferred
        layer's over their queries and the cache's keys and values, through the hook points
        that record them; each step's store gets its own rows."""
        groups: dict[int, tuple[Any, list[int], list[int], list[tuple]]] = {}
        for index, position, deferrals in self.deferred:
            for module, args in deferrals:
                _, indices, positions, inputs = groups.setdefault(id(module), (module, [], [], []))
                indices.append(index)
                positions.append(position)
                inputs.append(args)
        self.deferred = []
        stores = self.recorder.stores
        for module, indices, positions, inputs in groups.values():
            joined = [torch.cat(parts, dim=1) for parts in zip(*inputs, strict=True)]
            if isinstance(module, Attention):
                (q,) = joined
                entry = self.cache[_layer_index(self.model, module)]
                queries = torch.tensor(positions, device=q.device)
                context = kernels.rows_context(
                    self.cache.previous_attention_mask, queries, self.model.cfg.window_size
                )
                recorded = self.recorder.capture(
                    lambda m=module, q=q, e=entry, c=context: m.written_out(
                        q, e.past_keys, e.past_values, c
                    )
                )
            else:
                recorded = self.recorder.capture(lambda m=module, x=joined[0]: m.written_out(x))
            for name, t in recorded.items():
                axis = _names.pos_axis(name)
                for start, stop in _runs(indices):  # one block per run of consecutive stores
                    stores[indices[start]][name] = t.narrow(axis, start, stop - start)

    def _context(
        self, new_mask: Int[Tensor, "batch 1"] | None, written_out: bool
    ) -> AttentionContext | None:
        """The step's masks and positions, the cache's mask extended as the hooked step
        extends it; None for an unpadded batch whose layers all run fused (they need none;
        `written_out`: some layer does not)."""
        cfg, cache = self.model.cfg, self.cache
        if new_mask is None:
            if written_out:
                return kernels.next_token_context(cache, cfg.window_size)
            cache.extend_mask(self._ones)
            return None
        device = self._ones.device
        return kernels.attention_context(
            cfg.n_ctx, cache.batch, 1, new_mask, cache, cfg.window_size, device
        )


class _Step:
    """What every layer of one step shares: how many positions the cache held before it,
    and, for a padded batch or a written-out layer, the attention context (positions per
    row and masks). Unpadded, every row is at position `past`."""

    def __init__(
        self,
        past: int,
        context: AttentionContext | None,
        taps: dict[str, Any],
        record: Callable | None,
        defers: bool = False,
    ) -> None:
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


def _global_module_hooks() -> bool:
    """Whether a global module hook (`nn.modules.module.register_module_forward_hook`) is
    registered."""
    from torch.nn.modules import module

    return bool(module._global_forward_hooks or module._global_forward_pre_hooks)


def _finite_past(cache: KeyValueCache) -> bool:
    """Whether every stored key and value is finite (one synchronisation)."""
    sums = [t.sum() for entry in cache.entries for t in (entry.past_keys, entry.past_values)]
    return not sums or math.isfinite(torch.stack(sums).sum().item())


def _supported(model: Any) -> bool:
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


def _norm(norm: Any, name: str) -> Callable[[Tensor, "_Step"], Tensor]:
    """The norm `name`'s output in a step, without its module call or `hook_out`; the
    identity for none."""
    if isinstance(norm, NoNorm):
        return _identity
    return _NormStep(norm, name)


def _identity(x: Tensor, step: "_Step") -> Tensor:
    return x


class _NormStep:
    """A norm in a decode step: `kernels.normalize` (written out where its scale or
    normalised stream is recorded), or, where the step defers those records, the fused
    kernel, its input kept for `Decoder.record_deferred`."""

    def __init__(self, norm: Any, name: str) -> None:
        self.norm = norm
        self.inner = (f"{name}.hook_scale", f"{name}.hook_normalized")

    def __call__(self, x: Tensor, step: "_Step") -> Tensor:
        norm = self.norm
        scale, normalized = self.inner
        if step.defers and norm.fused and (scale in step.taps or normalized in step.taps):
            step.deferred.append((norm, (x,)))
            return kernels.fused_normalize(norm, x)
        return kernels.normalize(norm, x)


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """The runs of consecutive values in increasing `indices`, as `(start, stop)` slices of
    the list: `[3, 4, 5, 7]` -> `[(0, 3), (3, 4)]`."""
    runs, start = [], 0
    for i in range(1, len(indices) + 1):
        if i == len(indices) or indices[i] != indices[i - 1] + 1:
            runs.append((start, i))
            start = i
    return runs


def _layer_index(model: Any, attn: Any) -> int:
    """The index of the block whose attention is `attn`."""
    return next(i for i, block in enumerate(model.blocks) if block.attn is attn)


class _View:
    """A view of a weight (`W.T`), made again only when the weight is replaced or moved:
    made at every step, a view is a dispatcher call, as costly on one token as a kernel."""

    def __init__(self, make: Callable[[Tensor], Tensor]) -> None:
        self.make = make
        self.weight: Tensor | None = None
        self.address = 0
        self.view: Tensor | None = None

    def __call__(self, weight: Tensor) -> Tensor:
        if weight is not self.weight or weight.data_ptr() != self.address:
            self.weight, self.address, self.view = weight, weight.data_ptr(), self.make(weight)
        return self.view


class _RotaryTables:
    """Each rotary module's `cos` and `sin` for positions `0..capacity-1`, computed once by
    the module itself (`Rotary.cos_sin`, the numbers its forward uses)."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity, self.device = capacity, device
        self._tables: dict[int, tuple[Tensor, Tensor]] = {}

    def cos_sin(self, rotary: Any, step: _Step, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """`cos` and `sin` at the step's positions, `[batch 1 1 rot]` (or `[1 1 1 rot]`)."""
        table = self._tables.get(id(rotary))
        if table is None or table[0].dtype != dtype:
            every = torch.arange(self.capacity, device=self.device)[None]
            table = self._tables[id(rotary)] = rotary.cos_sin(every, dtype)
        return step.angle_rows(table[0]), step.angle_rows(table[1])


class _Layer:
    """One block's decode step; the block's shape picks its equation when this is built."""

    def __init__(
        self, block: Any, index: int, entry: KeyValueCacheEntry, tables: _RotaryTables, cfg: Any
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
        self.attn, self.entry, self.tables = attn, entry, tables
        at = f"blocks.{index}"
        self.ln1, self.ln1_post = (
            _norm(block.ln1, f"{at}.ln1"),
            _norm(block.ln1_post, f"{at}.ln1_post"),
        )
        self.q_norm = _norm(attn.q_norm, f"{at}.attn.q_norm")
        self.k_norm = _norm(attn.k_norm, f"{at}.attn.k_norm")
        self.rotary = getattr(attn, "rotary", None)
        self.widths = attn.fused_qkv.widths
        self.equal_widths = len(set(self.widths)) == 1
        # Without q/k norms or rotation, q and k are slices of the product: one sum checks them.
        self.q_is_projected = self.rotary is None and not cfg.use_qk_norm
        self.window = cfg.window_size if attn.attn_type == "local" else None
        # head d_head d_model -> (head d_head) d_model, transposed as `F.linear` takes it
        self.W_O = _View(lambda W: W.flatten(0, 1).T)
        if type(block) is AttnOnlyBlock:
            self.run = self._attn_only
            return
        self.ln2, self.ln2_post = (
            _norm(block.ln2, f"{at}.ln2"),
            _norm(block.ln2_post, f"{at}.ln2_post"),
        )
        self.mlp, self.W_in, self.W_out = block.mlp, _View(lambda W: W.T), _View(lambda W: W.T)
        self.mlp_of = self._gated_mlp if type(block.mlp) is GatedMLP else self._plain_mlp
        self.run = self._parallel if type(block) is ParallelBlock else self._sequential

    def __call__(self, resid: Resid, step: _Step, checks: list[Tensor]) -> Resid:
        resid = step.tap(self.at["hook_resid_pre"], resid)
        return step.tap(self.at["hook_resid_post"], self.run(resid, step, checks))

    def _attn_only(self, resid: Resid, step: _Step, checks: list) -> Resid:
        return resid + self.attend(resid, step, checks)

    def _sequential(self, resid: Resid, step: _Step, checks: list) -> Resid:
        resid_mid = step.tap(self.at["hook_resid_mid"], resid + self.attend(resid, step, checks))
        return resid_mid + self.feed_forward(resid_mid, step)

    def _parallel(self, resid: Resid, step: _Step, checks: list) -> Resid:
        attn_out = self.attend(resid, step, checks)
        return resid + attn_out + self.feed_forward(resid, step)

    def feed_forward(self, resid: Resid, step: _Step) -> Resid:
        """`ln2_post(mlp(ln2(resid)))`."""
        at = self.at
        mlp_out = self.mlp_of(step.tap(at["ln2.hook_out"], self.ln2(resid, step)), step)
        mlp_out = step.tap(at["ln2_post.hook_out"], self.ln2_post(mlp_out, step))
        return step.tap(at["hook_mlp_out"], mlp_out)

    def attend(self, resid: Resid, step: _Step, checks: list) -> Resid:
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
        if fused:  # what a fused kernel could hide (the past was checked before)
            checks += (qkv.sum(),) if self.q_is_projected else (q.sum(), k.sum())
        k, v = self.entry.append(k, v)
        if fused:
            z = self._fused(q, k, v, step)
            if records_patterns:  # recorded by `Decoder.record_deferred`
                step.deferred.append((attn, (q,)))
        else:  # a soft cap, use_fused_kernels=False, or recording the pattern: written out
            z = attn.written_out(q, k, v, step.context).flatten(-2)
        if at["attn.hook_z"] in step.taps:  # batch 1 (head d_head) -> batch 1 head d_head
            step.tap(at["attn.hook_z"], z.unflatten(-1, (-1, q.shape[-1])))
        # Per-head results (use_attn_result) sum to this one product, to rounding.
        attn_out = nn.functional.linear(z, self.W_O(attn.W_O), attn.b_O)
        attn_out = step.tap(at["ln1_post.hook_out"], self.ln1_post(attn_out, step))
        return step.tap(at["hook_attn_out"], attn_out)

    def project(self, x: Resid) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        """`x @ [W_Q W_K W_V] + [b_Q b_K b_V]` by the kept fused weights (`FusedQKV`), and
        its q, k and v per head (views). Per-head input copies (use_split_qkv_input,
        use_attn_in) are copies of this one input, so the shared product gives their
        numbers to rounding."""
        attn = self.attn
        W_K, b_K, W_V, b_V = attn.key_value_weights()
        W, b = attn.fused_qkv.weights((attn.W_Q, W_K, W_V, attn.b_Q, b_K, b_V))
        qkv = nn.functional.linear(x, W, b)
        batch, d_head = x.shape[0], attn.W_Q.shape[-1]
        if self.equal_widths:  # batch 1 (qkv head d_head) -> qkv x batch 1 head d_head
            return qkv, qkv.view(batch, 1, 3, -1, d_head).unbind(2)
        q, k, v = qkv.split(self.widths, dim=-1)
        return qkv, tuple(t.view(batch, 1, -1, d_head) for t in (q, k, v))

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, step: _Step) -> Float[Tensor, "batch 1 d_z"]:
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

    def _plain_mlp(self, x: Resid, step: _Step) -> Resid:
        """`act(x @ W_in + b_in) @ W_out + b_out`, as `MLP.forward` computes it."""
        mlp, at = self.mlp, self.at
        pre = step.tap(at["mlp.hook_pre"], nn.functional.linear(x, self.W_in(mlp.W_in), mlp.b_in))
        post = step.tap(at["mlp.hook_post"], mlp.act_fn(pre))
        return nn.functional.linear(post, self.W_out(mlp.W_out), mlp.b_out)

    def _gated_mlp(self, x: Resid, step: _Step) -> Resid:
        """`(act(x @ W_gate) * (x @ W_in + b_in)) @ W_out + b_out`, as `GatedMLP.forward`."""
        mlp, at = self.mlp, self.at
        pre = step.tap(at["mlp.hook_pre"], x @ mlp.W_gate)
        pre_linear = nn.functional.linear(x, self.W_in(mlp.W_in), mlp.b_in)
        pre_linear = step.tap(at["mlp.hook_pre_linear"], pre_linear)
        post = step.tap(at["mlp.hook_post"], mlp.act_fn(pre) * pre_linear)
        return nn.functional.linear(post, self.W_out(mlp.W_out), mlp.b_out)
