"""`from_hf`: a HookedTransformer with the weights of a HF model or model directory.

The steps, the same for every family: find the family (by class, or by the directory's
`model_type`), translate the config, check every HF tensor's name and shape against the
config's table, build the model on the meta device (split over ranks or placed on devices
if asked), read each tensor in chunks into the tensor the model keeps (`_slices`: only the
part this rank holds), and assign them as the model's parameters (no second copy).
"""

import contextlib
import time
from pathlib import Path
from typing import Any

import torch

from hookedattn.core import parallel
from hookedattn.core._weights_io import CheckpointError, _check_device
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import (
    _candidates,
    _composite,
    _deepseek,
    _diffllama,
    _falcon_h1,
    _gemma4,
    _gpt2,
    _gpt_oss,
    _indexer,
    _jetmoe,
    _loading,
    _mimo_v2_flash,
    _minimax,
    _nemotron_h,
    _openai_gpt,
    _search,
    _slices,
    _verify,
)
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._table import (
    StateDict,
    Table,
    TensorSource,
    check_source,
    our_shape,
    sizes_by_rule,
)

FAMILIES: tuple[Family, ...] = (
    _gpt2.FAMILY,
    _gemma4.FAMILY,
    _gemma4.UNIFIED,
    _gpt_oss.FAMILY,
    _openai_gpt.FAMILY,
    _deepseek.DEEPSEEK_V3,
    _deepseek.DEEPSEEK_V2,
    _deepseek.GLM4_MOE_LITE,
    _falcon_h1.FAMILY,
    _nemotron_h.FAMILY,
    _diffllama.FAMILY,
    _mimo_v2_flash.FAMILY,
    _minimax.FAMILY,
    _jetmoe.FAMILY,
    _indexer.DEEPSEEK_V32,
    _indexer.GLM_MOE_DSA,
)
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(f.architecture for f in FAMILIES)
# The families `register_family` added, the latest first: looked up before the built-in ones.
_REGISTERED: list[Family] = []


def register_family(family: Family) -> None:
    """Import with `family`, ahead of the built-in families: a live model of the class
    `family.architecture` (or a subclass), a directory whose `model_type` is
    `family.model_type`. A family of one's own, or one that takes a built-in family's
    place; a directory is verified on load with it like any other (`from_hf`).
    `unregister_family` takes it back."""
    _REGISTERED.insert(0, family)


def unregister_family(family: Family) -> None:
    """Take back a family `register_family` added: the one registered before it (or the
    built-in one) applies again."""
    if family not in _REGISTERED:
        raise ValueError(f"{family.architecture} ({family.model_type}) is not registered")
    _REGISTERED.remove(family)


def _families() -> tuple[Family, ...]:
    return (*_REGISTERED, *FAMILIES)


@_verify.collection_paused()  # recognition and verification build and drop many modules
def from_hf(
    cls: type,
    source: Any,
    *,
    tokenizer: Any = None,
    dtype: torch.dtype | str | None = None,
    device: str | None = None,
    verify: bool = True,
    tp_size: int | None = None,
    device_map: Any = None,
    max_memory: Any = None,
) -> Any:
    """A `cls` (HookedTransformer) with the weights of a HF model or a local directory.

    `source` is a `transformers` causal LM of a supported family (`SUPPORTED_ARCHITECTURES`,
    or one added with `register_family`) or a directory holding its `config.json` and
    weights (safetensors, or pickled `pytorch_model*.bin` read with `weights_only=True`);
    from a directory the tokenizer saved there (if any) comes too. (A hub repo is fetched
    first, by `hookedattn.core.hub`.) `dtype` and `device` default to those of the weights
    (as stored, for a directory). `tp_size` splits the model over the ranks of a torchrun
    job, `device_map` places its blocks (`hookedattn.core.parallel`); either way each
    tensor is read only where it goes. No code from a directory ever runs: one whose config
    or tokenizer config names custom code (`auto_map`) is refused, without a prompt
    (`hookedattn.core.hf._loading`).

    A directory is verified before its weights are read (`verify=False` refuses nothing,
    though where the convention leaves a choice among candidates the twin still makes it): the
    family's import of a tiny twin of the checkpoint (its config's class and structure,
    few layers, small widths, random weights) must compute what `transformers` computes,
    layer by layer, or a `VerificationError` names the first hook point where they part.
    A pass is remembered per kind of checkpoint (`hookedattn.core.hf._verify`); the
    model's `verification` says how it went (None unverified, and for a live model of a
    family written out, which is not checked; a live model imported by convention is).
    """
    if device is not None:
        _check_device(str(device), from_file=False, path=Path())
    placement = dict(tp_size=tp_size, device_map=device_map, max_memory=max_memory)
    if isinstance(source, str | Path):
        return _from_folder(cls, Path(source), tokenizer, dtype, device, verify, placement)
    if _composite.text_config(getattr(source, "config", None)) is not None:
        source = _composite.text_model(source)  # a multimodal model: its language model
    families = families_of_model(source)
    weight = next(source.parameters())
    dtype = weight.dtype if dtype is None else dtype
    device = str(weight.device) if device is None else device
    live = StateDict(source.state_dict())
    verification = None
    if families[0].variant:  # derived by convention: verified as a folder's would be
        family, verification = _verified_of(cls, "a live " + type(source).__name__, families,
                                            source.config, verify)  # fmt: skip
    else:
        family = families[0]
    model = _import(cls, family, source.config, source, live, tokenizer, dtype, device, placement)
    model.verification = verification
    return model


def _from_folder(
    cls: type,
    path: Path,
    tokenizer: Any,
    dtype: torch.dtype | str | None,
    device: str | None,
    verify: bool,
    placement: dict[str, Any],
) -> Any:
    """The model of a directory: its config read and its family found, the family's import
    verified (unless not asked), then its weights read."""
    _loading.check_directory(path)
    hf_config = _loading.read_config(path)
    text = _composite.text_config(hf_config)  # a multimodal checkpoint: its language model
    families = families_of_config(hf_config)
    family, verification = _verified_of(cls, str(path), families, text or hf_config, verify)
    if text is not None:
        _composite.left_out(hf_config, str(path))
    model = _read_folder(cls, path, family, text or hf_config, tokenizer, dtype, device,
                         placement, composite=hf_config if text is not None else None)  # fmt: skip
    model.verification = verification
    return model


def _verified_of(
    cls: type, source: str, families: list[Family], hf_config: Any, verify: bool
) -> tuple[Family, _verify.Verification | None]:
    """The first of `families` whose import verifies, and its verification: a family
    remembered as passed first, else each family against one run of the twin, in the
    candidate search's order (`_search`); when none passes, the first one's error.
    Unverified (`verify=False`): the one remembered, else the first, except that where the
    convention leaves a choice among several the twin still makes it (the search, which
    then refuses nothing: when none agrees, the first)."""
    remembered = _verify.first_remembered(families, hf_config)
    if not verify:
        if remembered is None and len(families) > 1:
            with contextlib.suppress(_verify.VerificationError):
                return _searched(cls, source, families, hf_config)[0], None
        family = remembered or families[0]
        family.config(hf_config)
        return family, None
    if remembered is not None or len(families) == 1:
        family = remembered or families[0]
        return family, _verified(cls, source, family, hf_config)
    return _searched(cls, source, families, hf_config)


def _searched(
    cls: type, source: str, families: list[Family], hf_config: Any
) -> tuple[Family, _verify.Verification]:
    """The first of `families` that the candidate search finds agreeing with one run of
    the twin, and its verification; a VerificationError (the first one's) where none does."""
    start = time.perf_counter()
    with _verify.twin_run(hf_config, families[0].architecture, source) as run:

        def check(family: Family) -> _verify.Agreement:
            try:
                family.config(hf_config)  # a variant the family refuses, named
            except ValueError as error:
                return _verify.Agreement((), str(error), float("inf"), float("inf"))
            return _verify.measure(family, run, _twin_reader(cls, family))

        family, agreement = _search.first_passing(families, check)
    if family is None:
        raise _verify.VerificationError(agreement.error)
    return family, _verify.passed(family, run.config, agreement, time.perf_counter() - start)


def _verified(cls: type, source: str, family: Family, hf_config: Any) -> _verify.Verification:
    """`family`'s import of the checkpoint `source`, verified on its tiny twin (read by
    this module's own folder route, unverified) or found in the memo."""
    family.config(hf_config)  # a variant the family refuses is named before any twin
    return _verify.verify(hf_config, family, _twin_reader(cls, family), source=source)


def _twin_reader(cls: type, family: Family) -> Any:
    """A twin's folder read by `family`, unverified, in float64 on the CPU (the twin's
    run is float64 throughout: `_verify`)."""

    def read_twin(run: _verify.TwinRun) -> Any:
        config = _loading.read_config(run.folder)
        tokenizer = _loading.saved_tokenizer(run.folder)
        return _import(cls, family, config, None, run.tensors, tokenizer, torch.float64, "cpu", {})

    return read_twin


def _read_folder(
    cls: type,
    path: Path,
    family: Family,
    hf_config: Any,
    tokenizer: Any,
    dtype: torch.dtype | str | None,
    device: str | None,
    placement: dict[str, Any],
    composite: Any = None,
) -> Any:
    """The model of a checked directory's config, from its weight files (`composite`: the
    config of a multimodal checkpoint whose language model's config `hf_config` is)."""
    tensors = _loading.weight_source(path)
    if composite is not None:
        tensors = _composite.TextTensors(tensors, composite)
    tokenizer = _loading.saved_tokenizer(path) if tokenizer is None else tokenizer
    dtype = tensors.stored_dtype() if dtype is None else dtype
    return _import(
        cls, family, hf_config, None, tensors, tokenizer, dtype, device or "cpu", placement
    )


def _import(
    cls: type,
    family: Family,
    hf_config: Any,
    hf_model: Any,
    tensors: TensorSource,
    tokenizer: Any,
    dtype: torch.dtype | str,
    device: str,
    placement: dict[str, Any],
) -> Any:
    """`family`'s conversion of `tensors`: the config translated, every tensor's name and
    shape checked against the table, then the model built."""
    cfg = family.config(hf_config, dtype, device)
    table = family.table(hf_config, cfg, hf_model)
    check_source(table, tensors, cfg)
    model = build(cls, cfg, table, tensors, tokenizer, **placement)
    model.checkpoint_config = hf_config.to_dict()  # an outside record of its constants
    return model


def build(
    cls: type,
    cfg: HookedTransformerConfig,
    table: Table,
    tensors: TensorSource,
    tokenizer: Any,
    **placement: Any,
) -> Any:
    """The model of `cfg` holding `table`'s conversion of `tensors`: built on the meta
    device, then each tensor read (in chunks, only this rank's slice where the model is
    split) straight into the tensor the model keeps (`parallel.build_model`)."""
    return parallel.build_model(
        cls,
        cfg,
        _slices.table_reader(table, tensors, cfg),
        tokenizer=tokenizer,
        check=lambda model: _check_table(model, table, cfg),
        **placement,
    )


def _check_table(model: torch.nn.Module, table: Table, cfg: HookedTransformerConfig) -> None:
    # The table and the model must agree before a tensor is read; a disagreement is ours (a
    # family's table against the components), so it names both sides.
    sizes_of = sizes_by_rule(cfg)
    produced = {rule.ours: our_shape(rule, sizes_of(rule)) for rule in table.rules}
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    problems = sorted(set(expected) ^ set(produced)) + [
        f"{name}: {produced[name]} instead of {shape}"
        for name, shape in expected.items()
        if name in produced and produced[name] != shape
    ]
    if problems:
        raise CheckpointError(
            f"the {table.label} table does not match the model it builds: {problems}"
        )


def families_of_model(hf_model: Any) -> list[Family]:
    """The family of a live HF model, by its class, else the candidates its anatomy allows
    (`_convention`); anything else is named and refused."""
    if not isinstance(hf_model, torch.nn.Module) or not hasattr(hf_model, "config"):
        raise TypeError(
            f"from_hf takes a transformers model or a local directory, got "
            f"{type(hf_model).__name__}"
        )
    classes = {c.__name__ for c in type(hf_model).__mro__}  # a subclass is its family too
    for family in _families():
        if family.architecture in classes:
            return [family]
    model_type = getattr(hf_model.config, "model_type", None)
    name = type(hf_model).__name__
    causal_lm = _causal_lm_class(model_type)
    if causal_lm is not None and causal_lm not in classes:
        hint = f" (for {model_type}, pass the {causal_lm}, which has the unembedding)"
        raise ValueError(_unsupported(name, model_type) + hint)
    if not any(f.model_type == model_type for f in _families()):
        return _by_convention(hf_model.config, name, _transformers_class(type(hf_model)))
    raise ValueError(_unsupported(name, model_type))


def _causal_lm_class(model_type: Any) -> str | None:
    """The causal-LM class `transformers` registers for `model_type`, or one of our
    families' (None for neither)."""
    ours = next((f.architecture for f in _families() if f.model_type == model_type), None)
    names = _loading.transformers_module().models.auto.modeling_auto
    return ours or names.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def _transformers_class(cls: type) -> str:
    """The name of `cls`, or of its nearest base that `transformers` exports (a subclass of
    one of its models is built as that model for the convention's twin)."""
    module = _loading.transformers_module()
    return next((c.__name__ for c in cls.__mro__ if getattr(module, c.__name__, None) is c),
                cls.__name__)  # fmt: skip


def family_of_folder(path: Path) -> Family:
    """The family of the checkpoint in folder `path`, from its `config.json` alone (so a
    hub repo is refused before its weights are fetched): a ValueError names an architecture
    hookedattn does not import, a CheckpointError a config that names custom code."""
    return families_of_config(_loading.read_config(path))[0]


def families_of_config(hf_config: Any) -> list[Family]:
    """The family of a directory's config, by its `model_type`, else the candidates its
    anatomy allows (`_convention`); of a multimodal config, its language model's."""
    text = _composite.text_config(hf_config)
    if text is not None:
        return families_of_config(text)
    model_type = getattr(hf_config, "model_type", None)
    for family in _families():
        if family.model_type == model_type:
            return [family]
    names = getattr(hf_config, "architectures", None) or [type(hf_config).__name__]
    return _by_convention(hf_config, ", ".join(names))


def _by_convention(hf_config: Any, name: str, architecture: str | None = None) -> list[Family]:
    """The convention's candidate families for `hf_config` (of the causal-LM class
    `architecture`, when known); a ValueError names what in its anatomy was not
    recognised."""
    try:
        return _candidates.candidates(hf_config, architecture)
    except ValueError as error:
        raise ValueError(
            f"{_unsupported(name, getattr(hf_config, 'model_type', None))}; nor is it "
            f"imported by convention: {error}"
        ) from error


def _unsupported(name: str, model_type: Any) -> str:
    _loading.transformers_module()  # the ImportError that says how to install it, first
    return (
        f"cannot import {name} (model_type={model_type!r}): from_hf supports "
        f"{', '.join(dict.fromkeys(f.architecture for f in _families()))} written out, and "
        f"what its convention recognises (the families table and the coverage page: "
        f"docs/guide/families.md, docs/guide/coverage.md)"
    )
