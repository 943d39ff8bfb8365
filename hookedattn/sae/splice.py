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
"""

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from einops import rearrange
from torch import Tensor

from hookedattn.core import names as _names
from hookedattn.core.hook_points import HookedRootModule, HookPoint
from hookedattn.sae.autoencoder import HOOK_NAMES, SparseAutoencoder

SAEs = Sequence[SparseAutoencoder] | Mapping[str, SparseAutoencoder]


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
            stack.enter_context(_registered(model, point, sae))
        hooks = [(point, _splice_hook(sae, use_error_term)) for point, sae in placements]
        stack.enter_context(model.hooks(fwd_hooks=hooks))
        yield model


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
        taken = point in dict(out) or sae_hook_name(point, "hook_in") in model.hook_dict
        if taken or sae.hook_in.name != "hook_in":
            where = point if taken else sae.hook_in.name.removesuffix(".sae.hook_in")
            raise ValueError(
                f"an SAE is already spliced at {where}: one SAE per hook point, one point "
                f"per SAE (build another SAE, or end the other splice first)"
            )
        out.append((point, sae))
    if len({id(sae) for _, sae in out}) != len(out):
        raise ValueError("the same SAE is listed twice: one point per SAE")
    return out


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
def _registered(model: HookedRootModule, point: str, sae: SparseAutoencoder) -> Iterator[None]:
    """Name the SAE's hook points after `point` and list them in `model.hook_dict`."""
    ours = {sae_hook_name(point, h): getattr(sae, h) for h in HOOK_NAMES}
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
