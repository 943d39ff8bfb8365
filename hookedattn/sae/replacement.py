"""The replacement model: a model's MLPs replaced by transcoders, for a `with` block.

    with replaced(model, transcoders):                      # a list, or a CrossLayerTranscoder
        logits, cache = model.run_with_cache(tokens)        # the model's logits, to rounding
    cache["blocks.1.transcoder.hook_acts"]                  # [batch pos d_sae]

At each replaced layer `L`, what the MLP writes (`blocks.L.hook_mlp_out`) becomes

    out_L = recons_L + error_L,    error_L = mlp_L(x_L) - recons_L(clean features)

where `recons_L` is the transcoders' prediction from the features (`TranscoderSet`) and the
error term is computed from the unedited features and detached, as for a spliced SAE: the
forward is the model's own to rounding, and a hook that edits features (at
`blocks.L.transcoder.hook_acts`: steer one, ablate one) changes the output by exactly their
writes, later layers responding. `use_error_term=False` drops the error terms, which makes
the model the transcoders' alone (what "CE loss recovered" measures). `layers` replaces only
some MLPs (a cross-layer transcoder still reads every layer, since layer `L`'s output
includes the writes of layers `< L`).

The features are computed by a hook at each layer's input point (`blocks.L.ln2.hook_out`,
which the MLP still reads unchanged), and written by a hook at `blocks.L.hook_mlp_out`. The
transcoders' own hook points join `model.hook_dict` as `blocks.L.transcoder.hook_in`,
`hook_acts`, `hook_recons`, `hook_error`, `hook_out` for the duration of the block, so
`run_with_cache` records them and `hooks()` reaches them. Each forward encodes afresh; the
features a layer's output uses are always those of the same forward.
"""

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from torch import Tensor

from hookedattn.core import names as _names
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.hooked_root import HookedRootModule
from hookedattn.sae.transcoder import TRANSCODER_HOOK_NAMES
from hookedattn.sae.transcoder_set import TranscoderSet


def transcoder_hook_name(layer: int, hook: str) -> str:
    """The name of layer `layer`'s transcoder hook point `hook` (`"hook_acts"`, ...) in a
    replacement model: `blocks.{layer}.transcoder.{hook}`."""
    if hook not in TRANSCODER_HOOK_NAMES:
        raise KeyError(
            f"a transcoder has no hook point {hook!r}; it has {', '.join(TRANSCODER_HOOK_NAMES)}"
        )
    return f"blocks.{layer}.transcoder.{hook}"


class _Forward:
    """What one forward has encoded so far, per layer: input, clean and (maybe) edited acts."""

    def __init__(self) -> None:
        self.inputs: dict[int, Tensor] = {}
        self.clean: dict[int, Tensor] = {}
        self.acts: dict[int, Tensor] = {}


class _Encode:
    """The hook at a layer's input point: the features of what the MLP reads."""

    def __init__(self, tset: TranscoderSet, layer: int, state: _Forward) -> None:
        self.tset, self.layer, self.state = tset, layer, state
        self.__name__ = f"transcoder features at layer {layer}"

    def __call__(self, x: Tensor, hook: HookPoint) -> None:
        tset, layer = self.tset, self.layer
        x = tset.hook_point(layer, "hook_in")(x)
        clean = tset.encode(layer, x)
        self.state.inputs[layer], self.state.clean[layer] = x, clean
        self.state.acts[layer] = tset.hook_point(layer, "hook_acts")(clean)


class _Decode:
    """The hook at a layer's MLP output: the transcoders' prediction (plus the error term)."""

    def __init__(self, tset: TranscoderSet, layer: int, state: _Forward, use_error: bool) -> None:
        self.tset, self.layer, self.state, self.use_error = tset, layer, state, use_error
        self.__name__ = f"transcoder output at layer {layer}"

    def __call__(self, y: Tensor, hook: HookPoint) -> Tensor:
        tset, layer, state = self.tset, self.layer, self.state
        sources = tset.sources(layer)
        if any(s not in state.acts for s in sources):
            raise RuntimeError(
                f"the transcoder output at layer {layer} needs the features of layers {sources}, "
                f"which this forward did not compute (did it start after their input points?)"
            )
        x = state.inputs[layer]
        clean = tset.decode(layer, state.clean, x)
        edited = any(state.acts[s] is not state.clean[s] for s in sources)
        recons = tset.hook_point(layer, "hook_recons")(
            tset.decode(layer, state.acts, x) if edited else clean
        )
        if self.use_error:
            recons = recons + tset.hook_point(layer, "hook_error")((y - clean).detach())
        return tset.hook_point(layer, "hook_out")(recons)


@contextlib.contextmanager
def replaced(
    model: HookedRootModule,
    transcoders: Any,
    *,
    use_error_term: bool = True,
    layers: Sequence[int] | None = None,
) -> Iterator[HookedRootModule]:
    """Replace the MLPs of `layers` (default: every layer the transcoders cover) by the
    transcoders for the duration of the block (module docstring). Everything is checked
    before anything is attached."""
    tset = TranscoderSet(transcoders)
    layers = _replaced_layers(tset, layers)
    _check_fits(model, tset)
    state = _Forward()
    hooks = [(tset.input_hook(layer), _Encode(tset, layer, state)) for layer in tset.layers]
    hooks += [
        (tset.output_hook(layer), _Decode(tset, layer, state, use_error_term)) for layer in layers
    ]
    with _registered(model, tset), model.hooks(fwd_hooks=hooks):
        yield model


def _replaced_layers(tset: TranscoderSet, layers: Sequence[int] | None) -> tuple[int, ...]:
    if layers is None:
        return tset.layers
    chosen = tuple(sorted(set(layers)))
    if not chosen or not set(chosen) <= set(tset.layers):
        raise ValueError(
            f"layers must be some of the transcoders' layers {tset.layers}, got {layers}"
        )
    return chosen


def _check_fits(model: HookedRootModule, tset: TranscoderSet) -> None:
    """Refuse transcoders whose points, widths or dtype are not the model's."""
    cfg = getattr(model, "cfg", None)
    for layer in tset.layers:
        for name in (tset.input_hook(layer), tset.output_hook(layer)):
            if name not in model.hook_dict:
                raise KeyError(_names.unknown_name_message(name, model.hook_dict))
        if _names.layer_of(tset.input_hook(layer)) != layer:
            raise ValueError(
                f"layer {layer}'s transcoder reads {tset.input_hook(layer)}, another layer"
            )
    d_model = getattr(cfg, "d_model", None)
    if d_model is not None and tset.d_in != d_model:
        raise ValueError(
            f"the transcoders read d_in={tset.d_in}, but the model's MLPs read d_model={d_model}"
        )
    if d_model is not None and tset.d_out != d_model:
        raise ValueError(
            f"the transcoders write d_out={tset.d_out}, but the model's MLPs write "
            f"d_model={d_model}: they cannot stand in for the MLPs"
        )
    for module in tset.modules:
        for name, parameter in module.named_parameters():
            bad = int((~parameter.detach().isfinite()).sum())
            if bad:
                raise ValueError(
                    f"a transcoder's {name} holds {bad} value(s) that are not finite: in "
                    f"place of the MLPs it would make the stream non-finite"
                )
    dtype = getattr(cfg, "dtype", None)
    if dtype is not None and dtype != tset.dtype:
        raise ValueError(
            f"the transcoders' weights are {tset.dtype} but the model computes in {dtype}: "
            f"convert one of them (tc.to({dtype}))"
        )


@contextlib.contextmanager
def _registered(model: HookedRootModule, tset: TranscoderSet) -> Iterator[None]:
    """Name the transcoders' hook points `blocks.L.transcoder.*` and list them in
    `model.hook_dict` right after each layer's output point."""
    ours = {
        layer: {
            transcoder_hook_name(layer, h): tset.hook_point(layer, h) for h in TRANSCODER_HOOK_NAMES
        }
        for layer in tset.layers
    }
    taken = [n for named in ours.values() for n in named if n in model.hook_dict]
    if taken:
        raise ValueError(
            f"transcoders already replace these MLPs ({taken[0]} exists): end the other "
            f"replacement first"
        )
    after = {tset.output_hook(layer): layer for layer in tset.layers}
    rebuilt: dict[str, HookPoint] = {}
    for name, hook_point in model.hook_dict.items():
        rebuilt[name] = hook_point
        if name in after:
            rebuilt.update(ours[after[name]])
    old_names = {}
    for named in ours.values():
        for name, hook_point in named.items():
            old_names[name] = hook_point.name
            hook_point.name = name
    model.hook_dict = rebuilt
    try:
        yield
    finally:
        for named in ours.values():
            for name, hook_point in named.items():
                model.hook_dict.pop(name, None)
                hook_point.name = old_names[name]
