"""The importer by convention: a family for an architecture no family module describes,
derived from its anatomy (`_anatomy`: recognised by watching its tiny twin run).

Everything a family module writes by hand is derived here from what was recognised:

    config    the shape fields every `transformers` config spells alike (`hidden_size`,
              `num_attention_heads`, `num_key_value_heads`, `head_dim`,
              `intermediate_size`, `vocab_size`, `max_position_embeddings`), the rotary
              positions and windows as `_translate` reads them, and from the anatomy the
              norms (kind, placement, epsilon), the activation, a gated or plain and a
              parallel or sequential block, q/k norms, the softmax scale
    weights   one rule per recognised linear map and norm (`_table.Rule`): q/k/v/o or a
              fused `[q; k; v]`, gate/up/down or a fused `[gate; up]`, biases where they
              are and zeros where not, `1 + w` gains, and the scalars a model multiplies
              its embedding, its sublayers' writes and its logits by folded into the
              weights they multiply (so the model stays our plain components, and the
              residual stream and its decomposition are the architecture's own)

A rotary architecture may rotate each head's halves `(i, i + d / 2)` (ours, GPT-NeoX's,
Llama's) or neighbouring pairs `(2i, 2i + 1)` (GPT-J's, GLM's, Cohere's): nothing in the
module tree tells them apart, so `candidates` offers both and the verification keeps the
one that computes what `transformers` computes; pairs are imported as GPT-J's are, by
permuting each head's query and key dimensions. Last, halves turned the other way
(NanoChat's `rotate_half` with flipped signs, a rotation by minus the angle): a reflection
P of each head's second rotated half conjugates one rotation into the other
(`P R(t) P = R(-t)`), so these are imported by negating that half of the query and key
maps (the scores are the same, P being orthogonal; the hooked queries and keys hold P q).
"""

import dataclasses
import functools
import logging
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import (
    _alibi,
    _deepseek,
    _expert_table,
    _first_layer,
    _mixer_norms,
    _projections,
    _qk_layers,
    _saved,
    _sinusoids,
    _sub_norms,
    _translate,
)
from hookedattn.core.hf._config_fields import (
    NORM_TYPES,
    Decoder,
    attention_free_fields,
    head_width,
    key_value_heads,
    logit_cap,
    mlp_width,
    refuse_unimported,
    rotary_fields,
    scores_cap,
)
from hookedattn.core.hf._gemma import one_plus
from hookedattn.core.hf._probes import Scale
from hookedattn.core.hf._recognised import Anatomy
from hookedattn.core.hf._table import MLP_IN, MLP_OUT, Rule, Table, ones, times, zeros

_LOG = logging.getLogger(__name__)

_HEADS_IN = "(head d_head) d_model -> head d_model d_head"
XIELU_PATTERNS = {"alpha_p": "one -> one", "alpha_n": "one -> one", "beta": "->", "eps": "->"}


@dataclasses.dataclass(frozen=True)
class Convention:
    """The config translation and table of one recognised anatomy."""

    anatomy: Anatomy

    def fields(self, hf_config: Any) -> dict[str, Any]:
        """Our config's fields for `hf_config` (module docstring); a config without a field
        the convention reads is a ValueError naming it."""
        try:
            return self._fields(hf_config)
        except (AttributeError, KeyError) as error:
            raise ValueError(f"its config lacks a field the convention reads: {error}") from error

    def _fields(self, hf_config: Any) -> dict[str, Any]:
        """Our config's fields for `hf_config`, read as the anatomy says."""
        a, c = self.anatomy, Decoder(hf_config)
        if a.attn == "":
            return attention_free_fields(c, a)
        refuse_unimported(c, hf_config)
        d_head = head_width(c)
        n_kv = key_value_heads(c)
        rotary = rotary_fields(c, a, d_head) if a.rotary else {"positional_embedding_type": "none"}
        if a.positions is not None:
            rotary = {"positional_embedding_type": "standard"}
        if a.alibi:  # handed to the layer's attention (not to a module it wraps)
            outer = f"{a.layers}.0.{a.attn.split('.')[0]}"
            rotary = _alibi.fields(hf_config, a.architecture, outer)
        roles = {role for role, _, _ in a.mlp_maps}
        n_ctx = getattr(c, "max_position_embeddings", None) or 2048
        fields = {
            "n_layers": c.num_hidden_layers,
            "d_model": c.hidden_size,
            "n_ctx": n_ctx - a.position_offset if a.positions_within else n_ctx,
            "d_vocab": c.vocab_size + a.embed_rows_extra,
            **({"d_vocab_out": c.vocab_size} if a.embed_rows_extra else {}),
            "n_heads": c.num_attention_heads,
            "d_head": d_head,
            "d_mlp": mlp_width(c) if a.experts is None else getattr(c, a.experts.width_field),
            **_expert_table.routing_fields(c, a),
            "n_key_value_heads": None if n_kv == c.num_attention_heads else n_kv,
            "act_fn": a.act_fn,
            "gated_mlp": bool(roles & {"gate", "gate_up"}) or a.experts is not None,
            "mlp_gate_bias": a.experts is None and _gate_bias(a),
            "parallel_attn_mlp": a.parallel,
            "normalization_type": NORM_TYPES[a.norm_kind],
            "normalization_placement": a.placement,
            "eps": a.eps,
            "use_qk_norm": a.qk_norm is not None,
            "qk_norm_per_head": a.qk_norm != "whole",
            "qk_norm_after_rotary": a.qk_norm_after_rotary,
            "qk_norm_type": NORM_TYPES[a.norm_kind],  # every norm is of one kind
            "attn_scale": None if a.latent else 1 / a.attn_scale.of(c, d_head),
            "attn_scores_soft_cap": scores_cap(c, a),
            "output_logits_soft_cap": logit_cap(c) if a.logit_cap else None,
            "use_attn_sinks": a.sinks,
            "attn_gate": a.attn_gate,
            "attn_gate_per_head": bool(a.attn_gate_per_head),
            "embed_norm": a.embed_norm is not None,
            "embed_norm_before_positions": a.embed_norm_before_positions,
            "unembed_transform": a.head_act,
            **_projections.embed_fields(c, a),
            **rotary,
            **_translate.window(c, _mixed_layer_types(a)),
            **({"mixers": a.mixers.config(c)} if a.mixers is not None else {}),
            **(_mixer_norms.placements(a, a.mixers.config(c).layers) if a.mixers else {}),
            **_first_layer.ln1_fields(a, c.num_hidden_layers),
            **_sub_norms.fields(a),
            **_qk_layers.fields(c, a.qk_norm_on),
        }
        if a.latent:  # its heads, latents, scale and rotary as DeepSeek's config spells them
            fields |= _deepseek.latent_attention_fields(c, rotates=a.rotary)
        return fields

    def table(self, hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
        """The rules that read a checkpoint of this anatomy into `cfg`'s model."""
        a = self.anatomy
        scale = lambda s: s.of(hf_config, cfg.d_head)
        # Token type 0, which every token gets, folded into the positions; without learned
        # positions (RoFormer's rotary, `_handed_rotary`) into the token embeddings.
        types = f"{a.token_types}.weight" if a.token_types and a.positions is None else None
        rules = [
            Rule("embed.W_E", f"{a.embed}.weight", "d_vocab d_embed -> d_vocab d_embed",
                 adjust=times(_embed_factor(a, scale(a.embed_scale), hf_model)),
                 plus_first_row=types),
            *self._position_rules(cfg),
            *self._norm_rules(hf_config, cfg),
            *self._sublayer_rules(cfg, scale(a.attn_write), Decoder(hf_config)),
            *self._mlp_rules(cfg, scale(a.mlp_write), live=hf_model is not None),
            *_sub_norms.rules(a),
            *(_norm(a, "ln_embed", a.embed_norm, 1.0, "d_embed") if a.embed_norm else []),
            *_projections.embed_rules(a),
            *(_norm(a, "ln_final", a.final_norm, 1.0) if a.final_norm else []),
            *self._head_rules(),
            Rule("unembed.W_U", f"{a.unembed}.weight",
                 "d_vocab_out d_unembed -> d_unembed d_vocab_out",
                 adjust=times(scale(a.logit_scale))),
            Rule("unembed.b_U", f"{a.unembed}.bias", "d_vocab_out -> d_vocab_out",
                 adjust=times(scale(a.logit_scale)))
            if a.unembed_bias else zeros("unembed.b_U", "d_vocab_out"),
        ]  # fmt: skip
        if a.uncalled:
            _left_out(a.architecture, a.uncalled)
        if hf_model is None and a.renames:  # a folder: the names its files use
            rules = _saved.renamed(rules, _saved.Renames(dict(a.renames), a.layers))
        expanded = [r for rule in rules for r in rule.expand(cfg.n_layers)]
        return Table(
            rules=tuple(_first_layer.without_first_ln1(expanded, a)),
            aliases={f"{a.unembed}.weight": (f"{a.embed}.weight",)} if a.tied else {},
            ignored=(
                r"\.inv_freq$",
                r"\.original_inv_freq$",
                *(rf"\.{n}\." for n in a.unused),
                *(rf"^{re.escape(n)}\." for n in a.uncalled),  # pieces for other inputs
                # Sinusoids a checkpoint saves, computed by our rotary (`_handed_rotary`).
                *((rf"(^|\.){re.escape(a.rotary_table)}\.weight$",) if a.rotary_table else ()),
                # A live model's second name of a tensor it ties (BERT's decoder bias).
                *(rf"^{re.escape(saved)}$" for _, saved in a.renames if hf_model is not None),
                *_prediction_layers(hf_config, a.layers, cfg.n_layers),
            ),
            label=f"{a.architecture} (by convention)",
            base_prefix=a.base,
        )

    def _position_rules(self, cfg: HookedTransformerConfig) -> list[Rule]:
        """The learned positions, from the row of position 0 on; fixed ones computed."""
        a = self.anatomy
        if a.positions is None:
            return []
        if a.positions_fixed is not None:
            return [_sinusoids.position_rule(a.positions_fixed, a.position_offset, cfg)]
        if a.position_offset not in (0, 2):
            raise ValueError(f"positions from row {a.position_offset} of their table: only "
                             "rows 0 and 2 (OPT's, BioGPT's) are read")  # fmt: skip
        pattern, name = "n_ctx d_embed -> n_ctx d_embed", f"{a.positions}.weight"
        # Token type 0, which every token gets, is a constant of the positions' rows.
        plus = f"{a.token_types}.weight" if a.token_types else None
        if a.position_offset == 0:
            return [Rule("pos_embed.W_pos", name, pattern, plus_first_row=plus)]
        split = ("pos_offset", "n_ctx")
        return [Rule("pos_embed.W_pos", name, pattern, split=split, part=1, plus_first_row=plus)]

    def _head_rules(self) -> list[Rule]:
        """BERT's head transform before the decoder: a dense map (to the width the decoder
        reads: ELECTRA's, RemBERT's narrower) and a norm."""
        a, ours = self.anatomy, "unembed_transform"
        if a.head_dense is None:
            return []
        dense = "d_unembed d_model -> d_model d_unembed"
        return [
            Rule(f"{ours}.W_dense", f"{a.head_dense}.weight", dense),
            Rule(f"{ours}.b_dense", f"{a.head_dense}.bias", "d_unembed -> d_unembed")
            if a.head_dense_bias else zeros(f"{ours}.b_dense", "d_unembed"),
            *_norm(a, f"{ours}.ln_unembed", a.head_norm, 1.0, "d_unembed"),
        ]  # fmt: skip

    def _norm_rules(self, hf_config: Any, cfg: HookedTransformerConfig) -> list[Rule]:
        """Each block norm; a write scale multiplies a post-norm's gain and bias."""
        a = self.anatomy
        writes = {"ln1_post": a.attn_write, "ln2_post": a.mlp_write}

        def rules(ours: str, hf: str) -> list[Rule]:
            return _norm(a, f"blocks.{{layer}}.{ours}", f"{a.layers}.{{layer}}.{hf}",
                         writes.get(ours, Scale()).of(hf_config, cfg.d_head))  # fmt: skip

        if a.mixer_norms is None:
            return [rule for ours, hf in a.norms for rule in rules(ours, hf)]
        # OLMo Hybrid's: the attention layers' norms and the mixer layers' apart.
        kinds = tuple(cfg.layer_mixer(i) for i in range(cfg.n_layers))
        return [rule for blocks, norms in _mixer_norms.norms_by_layer(a, kinds)
                for ours, hf in norms for rule in _in_layers(rules(ours, hf), blocks)]  # fmt: skip

    def _sublayer_rules(
        self, cfg: HookedTransformerConfig, write: float, hf_config: Any
    ) -> list[Rule]:
        """The attention's rules; in a hybrid, in the layers that attend, and the mixers'
        (`_mixers`) in the others."""
        a = self.anatomy
        if a.attn == "":  # attention-free: mixers only
            return a.mixers.rules(a.layers, cfg, write)
        attention = self._attention_rules(cfg, write, hf_config)
        if a.mixers is None:
            return attention
        attending = [i for i in range(cfg.n_layers) if cfg.layer_mixer(i) == "attention"]
        o_scale = 1.0 if "ln1_post" in dict(a.mixer_norms or a.norms) else write
        return [*_in_layers(attention, attending), *a.mixers.rules(a.layers, cfg, o_scale)]

    def _attention_rules(
        self, cfg: HookedTransformerConfig, write: float, hf_config: Any
    ) -> list[Rule]:
        """The q/k/v projections (`_projection_rules`), the output projection (carrying
        the write scale unless a post-norm does), the sinks and the q/k norm gains; a
        latent attention's as `_deepseek` reads them."""
        a, b = self.anatomy, "blocks.{layer}.attn"
        at = f"{a.layers}.{{layer}}.{a.attn}"
        if a.latent:
            o_scale = 1.0 if "ln1_post" in dict(a.norms) else write
            interleaved = a.rotary_layout == "pairs"
            bias = bool(getattr(hf_config, "attention_bias", False))
            latent = _deepseek.latent_attention_rules(cfg, at, interleaved, bias, times(o_scale))
            return latent + self._gate_rules(at)  # Bailing Hybrid's gate per head
        kv = "kv_head" if cfg.n_kv_heads != cfg.n_heads else "head"
        order = self._order(cfg)
        o_scale = 1.0 if "ln1_post" in dict(a.norms) else write
        o, o_bias = a.role(a.attn_maps, "o") or (None, False)
        if o is None:
            raise ValueError("no output projection recognised")
        rules = [
            *self._projection_rules(at, kv, order),
            Rule(f"{b}.W_O", f"{at}.{o}.weight", "d_model (head d_head) -> head d_head d_model",
                 adjust=times(o_scale)),
            Rule(f"{b}.b_O", f"{at}.{o}.bias", "d_model -> d_model", adjust=times(o_scale))
            if o_bias else zeros(f"{b}.b_O", "d_model"),
        ]  # fmt: skip
        if a.last_layer_o_bias:
            rules = self._last_layer_bias(rules, cfg, at, o_scale, o_bias)
        if a.sinks:
            rules.append(Rule(f"{b}.sinks", f"{at}.sinks", "head -> head"))
        rules += self._gate_rules(at)
        qk = self._qk_norm_rules(at, kv, order)
        if cfg.qk_norm_layers is not None:  # Llama 4's: in the layers that hold them only
            qk = _in_layers(qk, [i for i in range(cfg.n_layers) if cfg.layer_norms_qk(i)])
        return rules + qk

    def _qk_norm_rules(
        self, at: str, kv: str, order: Callable[[Tensor], Tensor] | None
    ) -> list[Rule]:
        """The q/k norms' gains (ones where they keep none) and biases."""
        a, b, rules = self.anatomy, "blocks.{layer}.attn", []
        for ours, hf, heads in zip(("q_norm", "k_norm"), a.qk_norm_names or (), ("head", kv),
                                   strict=False):  # fmt: skip
            axes = "d_head" if a.qk_norm == "per_head" else f"{heads} d_head"
            if a.norm_kind in ("rms_bare", "layer_bare") or a.qk_norm_bare:
                rules.append(ones(f"{b}.{ours}.w", axes))
                continue
            pattern = "d_head -> d_head" if a.qk_norm == "per_head" else f"({axes}) -> {axes}"
            rules.append(Rule(f"{b}.{ours}.w", f"{at}.{hf}.weight", pattern,
                              adjust=_chain(_gain(a), order)))  # fmt: skip
            if NORM_TYPES[a.norm_kind] == "LN":  # Persimmon's LayerNorms: a bias too
                rules.append(Rule(f"{b}.{ours}.b", f"{at}.{hf}.bias", pattern, adjust=order)
                             if a.norm_bias else zeros(f"{b}.{ours}.b", axes))  # fmt: skip
        return rules

    def _last_layer_bias(
        self,
        rules: list[Rule],
        cfg: HookedTransformerConfig,
        at: str,
        o_scale: float,
        o_bias: bool,
    ) -> list[Rule]:
        """`rules` with the last layer's `b_O` read from the bias its attention keeps
        (`Anatomy.last_layer_o_bias`); the others' as they were."""
        if o_bias:
            raise ValueError("an output map with a bias and a bias of the last layer's output")
        b_O = "blocks.{layer}.attn.b_O"
        last = cfg.n_layers - 1
        bias = Rule(b_O.replace("{layer}", str(last)),
                    f"{at}.{self.anatomy.last_layer_o_bias}".replace("{layer}", str(last)),
                    "d_model -> d_model", adjust=times(o_scale))  # fmt: skip
        others = [r for r in rules if r.ours == b_O]
        return [*(r for r in rules if r.ours != b_O), *_in_layers(others, range(last)), bias]

    def _gate_rules(self, at: str) -> list[Rule]:
        """An output gate's `W_G`, `b_G`: its own map (one factor per head or per
        dimension), or the second half of each head's rows of a `[q_h; gate_h]` map."""
        a, b = self.anatomy, "blocks.{layer}.attn"
        if a.attn_gate is None:
            return []
        own, fused = a.role(a.attn_maps, "gate"), a.role(a.attn_maps, "q_gate")
        hf, has_bias = own or fused or (None, False)
        width = "one" if a.attn_gate_per_head else "d_head"
        if own:
            pattern = f"(head {width}) d_model -> head d_model {width}"
            weight = Rule(f"{b}.W_G", f"{at}.{hf}.weight", pattern)
            bias = Rule(f"{b}.b_G", f"{at}.{hf}.bias", f"(head {width}) -> head {width}")
        else:
            pattern = "(head gate_up d_head) d_model -> gate_up head d_model d_head"
            weight = Rule(f"{b}.W_G", f"{at}.{hf}.weight", pattern, pick=1)
            bias = Rule(f"{b}.b_G", f"{at}.{hf}.bias",
                        "(head gate_up d_head) -> gate_up head d_head", pick=1)  # fmt: skip
        return [weight, bias if has_bias else zeros(f"{b}.b_G", f"head {width}")]

    def _projection_rules(
        self, at: str, kv: str, order: Callable[[Tensor], Tensor] | None
    ) -> list[Rule]:
        """W_Q, W_K, W_V and their biases, from separate maps or one fused `[q; k; v]`
        (queries and keys permuted for rotated pairs)."""
        a, b = self.anatomy, "blocks.{layer}.attn"
        k_name, v_name = ("_W_K", "_W_V") if kv == "kv_head" else ("W_K", "W_V")
        pieces = (("q", "W_Q", "head", order), ("k", k_name, kv, order), ("v", v_name, kv, None))
        fused = a.role(a.attn_maps, "qkv")
        split = ("head d_head", f"{kv} d_head", f"{kv} d_head") if fused else None
        rules = []
        for part, (role, name, heads, permute) in enumerate(pieces):
            gated = role == "q" and a.role(a.attn_maps, "q_gate")  # [q_h; gate_h] per head
            hf, has_bias = fused or gated or a.role(a.attn_maps, role) or (None, False)
            if hf is None:
                raise ValueError(f"no {role} projection recognised")
            where = dict(split=split, part=part if fused else 0, adjust=permute)
            rows = f"({heads} d_head)"
            heads_out = heads
            if fused and a.qkv_layout == "per_head":  # [q_h; k_h; v_h] head by head
                where = dict(pick=part, adjust=permute)
                rows = "(head qkv d_head)"
            if fused and a.qkv_layout == "sharded":  # CodeGen's shards of [q; v; k]
                where = dict(pick=(0, 2, 1)[part], adjust=permute)
                rows, heads_out = "(mp_shard qkv shard_head d_head)", "(mp_shard shard_head)"
            if gated:
                where["pick"], rows = 0, f"({heads} gate_up d_head)"
            bias_name = name.replace("W", "b")
            after = "gate_up " if gated else "qkv " if "pick" in where and fused else ""
            rules.append(
                Rule(
                    f"{b}.{name}",
                    f"{at}.{hf}.weight",
                    f"{rows} d_model -> {after}{heads_out} d_model d_head",
                    **where,
                )
            )
            rules.append(Rule(f"{b}.{bias_name}", f"{at}.{hf}.bias",
                              f"{rows} -> {after}{heads_out} d_head", **where)
                         if has_bias else zeros(f"{b}.{bias_name}", f"{heads} d_head"))  # fmt: skip
        return rules

    def _mlp_rules(
        self, cfg: HookedTransformerConfig, write: float, live: bool = False
    ) -> list[Rule]:
        a = self.anatomy
        if cfg.attn_only:  # an attention-free model's layers hold no MLP either
            return []
        at = f"{a.layers}.{{layer}}" + (f".{a.mlp}" if a.mlp else "")
        out_scale = 1.0 if "ln2_post" in dict(a.norms) else write
        if a.experts is not None:
            # A norm of the mixture's output carries the write's scale, not the experts.
            e, expert_scale = a.experts, 1.0 if a.experts.out_norm else out_scale
            experts = _expert_table.expert_rules(
                e, f"{a.layers}.{{layer}}", cfg, expert_scale, live
            )
            if e.out_norm:
                experts += _norm(a, "blocks.{layer}.ln2_post",
                                 f"{a.layers}.{{layer}}.{e.out_norm}", out_scale)  # fmt: skip
            moe = [i for i in range(cfg.n_layers) if cfg.layer_is_moe(i)]
            if len(moe) == cfg.n_layers:
                return experts
            dense = [_widened(rule, "d_mlp_dense") for rule in self._dense_rules(at, out_scale)]
            kept = [i for i in range(cfg.n_layers) if i not in moe]
            return [*_in_layers(dense, kept), *_in_layers(experts, moe)]
        return self._dense_rules(at, out_scale)

    def _dense_rules(self, at: str, out_scale: float) -> list[Rule]:
        """A dense MLP's rules: gated or plain, fused or not."""
        a, b = self.anatomy, "blocks.{layer}.mlp"
        rules = []
        fused = a.role(a.mlp_maps, "gate_up")
        if fused:
            if fused[1]:
                raise ValueError("a fused gate/up projection with a bias: the gate has none here")
            halves = ("d_mlp", "d_mlp")
            rules += [Rule(f"{b}.W_gate", f"{at}.{fused[0]}.weight", MLP_IN, split=halves),
                      Rule(f"{b}.W_in", f"{at}.{fused[0]}.weight", MLP_IN, split=halves, part=1),
                      zeros(f"{b}.b_in", "d_mlp")]  # fmt: skip
        else:
            up, up_bias = a.role(a.mlp_maps, "up") or (None, False)
            if up is None:
                raise ValueError("no MLP input projection recognised")
            gate = a.role(a.mlp_maps, "gate")
            if gate:
                rules.append(Rule(f"{b}.W_gate", f"{at}.{gate[0]}.weight", MLP_IN))
                if gate[1] and a.experts is not None:
                    raise ValueError("a dense gate projection with a bias beside experts: the "
                                     "gate has none there")  # fmt: skip
                if gate[1]:  # RecurrentGemma's (`mlp_gate_bias`)
                    rules.append(Rule(f"{b}.b_gate", f"{at}.{gate[0]}.bias", "d_mlp -> d_mlp"))
            rules.append(Rule(f"{b}.W_in", f"{at}.{up}.weight", MLP_IN))
            rules.append(Rule(f"{b}.b_in", f"{at}.{up}.bias", "d_mlp -> d_mlp")
                         if up_bias else zeros(f"{b}.b_in", "d_mlp"))  # fmt: skip
        if a.act_fn == "xielu":  # its learned scalars (`components.xielu`)
            rules += [Rule(f"{b}.act_fn.{n}", f"{at}.act_fn.{n}", pattern)
                      for n, pattern in XIELU_PATTERNS.items()]  # fmt: skip
        down, down_bias = a.role(a.mlp_maps, "down") or (None, False)
        if down is None:
            raise ValueError("no MLP output projection recognised")
        rules.append(Rule(f"{b}.W_out", f"{at}.{down}.weight", MLP_OUT, adjust=times(out_scale)))
        rules.append(
            Rule(f"{b}.b_out", f"{at}.{down}.bias", "d_model -> d_model", adjust=times(out_scale))
            if down_bias
            else zeros(f"{b}.b_out", "d_model")
        )
        return rules  # fmt: skip

    def _order(self, cfg: HookedTransformerConfig) -> Callable[[Tensor], Tensor] | None:
        """The permutation of each head's query and key dimensions for rotated pairs, or
        the sign flip of their second rotated half for halves turned the other way."""
        rotated = cfg.rotary_dim or cfg.d_head
        if self.anatomy.rotary_layout == "halves_reversed":
            sign = torch.ones(cfg.d_head, dtype=torch.float64)
            sign[rotated // 2 : rotated] = -1.0
            return lambda W: W * sign.to(W.device, W.dtype)
        if self.anatomy.rotary_layout != "pairs":
            return None
        # Pairs (2i, 2i + 1) turned into ours, (i, i + rotated / 2): a query-key product
        # is unchanged when both take the same order.
        pairs = torch.arange(rotated)
        order = torch.cat([pairs[0::2], pairs[1::2], torch.arange(rotated, cfg.d_head)])
        return lambda W: W[..., order.to(W.device)]


@functools.cache  # once per architecture and process
def _left_out(architecture: str, modules: tuple[str, ...]) -> None:
    _LOG.warning("%s: importing what a forward on tokens computes; %s (for other inputs) "
                 "left out", architecture, ", ".join(modules))  # fmt: skip


def _embed_factor(anatomy: Anatomy, from_config: float, hf_model: Any) -> float:
    """What the embedding multiplies by: the constant a live model's embedding holds where
    it holds one (Gemma's `embed_scale`, built in float32 and then cast with the model, so
    a float64 model's is float32's rounding), else the config's value."""
    if hf_model is None or from_config == 1.0:
        return from_config
    held = getattr(hf_model.get_submodule(anatomy.embed), "embed_scale", None)
    return float(held) if isinstance(held, Tensor) and held.numel() == 1 else from_config


def _mixed_layer_types(anatomy: Anatomy) -> frozenset[str]:
    """The `layer_types` values that stand for a hybrid's mixers, not attention."""
    m = anatomy.mixers
    if m is None or m.pattern_field != "layer_types":
        return frozenset()
    return frozenset(value for value, kind in m.pattern if kind != "attention")


def _widened(rule: Rule, width: str) -> Rule:
    """`rule` with the MLP's width axis named `width` (a dense layer's in a mixture)."""

    def renamed(text: str) -> str:
        return re.sub(r"\bd_mlp\b", width, text)

    split = None if rule.split is None else tuple(renamed(piece) for piece in rule.split)
    return dataclasses.replace(rule, pattern=renamed(rule.pattern), split=split)


def _in_layers(rules: list[Rule], layers: range | list[int]) -> list[Rule]:
    """`rules` expanded for `layers` only."""
    return [
        dataclasses.replace(
            rule,
            ours=rule.ours.replace("{layer}", str(i)),
            hf=None if rule.hf is None else rule.hf.replace("{layer}", str(i)),
        )
        for rule in rules
        for i in layers
    ]


def _norm(anatomy: Anatomy, ours: str, hf: str, write: float, width: str = "d_model") -> list[Rule]:
    """The gain (and bias) of one norm over `width`, multiplied by `write`."""
    kind, axes = anatomy.norm_kind, f"{width} -> {width}"
    if kind in ("layer_bare", "rms_bare"):
        gain = ones(f"{ours}.w", width, times=write)
    else:
        gain = Rule(f"{ours}.w", f"{hf}.weight", axes, adjust=_chain(_gain(anatomy), times(write)))
    if NORM_TYPES[kind] == "RMS":
        return [gain]
    bias = (Rule(f"{ours}.b", f"{hf}.bias", axes, adjust=times(write))
            if anatomy.norm_bias else zeros(f"{ours}.b", width))  # fmt: skip
    return [gain, bias]


def _gain(anatomy: Anatomy) -> Callable[[Tensor], Tensor] | None:
    return one_plus if anatomy.norm_kind in ("rms_one_plus", "layer_one_plus") else None


def _chain(*adjusts: Callable[[Tensor], Tensor] | None) -> Callable[[Tensor], Tensor] | None:
    steps = [f for f in adjusts if f is not None]
    if not steps:
        return None

    def chained(t: Tensor) -> Tensor:
        for step in steps:
            t = step(t)
        return t

    return chained


def _gate_bias(a: Any) -> bool:
    """Whether the dense MLP's own gate projection has a bias (`mlp_gate_bias`)."""
    return any(role == "gate" and bias for role, _, bias in a.mlp_maps)


def _prediction_layers(hf_config: Any, layers: str, n_layers: int) -> tuple[str, ...]:
    """The layers a checkpoint keeps past the decoder's for multi-token prediction
    (`num_mtp_layers`, `num_nextn_predict_layers`: Bailing Hybrid's), which the causal
    model never runs (`transformers` does not load them either): not read."""
    fields = ("num_mtp_layers", "num_nextn_predict_layers")
    if not any(getattr(hf_config, field, None) for field in fields):
        return ()
    own = "|".join(map(str, range(n_layers)))
    return (rf"^{re.escape(layers)}\.(?!({own})\.)\d+\.",)
