"""BERT's layer layout, recognised by watching its tiny twin run.

A BERT-like layer splits each sublayer over two modules, with the residual add and a norm
inside the second:

    attention.self        query, key, value (and the softmax)
    attention.output      dense (the output projection), then LayerNorm(resid + write)
    intermediate          dense, then the activation
    output                dense, then LayerNorm(resid_mid + write)

(pre-norm variants move the norms in front: MegatronBERT, RoBERTa-PreLayerNorm,
XLM-RoBERTa-XL). The attention sublayer is read as the call from `attention.self`'s input
to `attention.output.dense`'s output, the MLP as the call from `intermediate.dense`'s input
to `output.dense`'s output; with those, `_wiring` places the norms by following the tensors,
as for any other layer. Around the layers it recognises, again by what the run passed:

    the embedding   word embeddings plus learned positions from some row of their table
                    (RoBERTa's from `padding_idx + 1`) plus row 0 of the token-type table
                    (a constant of every input: folded into the positions), then a norm
                    (`ln_embed`) where there is one, then a linear map into the stream
                    where the embeddings are narrower (`embed_proj`: ELECTRA, RemBERT)
    the final norm  a norm reading the last layer's output (pre-norm variants only)
    the head        a dense map, an activation, a norm, then the decoder (BERT's
                    `cls.predictions.transform`, RoBERTa's `lm_head`): `unembed_transform`;
                    ELECTRA's and RemBERT's map to the decoder's narrower width

Activations are found by replacing what a dense map computed with a range of values and
reading what the next piece receives. What it returns is `Anatomy`'s fields; anything it
does not recognise is a ValueError naming it, and `_verify` still checks the result.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from hookedattn.core.components.mlp import ACTIVATIONS
from hookedattn.core.hf import _handed_rotary, _projections, _saved
from hookedattn.core.hf._probes import (
    CONFIG_EPSILONS,
    USUAL_EPSILONS,
    Scale,
    explain,
    norm_kind,
    ratio,
)
from hookedattn.core.hf._roles import attention_head_width, is_cross, is_norm
from hookedattn.core.hf._wiring import placement, wiring

_TOKENS = (2, 7)
_ATTENTION = ("self.query", "self.key", "self.value", "output.dense")  # under `attention`
_MLP = ("intermediate.dense", "output.dense")


def _is_norm(module: nn.Module) -> bool:
    """A norm is a leaf here: RoBERTa-PreLayerNorm's every module has "Norm" in its name."""
    return is_norm(module) and not any(True for _ in module.children())


def is_split(layer: nn.Module) -> bool:
    """Whether a decoder layer has BERT's layout (module docstring)."""
    children = dict(layer.named_children())
    attention = children.get("attention")
    inner = dict(attention.named_children()) if attention is not None else {}
    return {"self", "output"} <= set(inner) and {"intermediate", "output"} <= set(children)


def read(twin: nn.Module, config: Any, architecture: str, layers_name: str) -> dict[str, Any]:
    """`Anatomy`'s fields for a twin whose layers have BERT's layout."""
    return _Watcher(twin, config, layers_name).fields(architecture)


# The anatomy's fields every split-layer model shares: its attention and MLP in their own
# parts of the layer, sequential, no q/k norms, embedding scale, sinks, experts or soft cap.
_FIXED = dict(attn="attention", mlp="", parallel=False, qk_norm=None, qk_norm_names=None,
              embed_scale=Scale(), sinks=False, experts=None, logit_cap=False)  # fmt: skip


class _Watcher:
    """One twin, its pieces named, run once with hooks on each (`fields`)."""

    def __init__(self, twin: nn.Module, config: Any, layers_name: str) -> None:
        self.twin, self.config, self.layers_name = twin, config, layers_name
        self.names = {id(m): name for name, m in twin.named_modules()}
        self.layers = list(twin.get_submodule(layers_name))
        self.layer = self.layers[0]
        self.embed = twin.get_input_embeddings()
        self.unembed = twin.get_output_embeddings()
        self.base = getattr(twin, "base_model_prefix", "")
        inside = (f"{layers_name}.", self.names[id(self.unembed)])
        self.outer_norms = {n: m for n, m in twin.named_modules()
                            if _is_norm(m) and not n.startswith(inside)}  # fmt: skip

    def fields(self, architecture: str) -> dict[str, Any]:
        """Every field `Anatomy` needs (module docstring)."""
        self._check_decoder()
        self._check_pieces()
        seen = self._watch()
        unused = tuple(n for n, _ in self.layer.named_children() if is_cross(n))
        norms, writes = self._wiring(seen, unused)
        where = placement({ours for ours, _ in norms})
        projection = _projections.embed_projection(self.twin, seen, self._outer_linears())
        rotary = _handed_rotary.handed_table(seen, seen["handed"], self._attention_scale()[0])
        embed_norm, positions, offset, token_types = self._embedding(
            seen, projection.reads, rotary is not None
        )
        final_norm = self._final_norm(seen, where)
        head = self._head(seen, final_norm)
        used = [embed_norm, final_norm, head[1]]
        kind, bias, eps = self._norm_kind(norms, used)
        d_head, scaling = self._attention_scale()
        logits = ratio(seen["logits"], seen["unembed_out"], "the logits")
        return dict(
            **_FIXED,
            architecture=architecture,
            layers=self.layers_name,
            base=f"{self.base}." if self.base else "",
            embed=self.names[id(self.embed)],
            final_norm=final_norm or "",
            unembed=self.names[id(self.unembed)],
            norms=tuple(norms),
            placement=where,
            norm_kind=kind,
            norm_bias=bias,
            eps=eps,
            attn_maps=self._maps("qkvo", _ATTENTION, within="attention."),
            mlp_maps=self._maps(("up", "down"), _MLP),
            act_fn=self._activation("intermediate.dense", "output.dense", within=self.layer),
            attn_scale=explain(scaling, self.config, "softmax scale", d_head),
            attn_write=explain(writes[0], self.config, "attention's write scale"),
            mlp_write=explain(writes[1], self.config, "MLP's write scale"),
            logit_scale=explain(logits, self.config, "logit scale"),
            rotary=rotary is not None,
            rotary_table=rotary,
            tied=self.unembed.weight is self.embed.weight,
            unembed_bias=getattr(self.unembed, "bias", None) is not None,
            positions=positions,
            position_offset=offset,
            unused=unused,
            renames=_saved.renames(self.twin, self.layers_name),
            embed_norm=embed_norm,
            token_types=token_types,
            positions_within=bool(offset) and self._rows(positions) == self._max_positions(),
            head_dense=head[0],
            head_norm=head[1],
            head_act=head[2],
            **_projections.anatomy_fields(self.twin, self.config, projection, head[0]),
        )

    def _check_decoder(self) -> None:
        """Check the twin is a decoder (`is_decoder=True`): the attention is causal then."""
        if not getattr(self.config, "is_decoder", False):
            raise ValueError(
                "is_decoder=False: this layout's attention is then bidirectional (a masked "
                "LM's), not a causal LM's; a decoder checkpoint sets is_decoder=True"
            )

    def _wiring(
        self, seen: dict[str, Any], unused: tuple[str, ...]
    ) -> tuple[list[tuple[str, str]], tuple[float, float]]:
        """The layer's norms as (our name, theirs) and the attention's and the MLP's write
        scales, read off the calls `seen` (`_wiring.wiring`); the `unused` pieces' norms
        left out."""
        layer_norms = [n for n, m in self.layer.named_modules()
                       if _is_norm(m) and not n.startswith(unused or ("\0",))]  # fmt: skip
        calls = [("", *seen["layer"]), ("attn", seen["attn_in"], seen["attn_out"]),
                 ("mlp", seen["mlp_in"], seen["mlp_out"]),
                 *((n, *seen[f"norm:{n}"]) for n in layer_norms)]  # fmt: skip
        norms, _, writes = wiring(calls, "attn", "mlp", layer_norms)
        return norms, writes

    def _norm_kind(
        self, norms: list[tuple[str, str]], used: list[str | None]
    ) -> tuple[str, bool, float]:
        """The kind, bias and epsilon every norm shares (`_probes.norm_kind`): the layer's
        `norms` and the twin's `used` ones (None: not there)."""
        return norm_kind(
            [*(self.layer.get_submodule(n) for _, n in norms),
             *(self.twin.get_submodule(n) for n in used if n)],
            (*(getattr(self.config, f) for f in CONFIG_EPSILONS if hasattr(self.config, f)),
             *USUAL_EPSILONS),
        )  # fmt: skip

    def _attention_scale(self) -> tuple[int, float]:
        """The attention's head width and the factor its scores are multiplied by."""
        attention = self.layer.attention.self
        d_head = attention_head_width(attention, self.config)
        # Causal by `is_decoder` (`_check_decoder`). MegatronBERT's keeps no scale: then
        # BERT's own, 1 / sqrt(d_head), a hypothesis the verification checks.
        return d_head, float(getattr(attention, "scaling", d_head**-0.5))

    def _maps(
        self, roles: Sequence[str], names: tuple[str, ...], within: str = ""
    ) -> tuple[tuple[str, str, bool], ...]:
        """Each map's (role, name, whether it has a bias), the names under `within`."""
        return tuple(
            (role, name, self._bias(f"{within}{name}"))
            for role, name in zip(roles, names, strict=True)
        )

    def _check_pieces(self) -> None:
        """Every layer alike, every weight-bearing piece of the first one known."""
        first = [(n, tuple(p.shape)) for n, p in self.layer.named_parameters()]
        if any([(n, tuple(p.shape)) for n, p in layer.named_parameters()] != first
               for layer in self.layers):  # fmt: skip
            raise ValueError("decoder layers hold different pieces: not recognised")
        known = {f"attention.{n}" for n in _ATTENTION} | set(_MLP)
        for name, module in self.layer.named_modules():
            if name in known and type(module) is not nn.Linear:
                raise ValueError(f"{name} ({type(module).__name__}) is not a linear map")
        unknown = [n for n, m in self.layer.named_modules()
                   if any(True for _ in m.parameters(recurse=False)) and n not in known
                   and not _is_norm(m) and not is_cross(n.split(".")[0])]  # fmt: skip
        if unknown:
            raise ValueError(f"a decoder layer holds pieces not recognised: {unknown}")

    def _bias(self, name: str) -> bool:
        return self.layer.get_submodule(name).bias is not None

    def _watch(self) -> dict[str, Any]:
        """Run the twin once; what each piece read and wrote."""
        seen: dict[str, Any] = {}

        def keep(key: str, both: bool = True) -> Callable[..., None]:
            def record(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
                x = next((a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)), None)
                y = output[0] if isinstance(output, tuple | list) else output
                seen[key] = (x, y) if both else y

            return record

        layer = self.layer
        watched = [(layer, "layer"), (layer.attention.self, "attn"),
                   (layer.attention.output.dense, "attn_w"), (layer.intermediate.dense, "mlp"),
                   (layer.output.dense, "mlp_w"), (self.layers[-1], "last"),
                   (self.embed, "embed"), (self.unembed, "unembed")]  # fmt: skip
        watched += [(m, f"norm:{n}") for n, m in layer.named_modules() if _is_norm(m)]
        watched += [(m, f"outer:{n}") for n, m in self.outer_norms.items()]
        watched += [(m, f"table:{n}") for n, m in self.twin.named_modules()
                    if isinstance(m, nn.Embedding) and m is not self.embed]  # fmt: skip
        watched += [(m, f"linear:{n}") for n, m in self._outer_linears().items()]
        handles = [m.register_forward_hook(keep(key), with_kwargs=True) for m, key in watched]

        def handed(module: nn.Module, args: tuple, kwargs: dict) -> None:
            seen["handed"] = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]

        handles.append(layer.register_forward_pre_hook(handed, with_kwargs=True))
        tokens = torch.randint(3, self.config.vocab_size, _TOKENS, generator=_seeded())
        try:
            with torch.no_grad():
                seen["logits"] = self.twin(tokens).logits
        finally:
            for handle in handles:
                handle.remove()
        if "attn" not in seen:
            raise ValueError(
                "attention.self was never called: the layer replaced its attention while it "
                "ran (BigBird's block-sparse attention switching to full)"
            )
        seen["attn_in"], seen["attn_out"] = seen["attn"][0], seen["attn_w"][1]
        seen["mlp_in"], seen["mlp_out"] = seen["mlp"][0], seen["mlp_w"][1]
        seen["unembed_out"] = seen["unembed"][1]
        seen["tokens"] = tokens
        return seen

    def _outer_linears(self) -> dict[str, nn.Module]:
        """The linear maps outside the layers and the embeddings, but the decoder's."""
        return {n: m for n, m in self.twin.named_modules()
                if isinstance(m, nn.Linear) and not n.startswith(f"{self.layers_name}.")
                and m is not self.unembed}  # fmt: skip

    def _embedding(
        self, seen: dict[str, Any], entering: Tensor, rotary: bool = False
    ) -> tuple[str | None, str | None, int, str | None]:
        """The embedding norm, the positions' table and the row of position 0 in it, and
        the token-type table (row 0 added to every token), from `entering`: what entered
        layer 0, or the projection into it (`_projections`). Where the layers are handed
        `rotary` positions (`_handed_rotary`), the stream may hold none."""
        norm = next((n for n, m in self.outer_norms.items() if f"outer:{n}" in seen
                     and _close(seen[f"outer:{n}"][1], entering)), None)  # fmt: skip
        summed = seen[f"outer:{norm}"][0] if norm else entering
        if summed.shape != seen["embed"][1].shape:
            raise ValueError(
                f"the embeddings are {seen['embed'][1].shape[-1]} wide and the stream "
                f"{entering.shape[-1]}: a concatenation between them (RoCBERT's), or a "
                "projection that is not one linear map of the embeddings' norm, we do not read"
            )
        added = summed - seen["embed"][1]
        width = added.shape[-1]
        tables = {key.removeprefix("table:"): value for key, value in seen.items()
                  if key.startswith("table:") and value[1].shape[-1] == width}  # fmt: skip
        types = next((n for n, (_, y) in tables.items()
                      if _close(y, self._table(n)[0].expand_as(y))), None)  # fmt: skip
        if types is not None:
            added = added - self._table(types)[0]
        for name in tables:
            if name == types:
                continue
            rows, weight = added[0], self._table(name)
            for offset in range(weight.shape[0] - rows.shape[0] + 1):
                if _close(weight[offset : offset + len(rows)], rows):
                    return norm, name, offset, types
        if rotary and _close(summed - added, summed):  # the token type all that was added
            return norm, None, 0, types
        raise ValueError(
            "the stream entering the first layer is not the embedding plus learned "
            "positions and token type 0 (then a norm): pieces we do not read"
        )

    def _table(self, name: str) -> Tensor:
        return self.twin.get_submodule(name).weight.detach()

    def _rows(self, name: str | None) -> int:
        return 0 if name is None else self._table(name).shape[0]

    def _max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 0)

    def _final_norm(self, seen: dict[str, Any], where: str) -> str | None:
        """The norm reading the last layer's output: one after pre-norms, none after
        post-residual ones."""
        last = seen["last"][1]
        found = [n for n in self.outer_norms if f"outer:{n}" in seen
                 and _close(seen[f"outer:{n}"][0], last)]  # fmt: skip
        if where == "post_residual" and not found:
            return None
        if where == "pre" and len(found) == 1:
            return found[0]
        raise ValueError(f"{len(found)} norms read the last layer's output after {where} norms")

    def _head(
        self, seen: dict[str, Any], final_norm: str | None
    ) -> tuple[str | None, str | None, str | None]:
        """The head transform's dense map, norm and activation before the decoder; Nones
        where the decoder reads the final stream itself."""
        final = seen[f"outer:{final_norm}"][1] if final_norm else seen["last"][1]
        decoder_in = seen["unembed"][0]
        if _close(decoder_in, final):
            return None, None, None
        dense = [n for n in self._outer_linears() if f"linear:{n}" in seen
                 and _close(seen[f"linear:{n}"][0], final)]  # fmt: skip
        norm = [n for n in self.outer_norms if f"outer:{n}" in seen
                and _close(seen[f"outer:{n}"][1], decoder_in)]  # fmt: skip
        if len(dense) != 1 or len(norm) != 1:
            raise ValueError(
                "the decoder reads neither the final stream nor a dense map, an activation "
                "and a norm of it: a head we do not read"
            )
        act = self._activation(dense[0], norm[0], within=self.twin)
        return dense[0], norm[0], act

    def _activation(self, dense: str, reader: str, within: nn.Module) -> str:
        """Our name for the activation between `dense` and the piece `reader` that reads
        it (`activation_between`)."""
        return activation_between(self.twin, self.config.vocab_size, dense, reader, within)


def activation_between(
    twin: nn.Module, vocab_size: int, dense: str, reader: str, within: nn.Module
) -> str:
    """Our name for the activation between `dense` and the piece `reader` that reads it
    (names in `within`): the dense map's output replaced by a range of values, the
    reader's input read back (a run of the twin)."""
    dense_module, reader_module = within.get_submodule(dense), within.get_submodule(reader)
    width = dense_module.out_features
    x = torch.linspace(-6, 6, 2 * 7 * width).reshape(2, 7, width)
    got: list[Tensor] = []

    def replace(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return x.to(output.dtype)

    def read_input(module: nn.Module, args: tuple) -> None:
        got.append(args[0])

    handles = [dense_module.register_forward_hook(replace),
               reader_module.register_forward_pre_hook(read_input)]  # fmt: skip
    try:
        with torch.no_grad():
            twin(torch.randint(3, vocab_size, _TOKENS, generator=_seeded()))
    finally:
        for handle in handles:
            handle.remove()
    for name, ours in ACTIVATIONS.items():
        if name != "solu_ln" and got and _close(got[0], ours(x), rtol=1e-6):
            return name
    raise ValueError(f"the activation between {dense} and {reader} is none of ours")


def _seeded() -> torch.Generator:
    # Token ids from 3: clear of the padding ids (0, 1) whose positions RoBERTa treats apart.
    return torch.Generator().manual_seed(1)


def _close(a: Tensor, b: Tensor, rtol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(
        a.double(), b.double(), rtol=rtol, atol=rtol * (float(b.abs().max()) + 1e-12)
    )
