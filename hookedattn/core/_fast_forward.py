"""The forward where nothing is listening: the blocks, the final norm and the unembedding
without module calls, hook-point tests or per-layer synchronisations.

A forward through the modules pays for what makes the model an instrument: a module call
per component, a test at every hook point, and the attention kernel's guard against
non-finite values, with one synchronisation per layer. On a small model or a short
sequence those cost a tenth of the arithmetic. When every hook point of the model is idle
and no torch hook is registered on any of its modules (or globally), `model(...)` runs
from the stream its input stage made (`_inputs.prepare`) to the logits by the equations
of `_fast_layers`:

    resid  = block(resid)          for each block, as `Layer` writes it
    logits = unembed(ln_final(resid))

with the same torch calls as the components, on the same tensors, so the logits are the
hooked forward's bit for bit. Models whose per-head variants give the same numbers only
to rounding (`use_attn_result`, `use_split_qkv_input`, `use_attn_in`), models with a
module of their own in a component's place (`_fast_layers.supported`), a KV cache and
`stop_at_layer` all run through the modules.

Non-finite values: the hooked forward keeps a fused attention result only when its q, k,
v and z are finite (`kernels.attend`). Here one synchronisation per forward decides
instead: the sums of every fused layer's q, k and v, and of the logits. A value that is
not finite in z or in the stream reaches some logit (causally: every later position reads
it); q, k and v are what a fused kernel may hide. If the sum is not finite, the logits are
dropped and the hooked forward runs the blocks again from the same stream, so its numbers
are the result.

What is built per model (the layers, the modules to watch for torch hooks) is kept in a
weak table and rebuilt whenever a module is assigned anywhere (torch's module
registration hook) or a hook point's hooks change (`hook_points.hooks_version`).
"""

import contextlib
import itertools
import math
import weakref
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core import hook_points
from hookedattn.core._fast_layers import (
    Layer,
    NotFiniteError,
    PositionAngles,
    Step,
    View,
    module_hooked,
    norm_step,
    supported,
)
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCache

Resid = Float[Tensor, "batch pos d_model"]
Logits = Float[Tensor, "batch pos d_vocab_out"]

_CHANGES = itertools.count(1)
_structure = 0  # bumped whenever a module is assigned as a submodule, anywhere


def _module_assigned(module: nn.Module, name: str, submodule: Any) -> None:
    global _structure
    _structure = next(_CHANGES)


torch.nn.modules.module.register_module_module_registration_hook(_module_assigned)


def run(
    model: Any,
    resid: Resid,
    context: AttentionContext,
    past_kv_cache: KeyValueCache | None,
    start: int,
    stop: int,
    unembed: bool,
) -> Tensor | None:
    """Blocks `start..stop-1` of `model` after `resid` (extending `past_kv_cache`, if any),
    then with `unembed` the final norm and the unembedding, by the fast forward: the logits,
    or the stream leaving block `stop - 1`. None where the model must run through its
    modules (a hook is attached, it is not built from the known components, or some value
    was not finite; the cache is then as it was)."""
    fast = _built.get(model)
    if fast is None or fast.structure != _structure:
        fast = _built[model] = FastForward(model)
    if not fast.applies():
        return None
    return fast(resid, context, past_kv_cache, start, stop, unembed)


class FastForward:
    """The fast forward of one model (module docstring), built from its modules."""

    def __init__(self, model: Any) -> None:
        # No reference to the model itself: it is the weak table's key.
        self.structure, cfg = _structure, model.cfg
        per_head = cfg.use_attn_result or cfg.use_split_qkv_input or cfg.use_attn_in
        self.exact = supported(model) and not per_head
        self._idle_version, self._idle = -1, False
        if not self.exact:
            return
        self.points = list(model.hook_dict.values())
        # The model's own torch hooks run around its forward either way.
        self.modules = [m for m in model.modules() if not isinstance(m, HookPoint)][1:]
        angles = PositionAngles()
        self.layers = [Layer(b, i, angles, cfg) for i, b in enumerate(model.blocks)]
        self.ln_final = norm_step(model.ln_final, "ln_final")
        self.unembed = model.unembed
        self.W_U = View(lambda W: W.T)

    def applies(self) -> bool:
        """Whether the model may run here: built from the known components, every hook
        point idle, no torch hook on any of its modules."""
        return self.exact and self.idle() and not module_hooked(self.modules)

    def __call__(
        self,
        resid: Resid,
        context: AttentionContext,
        cache: KeyValueCache | None,
        start: int,
        stop: int,
        unembed: bool,
    ) -> Tensor | None:
        """The logits (with `unembed`) or the stream after blocks `start..stop-1`; None if
        some value was not finite (the cache's appends undone)."""
        step = Step(0, context, {}, None, cache=cache)
        checks: list[Tensor] = []
        try:
            with contextlib.nullcontext() if cache is None else cache.transaction():
                for layer in self.layers[start:stop]:
                    resid = layer(resid, step, checks)
                out = self._unembed(resid, step) if unembed else resid
                checks.append(out.sum())
                # One synchronisation per forward (module docstring): a sum is finite only
                # when every term is (or it overflows, and the modules run for nothing worse).
                with torch.no_grad():
                    if not math.isfinite(torch.stack(checks).sum().item()):
                        raise NotFiniteError
        except NotFiniteError:
            return None
        return out

    def _unembed(self, resid: Resid, step: Step) -> Logits:
        """`unembed(ln_final(resid))`."""
        unembed = self.unembed
        x = self.ln_final(resid, step)
        return unembed.soft_cap(nn.functional.linear(x, self.W_U(unembed.W_U), unembed.b_U))

    def idle(self) -> bool:
        """Whether every hook point of the model is idle (worked out again only after a
        hook was attached or removed somewhere)."""
        version = hook_points.hooks_version()
        if version != self._idle_version:
            self._idle = not any(point._active for point in self.points)
            self._idle_version = version
        return self._idle


_built: "weakref.WeakKeyDictionary[Any, FastForward]" = weakref.WeakKeyDictionary()
