"""A checkpoint's anatomy, recognised by watching its tiny twin run.

The importer by convention (`_convention`) needs to know, for an architecture no family
module describes, what its pieces are and how they connect. It does not read the modeling
code; it builds the checkpoint's tiny twin (`_tiny`: its own config class, few layers,
small widths, random weights), runs it once with a forward hook on every piece of the
first decoder layer and of the base model, and reads the answers off what it sees:

    where           the list of decoder layers (the module list as long as the twin has
                    layers), the embedding and unembedding (`get_input_embeddings` /
                    `get_output_embeddings`), the final norm (the norm the base model calls
                    after its last layer; none after post-residual norms), a norm of the
                    embeddings (the base model's norm whose output enters the first layer:
                    BART's `layernorm_embedding`)
    the block       which norms read the stream before a sublayer and which norm what a
                    sublayer wrote (by following the tensors: a norm whose output the
                    attention reads is `ln1`, one whose input is the attention's output is
                    `ln1_post`, one whose input is the stream plus that output is
                    `ln_resid_mid`, ...), and whether the MLP reads the stream the attention
                    read (a parallel block); BERT's split layers are read by `_split_layers`
    the norms       what each norm computes, by calling it: RMSNorm with gain `w` or
                    `1 + w`, LayerNorm with or without bias or gain, and its epsilon
    the activation  the MLP's, by calling it on a range of values against ours
    ALiBi           a linear bias per head handed to the attention (`_alibi`)
    the scalars     what multiplies the embedding, each sublayer's write and the logits, and
                    the attention's softmax scale, each measured on the twin and explained
                    by the config field it comes from (`Scale`), so that it carries over to
                    the checkpoint's own sizes
    the weights     each linear map's role by its name (`q_proj`, `query`, `wq`, `qkv_proj`,
                    `gate_proj`, `fc1`, ...), its bias by its presence, q/k norms over a
                    head or over the whole projection by their gains' widths

A piece it does not recognise (a sublayer of another kind, a weight without a role, norms
that differ from layer to layer, an activation we do not compute) is a `ValueError` naming
it: the architecture is refused, never guessed at. What it recognises is still only a
hypothesis: `_verify` then checks the import against `transformers` on the same twin.
"""

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from hookedattn.core.hf import (
    _alibi,
    _experts,
    _first_layer,
    _head,
    _layer_differences,
    _loading,
    _mixer_norms,
    _mixers,
    _qk_layers,
    _saved,
    _scalars,
    _split_layers,
    _tiny,
    _verify,
)
from hookedattn.core.hf._config_fields import logit_cap
from hookedattn.core.hf._experts import Experts
from hookedattn.core.hf._mixers import Mixers
from hookedattn.core.hf._probes import (
    ACTIVATION_NAMES,
    CONFIG_EPSILONS,
    USUAL_EPSILONS,
    Scale,
    activation,
    bfloat16_normalizer,
    explain,
    norm_kind,
    ratio,
)
from hookedattn.core.hf._recognised import UNKNOWN, Anatomy, from_json
from hookedattn.core.hf._roles import (
    ATTENTION_NAMES,
    ATTENTION_ROLES,
    MLP_ROLES,
    attention_head_width,
    attention_scaling,
    child,
    flat_mlp,
    gated_queries,
    is_cross,
    is_norm,
    latent_gate,
    linear_maps,
    mlp_child,
    qk_norm_kind,
    qk_norms,
    unwrapped_attention,
)
from hookedattn.core.hf._sub_norms import ATTN_SUB_NORMS, MLP_SUB_NORMS, sub_norm
from hookedattn.core.hf._watching import Watching
from hookedattn.core.hf._wiring import placement, wiring


def architecture_of(hf_config: Any) -> str:
    """The `transformers` causal-LM class of a config: the one it names, else the one its
    model type is registered with (by name: its modeling code is not imported here)."""
    transformers = _loading.transformers_module()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    for name in getattr(hf_config, "architectures", None) or []:
        if name in causal:
            return name
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(hf_config, "model_type", None))
    if name is None:
        raise ValueError(
            f"model_type {getattr(hf_config, 'model_type', None)!r} names no causal LM "
            f"transformers {transformers.__version__} knows"
        )
    return name


def recognise(hf_config: Any, architecture: str | None = None) -> Anatomy:
    """The anatomy of `hf_config`'s architecture, read off its tiny twin (module
    docstring), or remembered from an earlier reading of the same structure (the memo's
    "anatomies", `_verify`: no twin built); a `ValueError` names the first piece not
    recognised. `architecture`: the causal-LM class, when known (a live model's)."""
    architecture = architecture or architecture_of(hf_config)
    if not hasattr(hf_config, "num_hidden_layers"):
        parts = ", ".join(getattr(hf_config, "sub_configs", None) or ()) or "none"
        raise ValueError(f"a composite config (its parts: {parts}): import its language model")
    try:
        twin_config = _tiny.tiny_config(hf_config)
        key = _verify.structure_key(twin_config, architecture=architecture, kind="anatomy")
        known = _verify.read_memo("anatomies").get(key)
        if known is not None:
            return from_json(known["anatomy"])
        with torch.random.fork_rng(devices=[]):
            twin = _tiny.random_hf_model(
                getattr(_loading.transformers_module(), architecture), twin_config
            )
            layers_name, layers = _layer_list(twin, twin_config)
            if _split_layers.is_split(layers[0]):  # BERT's layout
                anatomy = Anatomy(
                    **_split_layers.read(twin, twin_config, architecture, layers_name)
                )
            else:
                reader = _Reader(twin, twin_config, architecture)
                anatomy = _scalars.disambiguated(
                    reader.anatomy(), reader.measured, twin_config, hf_config,
                    lambda config: _measured(config, architecture),
                    lambda config: _shapes_of(config, architecture),
                )  # fmt: skip
                rounded = bfloat16_normalizer(anatomy.embed_scale, twin_config)
                anatomy = dataclasses.replace(anatomy, embed_scale=rounded)
                if _scalars.undecided(reader.measured, twin_config, hf_config):
                    return anatomy  # right for this checkpoint; not remembered
    except (AttributeError, KeyError, TypeError, IndexError, RuntimeError) as error:
        raise ValueError(
            f"its tiny twin could not be read ({type(error).__name__}: {error})"
        ) from error
    _verify.remember(key, {"anatomy": dataclasses.asdict(anatomy)}, section="anatomies")
    return anatomy


def _shapes_of(twin_config: Any, architecture: str) -> dict[str, tuple[int, ...]]:
    """The parameters' shapes of a twin of `twin_config` (built on the meta device)."""
    model_class = getattr(_loading.transformers_module(), architecture)
    with torch.device("meta"):
        twin = model_class(twin_config)
    return {name: tuple(p.shape) for name, p in twin.named_parameters()}


def _measured(twin_config: Any, architecture: str) -> dict[str, float]:
    """The scalars a twin of `twin_config` multiplies by (`_scalars`' second twin)."""
    with torch.random.fork_rng(devices=[]):
        twin = _tiny.random_hf_model(getattr(_loading.transformers_module(), architecture),
                                     twin_config)  # fmt: skip
    reader = _Reader(twin, twin_config, architecture)
    reader.anatomy()
    return reader.measured


class _Reader(Watching):
    """One twin, watched: `anatomy` does the reading."""

    def __init__(self, twin: nn.Module, config: Any, architecture: str) -> None:
        self.twin, self.config, self.architecture = twin, config, architecture
        self.names = {id(m): name for name, m in twin.named_modules()}
        self.layers_name, layers = _layer_list(twin, config)
        self.layers = list(layers)
        self.mixers, attending = self._mixers()
        self.attending = attending
        self.layer = self.layers[attending[0] if attending else 0]
        self.first_identities = _first_layer.identities_in_first(self.layers)
        if self.first_identities and self.layer is self.layers[0]:
            self.layer = self.layers[1]  # its pieces as the other layers hold them
        self.base_name = self.layers_name.rsplit(".", 1)[0] if "." in self.layers_name else ""
        self.base = twin.get_submodule(self.base_name) if self.base_name else twin
        self.head = _head.prediction_head(twin, self.base, config.vocab_size)
        self.embed_norm: str | None = None  # found by `_watch`
        self.embed_norm_is_final = False
        self.positions_fixed: str | None = None  # a sinusoidal table, found by `_positions`
        self.uncalled: tuple[str, ...] = ()  # modules for other inputs, found by `_watch`
        self.embed_norm_before_positions = False  # found by `_entering`
        self.measured: dict[str, float] = {}  # the scalars `anatomy` measured (`_scalars`)

    def anatomy(self) -> Anatomy:
        """The twin's anatomy: its places, its first layer's pieces and wiring, and the
        scalars measured on it (module docstring)."""
        children = dict(self.layer.named_children())
        if self.mixers is not None and "attention" not in dict(self.mixers.pattern).values():
            return self._attention_free(children)
        attn = child(children, ATTENTION_NAMES, "Attention", "attention sublayer")
        mlp = mlp_child(children)
        mixing = (attn, self.mixers.name) if self.mixers else ()
        held = self._held_experts(mlp, mixing)
        capped = logit_cap(self.config) is not None
        calls, logits, embed_ratio, positions = self._watch(capped)
        beside = _experts.beside_block(children, mlp)  # Granite's shared_mlp
        calls, children = _merged_beside(calls, children, mlp, beside)
        unused, flat, norm_names = self._pieces(children, attn, mlp, calls)
        norms, parallel, writes = wiring(calls, attn, mlp, norm_names)
        inner, attn_module = unwrapped_attention(children[attn])
        first = self.layers[held.index(False) if False in held else 0]  # the first dense MLP's
        mlp_module = first.get_submodule(mlp) if mlp else first
        qk = qk_norms(attn_module)
        experts, act_fn, mlp_maps = self._feed_forward(mlp, mlp_module, held, flat, beside)
        kind, bias, eps = self._norm_kind(children, norms, attn_module, qk)
        latent = hasattr(attn_module, "kv_a_proj_with_mqa")  # DeepSeek's latent attention
        d_head = attention_head_width(attn_module, self.config)
        scaling = None if latent else attention_scaling(attn_module, d_head)
        subs = self._sub_norms(attn_module, mlp_module, d_head)
        attn_maps, gate_per_head = self._attention_maps(
            attn_module, latent, (*(qk or ()), subs.get("attn", "")), d_head
        )
        self._measure(embed_ratio, writes, logits, scaling)
        return Anatomy(
            **self._places(),
            attn=attn + inner,
            mlp=mlp,
            norms=tuple(norms),
            placement=self._placement(norms),
            parallel=parallel,
            norm_kind=kind,
            norm_bias=bias,
            eps=eps,
            attn_maps=attn_maps,
            latent=latent,
            attn_gate_per_head=gate_per_head,
            **self._attention_fields(attn_module, attn + inner, qk, d_head),
            mlp_maps=mlp_maps,
            experts=experts,
            renames=_saved.renames(self.twin, self.layers_name),
            **self._stream_entry_fields(positions),
            unused=unused,
            uncalled=self.uncalled,
            act_fn=act_fn,
            **self._scales(embed_ratio, scaling, d_head, writes, logits),
            logit_cap=capped,
            mixers=self.mixers,
            mixer_norms=self._mixer_norms(mlp, norms, writes, (kind, bias, eps)),
            first_identities=self.first_identities,
            **self.head,
            alibi=self._alibi(children[attn]),
            **{f"{sublayer}_sub_norm": subs.get(sublayer) for sublayer in ("attn", "mlp")},
        )

    def _held_experts(self, mlp: str, mixing: tuple[str, ...]) -> tuple[bool, ...]:
        """Which layers hold experts; a ValueError naming what differs where the layers
        are otherwise unlike (`_layer_differences.held_experts`)."""
        where = (self.first_identities, self.attending)
        return _layer_differences.held_experts(self.layers, (mlp, mixing), *where, self.config)

    def _stream_entry_fields(self, positions: tuple[str | None, int]) -> dict[str, Any]:
        """The anatomy's fields of what enters the stream: the learned positions (`_watch`)
        and their offset, a fixed table, the embedding's norm and whether it comes before
        the positions."""
        return dict(
            positions=positions[0],
            position_offset=positions[1],
            positions_fixed=self.positions_fixed,
            embed_norm=self.embed_norm,
            embed_norm_before_positions=self.embed_norm_before_positions,
        )

    def _sub_norms(
        self, attn_module: nn.Module, mlp_module: nn.Module, d_head: int
    ) -> dict[str, str]:
        """The norms inside the attention and the MLP (`_sub_norms`), by sublayer."""
        heads = self.config.num_attention_heads
        width = getattr(self.config, "intermediate_size", None) or 0
        found = {"attn": sub_norm(attn_module, ATTN_SUB_NORMS, heads * d_head),
                 "mlp": sub_norm(mlp_module, MLP_SUB_NORMS, width)}  # fmt: skip
        return {where: name for where, name in found.items() if name is not None}

    def _attention_fields(
        self, attn_module: nn.Module, name: str, qk: Any, d_head: int
    ) -> dict[str, Any]:
        """The anatomy's fields read off the first attention module (`name` in its layer):
        sinks, a bias only the last layer keeps, the q/k norms."""
        held = _qk_layers.held_by(self.layers, name, qk)
        return dict(
            sinks=isinstance(getattr(attn_module, "sinks", None), nn.Parameter),
            last_layer_o_bias=_last_layer_bias(self.layers, name, self.config),
            qk_norm=qk_norm_kind(attn_module, qk, d_head),
            qk_norm_names=qk,
            qk_norm_bare=qk is not None and _qk_layers.is_weightless(getattr(attn_module, qk[0])),
            qk_norm_on=_qk_layers.pattern(held, self.config) if qk is not None else "all",
        )

    def _measure(
        self, embed_ratio: float, writes: tuple[float, float], logits: float, scaling: float | None
    ) -> None:
        """Keep the scalars measured in `measured` (`_scalars` reads them on more twins); the
        softmax scale only where the attention keeps one."""
        self.measured = {"embed_scale": embed_ratio, "attn_write": writes[0],
                         "mlp_write": writes[1], "logit_scale": logits}  # fmt: skip
        if scaling is not None:
            self.measured["attn_scale"] = scaling

    def _norm_kind(
        self,
        children: dict[str, nn.Module],
        norms: list[tuple[str, str]],
        attn_module: nn.Module,
        qk: tuple[str, str] | None,
    ) -> tuple[str, bool, float]:
        """The kind, bias and epsilon every norm shares (`_probes.norm_kind`): the layer's
        `norms`, the final and embedding norms, and the attention's q/k norms (but
        weightless ones, read apart: `_qk_layers`)."""
        if qk is not None and _qk_layers.is_weightless(getattr(attn_module, qk[0])):
            qk = None
        epsilons = [e for f in CONFIG_EPSILONS if (e := getattr(self.config, f, None)) is not None]
        return norm_kind(
            [*(children[hf] for _, hf in norms),
             *(m for m in (self._final_norm(), self._embed_norm_module()) if m is not None),
             *(getattr(attn_module, n) for n in qk or ())],
            (*epsilons, *USUAL_EPSILONS),
        )  # fmt: skip

    def _attention_maps(
        self, attn_module: nn.Module, latent: bool, norms: tuple[str, ...], d_head: int
    ) -> tuple[tuple[tuple[str, str, bool], ...], bool | None]:
        """The attention's linear maps (for a latent attention, read by its own rules, only
        its output gate: `_roles.latent_gate`; its `norms` are not maps) and whether its
        query map gates the output per head (`_roles.gated_queries`)."""
        n_heads = self.config.num_attention_heads
        return latent_gate(attn_module, n_heads) if latent else gated_queries(
            linear_maps(attn_module, ATTENTION_ROLES, skip=norms, own_allowed=("sinks",)),
            attn_module, n_heads, d_head,
        )  # fmt: skip

    def _placement(self, norms: list[tuple[str, str]]) -> str:
        """Where the layer's `norms` sit (`_wiring.placement`); a ValueError where the final
        norm does not fit it (post-residual norms have none, the others one)."""
        where = placement({ours for ours, _ in norms})
        if (self._final_norm() is None) != (where == "post_residual"):
            raise ValueError(f"{where} norms and {'no' if self._final_norm() is None else 'a'} "
                             "final norm: not recognised")  # fmt: skip
        return where

    def _scales(
        self,
        embed_ratio: float,
        scaling: float | None,
        d_head: int,
        writes: tuple[float, float],
        logits: float,
    ) -> dict[str, Scale]:
        """The scalars measured, each as a function of the twin's config, by `Anatomy`'s
        field (the softmax scale UNKNOWN where the attention keeps none)."""
        return dict(
            embed_scale=self._explain(embed_ratio, "embedding scale"),
            attn_scale=UNKNOWN
            if scaling is None
            else self._explain(scaling, "softmax scale", d_head=d_head),
            attn_write=self._explain(writes[0], "attention's write scale"),
            mlp_write=self._explain(writes[1], "MLP's write scale"),
            logit_scale=self._explain(logits, "logit scale"),
        )

    def _alibi(self, attention: nn.Module) -> bool:
        """Whether ALiBi's slopes are handed to the layer's `attention` (`_alibi`)."""
        return (
            _alibi.slopes_handed(self.twin, attention, self.config.num_attention_heads) is not None
        )

    def _attention_free(self, children: dict[str, nn.Module]) -> Anatomy:
        """A model whose every layer is one norm and one mixer, `x + mixer(norm(x))`
        (Mamba 2): no attention, no MLP; the rest read as for any model."""
        mixer = self.mixers.name
        norms = [n for n, m in children.items() if is_norm(m)]
        others = [n for n in children if n not in (mixer, *norms)]
        if len(norms) != 1 or others:
            raise ValueError(f"an attention-free layer of {sorted(children)}: one norm and "
                             "one mixer are recognised")  # fmt: skip
        calls, logits, embed_ratio, positions = self._watch(capped=False)
        (_, resid, out), *pieces = calls
        called = {name: (x, y) for name, x, y in pieces}
        if called[norms[0]][1] is not called[mixer][0]:
            raise ValueError(f"the norm {norms[0]} does not feed the mixer {mixer}")
        write = ratio(out - resid, called[mixer][1], "what the mixer adds to the stream")
        epsilons = [getattr(self.config, f) for f in CONFIG_EPSILONS if hasattr(self.config, f)]
        kind, bias, eps = norm_kind(
            [children[norms[0]], self._final_norm()], (*epsilons, *USUAL_EPSILONS)
        )
        none = Scale()
        return Anatomy(
            **self._places(), attn="", mlp="", norms=(("ln1", norms[0]),), placement="pre",
            parallel=False, norm_kind=kind, norm_bias=bias, eps=eps, attn_maps=(),
            qk_norm=None, qk_norm_names=None, mlp_maps=(), act_fn="relu",
            embed_scale=self._explain(embed_ratio, "embedding scale"), attn_scale=none,
            attn_write=self._explain(write, "mixer's write scale"), mlp_write=none,
            logit_scale=self._explain(logits, "logit scale"), sinks=False,
            positions=positions[0], position_offset=positions[1], unused=(), experts=None,
            renames=_saved.renames(self.twin, self.layers_name), logit_cap=False,
            mixers=self.mixers,
        )  # fmt: skip

    def _places(self) -> dict[str, Any]:
        """Where the model keeps its layers, embedding, final norm and unembedding."""
        embed, unembed = self.twin.get_input_embeddings(), self.twin.get_output_embeddings()
        return dict(
            architecture=self.architecture,
            layers=self.layers_name,
            base=f"{self.base_name}." if self.base_name else "",
            embed=self.names[id(embed)],
            final_norm=self.names.get(id(self._final_norm()), ""),
            unembed=self.names[id(unembed)],
            rotary=any("rotary" in type(m).__name__.lower() for m in self.twin.modules()),
            tied=unembed.weight is embed.weight,
            embed_rows_extra=_extra_rows(embed, self.config),
            unembed_bias=getattr(unembed, "bias", None) is not None,
        )

    def _pieces(
        self,
        children: dict[str, nn.Module],
        attn: str,
        mlp: str,
        calls: list[tuple[str, Tensor, Tensor]],
    ) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
        """The layer's pieces a causal LM never calls (cross-attention an encoder would
        feed), the MLP maps it holds itself, and its norms; any other piece is a ValueError.
        An MLP of the layer's own maps is added to `calls` as one call (the first map's
        input, the last one's output)."""
        called = {name for name, _, _ in calls}
        unused = tuple(n for n in children if n not in called and is_cross(n))
        flat = flat_mlp(children) if mlp == "" else ()
        norm_names = [n for n, m in children.items() if is_norm(m) and n not in unused]
        others = [
            f"{n} ({type(m).__name__})" for n, m in children.items()
            if n not in (attn, mlp, *flat, *norm_names, *unused, *ACTIVATION_NAMES)
            and not isinstance(m, nn.Dropout | nn.Identity)
        ]  # fmt: skip
        if others:
            raise ValueError(f"a decoder layer holds pieces not recognised: {others}")
        if flat:
            ins = {name: (x, y) for name, x, y in calls}
            calls.append(("", ins[flat[0]][0], ins[flat[-1]][1]))
        return unused, flat, norm_names

    def _feed_forward(
        self,
        mlp: str,
        mlp_module: nn.Module,
        held: tuple[bool, ...],
        flat: tuple[str, ...],
        beside: str | None = None,
    ) -> tuple[Experts | None, str, tuple[tuple[str, str, bool], ...]]:
        """The mixture of experts (if the layers `held` flags hold one), the activation, and
        the dense MLP's maps (the first dense layer's)."""
        first_moe = held.index(True) if True in held else 0
        moe_block = getattr(self.layers[first_moe], mlp, None) if mlp else None
        if moe_block is None or not _experts.block_name({mlp: moe_block}):
            act_fn = activation(mlp_module)
            skip = ACTIVATION_NAMES if act_fn == "xielu" else ()  # its scalars: its own rules
            skip += MLP_SUB_NORMS  # read as a norm (`_sub_norms`), not a map
            maps = linear_maps(mlp_module, MLP_ROLES, skip, only=flat or None)
            return None, act_fn, maps
        act_fn = activation(moe_block.experts)
        shared = None
        if beside is not None:
            shared = (beside, self.layers[first_moe].get_submodule(beside))
            if activation(shared[1]) != act_fn:
                raise ValueError("the shared expert's and the experts' activations differ")
        experts = _experts.recognise(
            mlp, moe_block, self.twin, self.config, act_fn, self.layers_name, held, shared
        )
        if all(held):
            return experts, act_fn, ()
        if activation(mlp_module) != act_fn:
            raise ValueError("the dense and the expert MLPs' activations differ")
        return experts, act_fn, linear_maps(mlp_module, MLP_ROLES, skip=())

    def _mixer_norms(
        self,
        mlp: str,
        norms: list[tuple[str, str]],
        writes: tuple[float, float],
        kind: tuple[str, bool, float],
    ) -> tuple[tuple[str, str], ...] | None:
        """A hybrid's mixer layers' norms where they differ from the attention layers'
        (`_mixer_norms`: OLMo Hybrid's); None in any other model."""
        if self.mixers is None:
            return None
        epsilons = [e for f in CONFIG_EPSILONS if (e := getattr(self.config, f, None)) is not None]
        norms_of = (kind, (*epsilons, *USUAL_EPSILONS))
        return _mixer_norms.read(self.twin, (self.layers, self.attending), self.mixers.name, mlp,
                                 (norms, writes), norms_of)  # fmt: skip

    def _mixers(self) -> tuple[Mixers | None, list[int]]:
        """A hybrid's mixers (`_mixers.recognise`; None where every layer attends), and
        which layers attend. A mixer named or typed as attention (Kimi Linear's delta layers,
        `self_attn` beside its latent attention) is told apart by its parts."""
        attention, mixers = [], []
        for layer in self.layers:
            children = dict(layer.named_children())
            found = [n for n, m in children.items()
                     if (n in ATTENTION_NAMES or type(m).__name__.endswith("Attention"))
                     and not _mixers.is_mixer(m)]  # fmt: skip
            attention.append(found[0] if len(found) == 1 else None)
            mixers.append(_mixers.mixer_child(children, tuple(found)))
        attending = [i for i, name in enumerate(attention) if name is not None]
        return _mixers.recognise(self.layers, self.config, attention, mixers), attending

    def _explain(self, value: float, what: str, d_head: int | None = None) -> Scale:
        """`value` as a function of the twin's config (`_probes.explain`)."""
        return explain(value, self.config, what, d_head)


def _last_layer_bias(layers: list[nn.Module], attn: str, config: Any) -> str | None:
    """The name of a parameter of the attention that only the last layer holds, a vector as
    wide as the stream (GPT-NeoX Japanese's `dense_bias`, added to what the attention
    writes), or None; any other parameter some layers hold and others not is a ValueError.
    A hybrid's layers without attention hold none."""
    held = {i: {n for n, _ in layer.get_submodule(attn).named_parameters(recurse=False)}
            for i, layer in enumerate(layers) if _holds(layer, attn)}  # fmt: skip
    first = held[min(held)]
    extra = set().union(*held.values()) - first
    if not extra:
        return None
    name = sorted(extra)[0]
    holders = [i for i, names in held.items() if name in names]
    vector = tuple(getattr(layers[-1].get_submodule(attn), name, torch.empty(0)).shape)
    if len(extra) != 1 or holders != [len(layers) - 1] or vector != (config.hidden_size,):
        raise ValueError(
            f"the attentions of layers {holders} hold {sorted(extra)}, the others not: only "
            "a bias of the last layer's output is recognised"
        )
    return name


def _merged_beside(
    calls: list[tuple[str, Tensor, Tensor]],
    children: dict[str, nn.Module],
    mlp: str,
    beside: str | None,
) -> tuple[list[tuple[str, Tensor, Tensor]], dict[str, nn.Module]]:
    """The calls and the layer's pieces with a shared expert held `beside` the `mlp` block
    (Granite's `shared_mlp`) made one MLP: the block's write and the shared expert's,
    summed; unchanged without one."""
    if beside is None:
        return calls, children
    shared = {n: y for n, _, y in calls}[beside]
    calls = [(n, x, y + shared if n == mlp else y) for n, x, y in calls if n != beside]
    return calls, {n: m for n, m in children.items() if n != beside}


def _holds(layer: nn.Module, name: str) -> bool:
    try:
        layer.get_submodule(name)
    except AttributeError:
        return False
    return True


def _extra_rows(embed: nn.Module, config: Any) -> int:
    """The embedding's rows past the vocabulary (Mllama's image tokens; an encoder-decoder's
    decoder's own, Marian's `decoder_vocab_size`); fewer is refused."""
    vocab = getattr(config, "decoder_vocab_size", None) or config.vocab_size
    extra = embed.weight.shape[0] - vocab
    if extra < 0:
        raise ValueError(f"an embedding of {embed.weight.shape[0]} rows for a vocabulary of "
                         f"{vocab}")  # fmt: skip
    return extra


def _layer_list(twin: nn.Module, config: Any) -> tuple[str, nn.ModuleList]:
    for name, module in twin.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == config.num_hidden_layers:
            return name, module
    raise ValueError(f"no list of {config.num_hidden_layers} decoder layers found")
