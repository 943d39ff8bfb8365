"""SAELens 6's `HookedSAETransformer`: the facade's model, with SAEs attached by hook name.

    model = HookedSAETransformer.from_pretrained("gpt2")     # HookedTransformer's loader
    sae = SparseAutoencoder.from_pretrained("gpt2-small-res-jb", "blocks.8.hook_resid_pre")
    logits, cache = model.run_with_cache_with_saes(tokens, saes=[sae])
    cache["blocks.8.hook_resid_pre.hook_sae_acts_post"]     # [batch pos d_sae]

The methods are SAELens 6.54's (`sae_lens/analysis/hooked_sae_transformer.py`): `add_sae`
(attached until `reset_saes`; an SAE already at that hook point is replaced),
`reset_saes(act_names=None)`, `acts_to_saes`, the `saes(...)` context manager (the SAEs it
attached are removed at the end, also on an exception, and the ones they displaced come
back), `run_with_saes`, `run_with_cache_with_saes`, `run_with_hooks_with_saes`. The SAE
runs as SAELens's does: its reconstruction replaces the activation, or, with
`use_error_term=True`, the reconstruction plus the detached error of the unedited
features (the model's own activation to rounding; edits to the features still act).
`use_error_term=None` takes the SAE's own `use_error_term` attribute where it has one,
else False, SAELens's default.

The splice is ours (`hookedattn.sae.splice`: the one a core model's `saes()` uses, kept
until removed); what this module adds is SAELens's bookkeeping and names. `saes()` here is
SAELens's, so code written for our `saes()` (analysis's feature patching) calls
`hookedattn.sae.spliced` itself. Attached SAEs stay through what would rebuild or clear the
hook points (a flag assignment, `process_weights_`, `reset_hooks(including_permanent=
True)`) and are copied with the model, as SAELens's, which are modules, are. The SAE's
hook points are listed after the point as
SAELens lists them: `<point>.hook_sae_input`, `.hook_sae_acts_pre`, `.hook_sae_acts_post`,
`.hook_sae_recons`, `.hook_sae_error` (only with the error term, as SAELens runs it only
then) and `.hook_sae_output`. Where this differs from SAELens:

- the point itself stays a hook point: its hooks and its cache entry see the SAE's output
  (`hook_sae_output`); SAELens swaps the point for the SAE, so its cache has no entry there;
- an unknown hook name, an SAE of the wrong width or dtype, or two points for one SAE are
  errors naming the problem (SAELens logs a warning and skips the SAE);
- `exclude_special_tokens` and transcoders (`hook_name_out`) are refused by name
  (`hookedattn.sae.replaced` splices our transcoders);
- an SAE on `hook_z` (`reshape_activations="hook_z"`) has `hook_sae_error` and
  `hook_sae_output` flattened, `[... (head d_head)]`; SAELens's are `[... head d_head]`;
- SAELens adds `mlp.hook_in` (the MLP's input) to every MLP; the same activation is
  `blocks.L.ln2.hook_out` here (`blocks.L.hook_resid_mid` in a model without norms).
"""

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from hookedattn.core import hook_points as _core
from hookedattn.core import names as _names
from hookedattn.sae import SparseAutoencoder, Splice, splice
from hookedattn_tl.hook_points import HookPoint
from hookedattn_tl.HookedTransformer import HookedTransformer

# Our SAE's hook points under SAELens's names, in the order SAELens lists them.
SAELENS_SUFFIXES = {
    "hook_in": "hook_sae_input",
    "hook_acts_pre": "hook_sae_acts_pre",
    "hook_acts": "hook_sae_acts_post",
    "hook_recons": "hook_sae_recons",
    "hook_error": "hook_sae_error",
    "hook_out": "hook_sae_output",
}
# SAELens runs hook_sae_error only with the error term, so only then is it cached.
_WITHOUT_ERROR = {h: s for h, s in SAELENS_SUFFIXES.items() if h != "hook_error"}

SAEs = SparseAutoencoder | Sequence[SparseAutoencoder]


@dataclasses.dataclass(frozen=True)
class _Attached:
    """An SAE attached with `add_sae`, how it runs, and the splice that holds it."""

    sae: SparseAutoencoder
    use_error_term: bool
    splice: Splice


class HookedSAETransformer(HookedTransformer):
    """The facade's `HookedTransformer` with SAELens 6's SAE methods (module docstring).

    Built and loaded as `HookedTransformer` is (`HookedSAETransformer(cfg)`,
    `from_pretrained`, `from_pretrained_no_processing`); the SAEs are
    `hookedattn.sae.SparseAutoencoder`s (trained, loaded from a folder, or by SAELens's
    release names with `SparseAutoencoder.from_pretrained(release, sae_id)`).
    """

    def __init__(self, cfg: Any, tokenizer: Any = None, move_to_device: bool = True) -> None:
        super().__init__(cfg, tokenizer, move_to_device)
        self._acts_to_saes: dict[str, _Attached] = {}

    @property
    def acts_to_saes(self) -> dict[str, SparseAutoencoder]:
        """The attached SAEs by the hook name each sits at (a new dict)."""
        return {name: attached.sae for name, attached in self._acts_to_saes.items()}

    # ------------------------------------------------------------------ attaching
    # Loosely annotated, so that a wrong type gets our message rather than a type-check's.
    def add_sae(
        self,
        sae: Any,
        use_error_term: bool | None = None,
        exclude_special_tokens: bool | list[int] = False,
    ) -> None:
        """Attach `sae` at its hook point (`sae.cfg.hook_name`) until `reset_saes`,
        replacing an SAE already there. `use_error_term`: add the error term back (the
        model's output unchanged; None: the SAE's own `use_error_term`, else False).
        Everything is checked before the SAE already there is taken out."""
        _refuse_token_exclusion(exclude_special_tokens)
        if not isinstance(sae, SparseAutoencoder):
            raise TypeError(
                f"add_sae takes a hookedattn.sae.SparseAutoencoder, got {type(sae).__name__}; "
                f"transcoders are spliced with hookedattn.sae.replaced(model, transcoders)"
            )
        if use_error_term is None:
            use_error_term = bool(getattr(sae, "use_error_term", False))
        for module in sae.modules():
            if type(module) is _core.HookPoint:
                module.__class__ = HookPoint  # TL's hook levels, as the model's own points
        point = _point_of(sae)
        previous = self._acts_to_saes.pop(point, None)
        if previous is not None:
            previous.splice.remove()
        try:
            names = SAELENS_SUFFIXES if use_error_term else _WITHOUT_ERROR
            held = splice(self, [sae], use_error_term, names=names)
        except BaseException:
            if previous is not None:
                self.add_sae(previous.sae, previous.use_error_term)
            raise
        self._acts_to_saes[held.points[0]] = _Attached(sae, use_error_term, held)

    def reset_saes(self, act_names: str | list[str] | None = None) -> None:
        """Remove the SAEs at `act_names` (a hook name or a list of them), or all of them.
        A name with no SAE is skipped with a warning, as in SAELens."""
        if isinstance(act_names, str):
            act_names = [act_names]
        elif act_names is None:
            act_names = list(self._acts_to_saes)
        for act_name in act_names:
            if act_name not in self._acts_to_saes:
                attached = ", ".join(self._acts_to_saes) or "none"
                logging.warning(
                    "No SAE is attached to %s. There's nothing to reset (attached: %s)",
                    act_name,
                    attached,
                )
                continue
            self._acts_to_saes.pop(act_name).splice.remove()

    @contextlib.contextmanager
    def saes(
        self,
        saes: SAEs = (),
        reset_saes_end: bool = True,
        use_error_term: bool | None = None,
        exclude_special_tokens: bool | list[int] = False,
    ) -> Iterator["HookedSAETransformer"]:
        """Attach `saes` for a `with` block (`add_sae` each). With `reset_saes_end` they
        are removed at the end, also when the block raises, and the SAEs they displaced
        are attached again as they were."""
        _refuse_token_exclusion(exclude_special_tokens)
        if isinstance(saes, SparseAutoencoder):
            saes = [saes]
        displaced: list[tuple[str, _Attached | None]] = []
        try:
            for sae in saes:
                point = _point_of(sae) if isinstance(sae, SparseAutoencoder) else ""
                displaced.append((point, self._acts_to_saes.get(point)))
                self.add_sae(sae, use_error_term)
            yield self
        finally:
            if reset_saes_end:
                # Last in, first out: an SAE listed twice at one point unwinds to the first.
                for point, previous in reversed(displaced):
                    current = self._acts_to_saes.pop(point, None)
                    if current is not None:
                        current.splice.remove()
                    if previous is not None:
                        self.add_sae(previous.sae, previous.use_error_term)

    # ------------------------------------------------------------------ running
    def run_with_saes(
        self,
        *model_args: Any,
        saes: SAEs = (),
        reset_saes_end: bool = True,
        use_error_term: bool | None = None,
        exclude_special_tokens: bool | list[int] = False,
        **model_kwargs: Any,
    ) -> Any:
        """The forward with `saes` attached for this call (`saes()`)."""
        with self.saes(saes, reset_saes_end, use_error_term, exclude_special_tokens):
            return self(*model_args, **model_kwargs)

    def run_with_cache_with_saes(
        self,
        *model_args: Any,
        saes: SAEs = (),
        reset_saes_end: bool = True,
        use_error_term: bool | None = None,
        exclude_special_tokens: bool | list[int] = False,
        return_cache_object: bool = True,
        remove_batch_dim: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """`run_with_cache` with `saes` attached for this call: `(output, cache)`, the
        cache holding the SAEs' hook points under SAELens's names (module docstring)."""
        with self.saes(saes, reset_saes_end, use_error_term, exclude_special_tokens):
            return self.run_with_cache(
                *model_args,
                return_cache_object=return_cache_object,
                remove_batch_dim=remove_batch_dim,
                **kwargs,
            )

    def run_with_hooks_with_saes(
        self,
        *model_args: Any,
        saes: SAEs = (),
        reset_saes_end: bool = True,
        exclude_special_tokens: bool | list[int] = False,
        fwd_hooks: Sequence = (),
        bwd_hooks: Sequence = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **model_kwargs: Any,
    ) -> Any:
        """`run_with_hooks` with `saes` attached for this call; the hooks may sit at the
        SAEs' own hook points (`<point>.hook_sae_acts_post`, ...)."""
        with self.saes(saes, reset_saes_end, exclude_special_tokens=exclude_special_tokens):
            return self.run_with_hooks(
                *model_args,
                fwd_hooks=fwd_hooks,
                bwd_hooks=bwd_hooks,
                reset_hooks_end=reset_hooks_end,
                clear_contexts=clear_contexts,
                **model_kwargs,
            )

    # ------------------------------------------------------------------ keeping SAEs
    # In SAELens the SAEs are modules of the model, so rebuilding its hook points or
    # resetting its hooks leaves them in place; here they are splices, taken out and put
    # back around whatever would lose them.
    @contextlib.contextmanager
    def _saes_set_aside(self) -> Iterator[None]:
        attached = list(self._acts_to_saes.values())
        self.reset_saes()
        try:
            yield
        finally:
            for entry in attached:
                self.add_sae(entry.sae, entry.use_error_term)

    def __deepcopy__(self, memo: dict) -> "HookedSAETransformer":
        """A deep copy (`copy.deepcopy`, `model.copy()`) with copies of the attached SAEs
        attached, as a SAELens model, whose SAEs are modules, copies."""
        attached = list(self._acts_to_saes.values())
        with self._saes_set_aside():  # copied while no SAE is spliced, then spliced in both
            copied = object.__new__(type(self))
            memo[id(self)] = copied
            copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
            saes = [(copy.deepcopy(entry.sae, memo), entry.use_error_term) for entry in attached]
        for sae, use_error_term in saes:
            copied.add_sae(sae, use_error_term)
        return copied

    def _rebuild_blocks(self, **changes: bool) -> None:
        """As `HookedTransformer._rebuild_blocks`, the attached SAEs kept."""
        with self._saes_set_aside():
            super()._rebuild_blocks(**changes)

    def process_weights_(self, *args: Any, **kwargs: Any) -> "HookedSAETransformer":
        """As `HookedTransformer.process_weights_`, the attached SAEs kept (they read the
        processed activations from then on)."""
        with self._saes_set_aside():
            return super().process_weights_(*args, **kwargs)

    def remove_all_hook_fns(
        self,
        direction: str = "both",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """As `HookedRootModule.remove_all_hook_fns` (`reset_hooks` calls it); the SAEs stay
        attached even with `including_permanent`, as in SAELens."""
        super().remove_all_hook_fns(direction, including_permanent, level)
        if including_permanent and self._acts_to_saes:
            with self._saes_set_aside():
                pass


def _point_of(sae: SparseAutoencoder) -> str:
    """The full hook name an SAE sits at (`"resid_pre"`-style short names expanded)."""
    name = sae.cfg.hook_name
    return _names.get_act_name(name) if name and "." not in name else name


def _refuse_token_exclusion(exclude_special_tokens: object) -> None:
    if exclude_special_tokens is not False:
        raise ValueError(
            f"exclude_special_tokens={exclude_special_tokens!r}: hookedattn_tl's "
            f"HookedSAETransformer runs the SAE at every position; leave it False "
            f"(SAELens's default)"
        )


__all__ = ["SAELENS_SUFFIXES", "HookedSAETransformer"]
