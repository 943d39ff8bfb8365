"""Splicing SAEs into a model at their hook points, for the duration of a `with` block.

    with spliced(model, [sae]):            # or model.saes([sae])
        logits, cache = model.run_with_cache(tokens)

Each SAE runs as a forward hook at its point: the activation there is replaced by
`sae.with_error(x)` (reconstruction plus error term: the model's output is unchanged to
rounding, and the features are visible and editable) or, with `use_error_term=False`, by
the reconstruction alone. Hooks at that point attached before the splice see the SAE's
input; those attached inside it (the cache's included) see its output. The SAE's own hook
points join `model.hook_dict` right after the point, named `<point>.sae.hook_acts` etc., so
`run_with_cache` records them and `hooks()` reaches them; they leave when the block ends,
also when it raises. Splices nest; an SAE cannot be at two points, nor two SAEs at one.

`splice(model, saes)` is the same splice without a `with`: it stays until its handle's
`remove()`, its hooks are the model's (permanent, run in every thread, kept by
`reset_hooks()`), and `names=` lists the SAE's hook points under other suffixes (SAELens's
`hook_sae_acts_post` ...: what `hookedattn_tl.HookedSAETransformer.add_sae` builds on).
"""

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from einops import rearrange
from torch import Tensor

from hookedattn.core import names as _names
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.hooked_root import HookedRootModule
from hookedattn.sae.autoencoder import HOOK_NAMES, SparseAutoencoder

SAEs = Sequence[SparseAutoencoder] | Mapping[str, SparseAutoencoder]
# Where the SAE's hook points are listed after the point: `<point>.sae.hook_acts`.
SUFFIXES = {hook: f"sae.{hook}" for hook in HOOK_NAMES}


def sae_hook_name(point: str, hook: str) -> str:
    """The name of an SAE's hook point `hook` (e.g. `"hook_acts"`) spliced at `point`."""
    if hook not in HOOK_NAMES:
        raise KeyError(f"an SAE has no hook point {hook!r}; it has {', '.join(HOOK_NAMES)}")
    return f"{point}.sae.{hook}"


@contextlib.contextmanager
def spliced(
    model: HookedRootModule, saes: SAEs, use_error_term: bool = True
) -> Iterator[HookedRootModule]:
    """Splice each SAE at its hook point (`sae.cfg.hook_name`, or the key of a mapping)
    for the duration of the block (module docstring). Everything is checked before
    anything is attached."""
    placements = _placements(model, saes)
    with contextlib.ExitStack() as stack:
        for point, sae in placements:
            stack.enter_context(_registered(model, point, sae, SUFFIXES))
        hooks = [(point, _splice_hook(sae, use_error_term)) for point, sae in placements]
        stack.enter_context(model.hooks(fwd_hooks=hooks))
        yield model


@dataclasses.dataclass(frozen=True)
class Splice:
    """SAEs spliced by `splice()`: `points[i]` is where `saes[i]` sits; `remove()` takes
    them out (a second call does nothing)."""

    points: tuple[str, ...]
    saes: tuple[SparseAutoencoder, ...]
    _undo: Callable[[], None] = dataclasses.field(repr=False)

    def remove(self) -> None:
        """Take the SAEs out: the splice hooks detached, their hook points unlisted."""
        self._undo()


def splice(
    model: HookedRootModule,
    saes: SAEs,
    use_error_term: bool = True,
    *,
    names: Mapping[str, str] = SUFFIXES,
) -> Splice:
    """Splice each SAE at its hook point until `.remove()` (module docstring): as `spliced`,
    but the splice is the model's, not a `with` block's: its hooks are permanent (kept by
    `reset_hooks()`) and run in every thread. `names` maps the SAE's hook points
    (`HOOK_NAMES`) to the suffix each is listed under after the point; one left out runs
    but is not listed (not cached, not hookable by name). `hook_in` must be listed."""
    if "hook_in" not in names or not set(names) <= set(HOOK_NAMES):
        raise ValueError(
            f"names maps the SAE's hook points ({', '.join(HOOK_NAMES)}) to suffixes and must "
            f"list hook_in; got keys {sorted(names)}"
        )
    placements = _placements(model, saes)
    stack = contextlib.ExitStack()
    try:
        for point, sae in placements:
            stack.enter_context(_registered(model, point, sae, names))
        for point, sae in placements:
            hook = _splice_hook(sae, use_error_term)
            stack.callback(model.hook_dict[point].add_hook(hook, is_permanent=True).remove)
    except BaseException:
        stack.close()
        raise
    points, spliced_saes = zip(*placements, strict=True) if placements else ((), ())
    return Splice(tuple(points), tuple(spliced_saes), stack.close)


class _SpliceHook:
    """The forward hook that puts an SAE at a hook point."""

    def __init__(self, sae: SparseAutoencoder, use_error_term: bool) -> None:
        self.sae = sae
        self.run = sae.with_error if use_error_term else sae.forward
        self.__name__ = f"sae at {sae.cfg.hook_name or 'its point'}"

    def __call__(self, x: Tensor, hook: HookPoint) -> Tensor:
        if x.shape[-1] != self.sae.cfg.d_in:
            raise ValueError(
                f"the SAE spliced at {hook.name} reads d_in={self.sae.cfg.d_in}, but the "
                f"activation there is {tuple(x.shape)}"
            )
        return self.run(x)


class _HeadsSpliceHook(_SpliceHook):
    """An SAE with `reshape_activations="hook_z"`: it reads the heads' outputs `[head
    d_head]` as one vector of `head * d_head`, and its output is split back into heads."""

    def __call__(self, x: Tensor, hook: HookPoint) -> Tensor:
        flat = rearrange(x, "... head d_head -> ... (head d_head)")
        out = super().__call__(flat, hook)
        return rearrange(out, "... (head d_head) -> ... head d_head", head=x.shape[-2])


def _splice_hook(sae: SparseAutoencoder, use_error_term: bool) -> _SpliceHook:
    heads = sae.cfg.reshape_activations == "hook_z"
    return (_HeadsSpliceHook if heads else _SpliceHook)(sae, use_error_term)


def _placements(model: HookedRootModule, saes: Any) -> list[tuple[str, SparseAutoencoder]]:
    if isinstance(saes, SparseAutoencoder):
        saes = [saes]
    if isinstance(saes, Mapping):
        pairs = list(saes.items())
    elif isinstance(saes, Sequence) and not isinstance(saes, str):
        pairs = [(getattr(sae, "cfg", None) and sae.cfg.hook_name, sae) for sae in saes]
    else:
        raise TypeError(f"saes must be a list of SAEs or a dict of them by hook name, got {saes!r}")
    out: list[tuple[str, SparseAutoencoder]] = []
    for point, sae in pairs:
        if not isinstance(sae, SparseAutoencoder):
            raise TypeError(f"expected a SparseAutoencoder, got {type(sae).__name__}")
        if not point:
            raise ValueError(
                "this SAE has no hook_name: give one in its SAEConfig, or pass "
                "{hook_name: sae} to say where it goes"
            )
        point = _names.get_act_name(point) if "." not in point else point
        if point not in model.hook_dict:
            raise KeyError(_names.unknown_name_message(point, model.hook_dict))
        _check_fits(model, point, sae)
        taken = point in dict(out) or _has_splice(model.hook_dict[point])
        if taken or sae.hook_in.name != "hook_in":
            where = point if taken else _where_spliced(model, sae)
            raise ValueError(
                f"an SAE is already spliced at {where}: one SAE per hook point, one point "
                f"per SAE (build another SAE, or end the other splice first)"
            )
        out.append((point, sae))
    if len({id(sae) for _, sae in out}) != len(out):
        raise ValueError("the same SAE is listed twice: one point per SAE")
    return out


def _has_splice(point: HookPoint) -> bool:
    return any(isinstance(handle.fn, _SpliceHook) for handle in point.fwd_hooks)


def _where_spliced(model: HookedRootModule, sae: SparseAutoencoder) -> str:
    for name, point in model.hook_dict.items():
        if any(getattr(h.fn, "sae", None) is sae for h in point.fwd_hooks):
            return name
    return f"another model's point (its hook_in is listed as {sae.hook_in.name})"


def _check_fits(model: HookedRootModule, point: str, sae: SparseAutoencoder) -> None:
    """Refuse an SAE whose width or dtype is not the activation's at `point`, or whose
    weights are not finite (it would make every activation there NaN)."""
    cfg = getattr(model, "cfg", None)
    axes = _names.axis_names(point)
    width = getattr(cfg, axes[-1], None) if axes else None
    described = f"{axes[-1]}={width}"
    if sae.cfg.reshape_activations == "hook_z":
        if tuple(axes[-2:]) != ("head", "d_head"):
            raise ValueError(
                f"the SAE reads the heads' outputs flattened (reshape_activations='hook_z'), "
                f"but {point} is [{' '.join(axes)}]: splice it at a [... head d_head] point "
                f"such as blocks.0.attn.hook_z"
            )
        width = None if width is None else width * cfg.n_heads
        described = f"head * d_head = {width}"
    if width is not None and width != sae.cfg.d_in:
        raise ValueError(
            f"the SAE reads d_in={sae.cfg.d_in}, but {point} is [{' '.join(axes)}] with "
            f"{described}: it belongs at a point of width {sae.cfg.d_in}"
        )
    for name, parameter in sae.named_parameters():
        bad = int((~parameter.detach().isfinite()).sum())
        if bad:
            raise ValueError(
                f"the SAE for {point} has {bad} non-finite value(s) in {name}: spliced, it "
                f"would make the activations there non-finite (or silence features)"
            )
    dtype = getattr(cfg, "dtype", None)
    if dtype is not None and dtype != sae.dtype:
        raise ValueError(
            f"the SAE's weights are {sae.dtype} but the model computes in {dtype}: "
            f"convert one of them (sae.to({dtype}))"
        )


@contextlib.contextmanager
def _registered(
    model: HookedRootModule, point: str, sae: SparseAutoencoder, suffixes: Mapping[str, str]
) -> Iterator[None]:
    """Name the SAE's hook points `<point>.<suffix>` and list them in `model.hook_dict`
    (in `HOOK_NAMES` order, right after `point`); those without a suffix stay unlisted."""
    ours = {f"{point}.{suffixes[h]}": getattr(sae, h) for h in HOOK_NAMES if h in suffixes}
    before = dict(model.hook_dict)
    rebuilt: dict[str, HookPoint] = {}
    for name, hook_point in before.items():
        rebuilt[name] = hook_point
        if name == point:
            rebuilt.update(ours)
    for name, hook_point in ours.items():
        hook_point.name = name
    model.hook_dict = rebuilt
    try:
        yield
    finally:
        for name in ours:
            model.hook_dict.pop(name, None)
        for h in HOOK_NAMES:
            getattr(sae, h).name = h
