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
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core import hook_points, kernels
from hookedattn.core import names as _names
from hookedattn.core._fast_layers import (
    Layer,
    NotFiniteError,
    RotaryTables,
    Step,
    View,
    module_hooked,
    norm_step,
    supported,
)
from hookedattn.core.components.attention import Attention
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCache

Logits = Float[Tensor, "batch d_vocab_out"]


class Decoder:
    """The decode steps of one generation over `cache` (built by the generation loop).

    `step(tokens, new_mask)` returns the logits after one more token per row: by the fast
    path when every hook point of the model is idle, otherwise by the hooked step. Weights
    are read at every step (an edit between steps, in place or by assignment, is seen); the
    rotary angles are computed once, for positions up to the cache's capacity.
    """

    def __init__(self, model: Any, cache: KeyValueCache, recorder: Any = None) -> None:
        self.model, self.cache, self.recorder = model, cache, recorder
        self.fast = supported(model)
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
        tables = RotaryTables(max(cache[0].capacity, cache.length + 1), device)
        self.layers = [Layer(b, i, tables, cfg) for i, b in enumerate(model.blocks)]
        self.written_out = any(not block.attn.fused for block in model.blocks)
        self.patterns = {name for layer in self.layers for name in layer.patterns}
        self.tapped = {"hook_embed", "ln_final.hook_out", "unembed.hook_in", "unembed.hook_out"}
        self.tapped |= {"ln_final.hook_scale", "ln_final.hook_normalized"}
        self.tapped |= {"hook_pos_embed"} if hasattr(model, "pos_embed") else set()
        self.tapped = {n for n in self.tapped if n in model.hook_dict}
        self.tapped |= {n for layer in self.layers for n in layer.tapped}
        self.ln_final = norm_step(model.ln_final, "ln_final")
        self.pos_embed = model.pos_embed if hasattr(model, "pos_embed") else None
        self.W_U = View(lambda W: W.T)
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
                except NotFiniteError:
                    if self.recorder is not None:
                        self.recorder.take()  # what the undone step recorded
        self._past_finite = False  # a hooked step may store what the fast path has not checked
        return self.hooked_step(tokens, new_mask)

    def _module_hooked(self) -> bool:
        """Whether a torch hook on a module of the model, or a global one, would run in
        its forward (`module_hooked`): then the hooked step runs."""
        return module_hooked(self._modules)

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
            step = Step(past, context, taps, record, self.defers, cache=cache, decoding=True)
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
                raise NotFiniteError
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


def _finite_past(cache: KeyValueCache) -> bool:
    """Whether every stored key and value is finite (one synchronisation)."""
    sums = [t.sum() for entry in cache.entries for t in (entry.past_keys, entry.past_values)]
    return not sums or math.isfinite(torch.stack(sums).sum().item())


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
