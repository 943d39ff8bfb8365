"""TransformerLens's `HookedTransformer`: ours, with TL's method names, arguments and defaults.

The subclass adds what TL code calls and the core spells differently or leaves out:
`run_with_cache` returns `hookedattn_tl.ActivationCache` (TL's analysis methods, bound to
this model); `from_pretrained` processes the weights by default (fold the norms, centre
the writing weights and the unembedding, fold the value biases), as TL does;
`set_use_attn_result` and its siblings rebuild the blocks from a changed config (ours is
frozen), sharing the same parameters, and `model.cfg.use_attn_result = True` calls it (the
model's config is its own, bound to it); `generate` samples by default, as TL does.
"""

import logging
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

import analysis
from hookedattn.core import _tokenization, processing
from hookedattn.core.config import ACT_FNS, DTYPES
from hookedattn.core.config import HookedTransformerConfig as _CoreConfig
from hookedattn.core.loss import lm_cross_entropy_loss
from hookedattn.core.model import HookedTransformer as _CoreModel
from hookedattn_tl import _pretrained, _streaming
from hookedattn_tl._errors import TLAssertionError
from hookedattn_tl._refactor import refactor_factored_attn_matrices as refactor_attention
from hookedattn_tl.ActivationCache import ActivationCache
from hookedattn_tl.components import _ungrouped
from hookedattn_tl.config import HookedTransformerConfig
from hookedattn_tl.FactoredMatrix import FactoredMatrix
from hookedattn_tl.HookedRootModule import HookedRootModule
from hookedattn_tl.past_key_value_caching import HookedTransformerKeyValueCache


class _CallableLabels(list):
    """`all_head_labels` is a property here and a method in TL: this list answers both."""

    def __call__(self) -> list[str]:
        return list(self)


class HookedTransformer(HookedRootModule, _CoreModel):
    """`hookedattn.HookedTransformer` with TransformerLens 3.x's surface on top.

    Built the same way (`HookedTransformer(cfg)`, `cfg` a config or a dict of its fields);
    every core method still works, and the hook API is TL's (`hookedattn_tl.HookedRootModule`:
    hook levels, `reset_hooks(clear_contexts, ...)` in TL's argument order).
    """

    def __init__(self, cfg: Any, tokenizer: Any = None, move_to_device: bool = True) -> None:
        if isinstance(cfg, dict):
            cfg = HookedTransformerConfig.from_dict(cfg)
        elif isinstance(cfg, str):
            raise ValueError(
                f"HookedTransformer({cfg!r}): a model name goes to "
                f"HookedTransformer.from_pretrained; the constructor takes a config"
            )
        if not getattr(cfg, "d_vocab_known", True):
            raise ValueError(
                "this config has no d_vocab (TL's -1: from the tokenizer); give d_vocab, "
                "e.g. len(tokenizer)"
            )
        if cfg.has_mlp and cfg.act_fn not in ACT_FNS:
            raise ValueError(
                f"act_fn={cfg.act_fn!r}: hookedattn's models build MLPs with one of "
                f"{ACT_FNS}; TL's other activations exist only as standalone components "
                f"(hookedattn_tl.components.MLP)"
            )
        _CoreModel.__init__(self, cfg, tokenizer)
        self.context_level = 0
        self.is_caching = False
        if getattr(cfg, "ungroup_grouped_query_attention", False):
            self._ungroup_blocks(True)

    @property
    def cfg(self) -> HookedTransformerConfig:
        """This model's own config (a facade config bound to it): TL's run-time flag
        assignments on it, `model.cfg.use_attn_result = True`, call `set_use_attn_result`
        (`hookedattn_tl.config.hooked_transformer_config` says why)."""
        cfg = self.__dict__["_cfg"]
        if cfg.bound_model is not self:  # a copy's, or one taken over from another model
            cfg = self.__dict__["_cfg"] = cfg.bound_to(self)
        return cfg

    @cfg.setter
    def cfg(self, cfg: _CoreConfig) -> None:
        """Take `cfg` (a core config becomes the facade's) as this model's own, bound copy."""
        self.__dict__["_cfg"] = HookedTransformerConfig.unwrap(cfg).bound_to(self)

    # TL keeps these two in its (mutable) config; ours is frozen, so they live here, set
    # by from_pretrained or by assignment.
    default_padding_side: str = "right"
    default_prepend_bos: bool | None = None

    # ------------------------------------------------------------------ running
    def forward(
        self,
        input: Any,
        return_type: str | None = "logits",
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        start_at_layer: int | None = None,
        tokens: Tensor | None = None,
        shortformer_pos_embed: Tensor | None = None,
        attention_mask: Tensor | None = None,
        stop_at_layer: int | None = None,
        past_kv_cache: Any = None,
        **kwargs: Any,
    ) -> Any:
        """The core forward, with TL's argument order and text options.

        `shortformer_pos_embed` (a shortformer model's, `[batch pos d_model]`, with
        `start_at_layer` only, as in TL) replaces the positional embedding every layer's
        queries and keys read; without it the model computes that embedding from the
        positions, also with `start_at_layer` (where TL would add none).
        """
        if past_kv_cache is not None:
            self._check_cache_grouping()
        if shortformer_pos_embed is not None:
            if start_at_layer is None:
                raise ValueError(
                    "shortformer_pos_embed is used with start_at_layer only (TL ignores it "
                    "otherwise): from tokens or text the model computes the positional "
                    "embedding itself"
                )
            options = {"prepend_bos": prepend_bos, "padding_side": padding_side}
            return self._with_shortformer_pos_embed(
                shortformer_pos_embed, input, return_type, loss_per_token=loss_per_token,
                start_at_layer=start_at_layer, tokens=tokens, attention_mask=attention_mask,
                stop_at_layer=stop_at_layer, past_kv_cache=past_kv_cache, **options, **kwargs,
            )  # fmt: skip
        custom_text = prepend_bos is not None or padding_side is not None
        custom_text = custom_text or self.default_padding_side != "right"
        if start_at_layer is None and _tokenization.is_text(input) and custom_text:
            text = self.tokenize(input, self._prepend_bos(prepend_bos), self._side(padding_side))
            input = text.tokens
            attention_mask = text.attention_mask if attention_mask is None else attention_mask
        return super().forward(
            input,
            return_type,
            loss_per_token=loss_per_token,
            start_at_layer=self._from_end(start_at_layer),
            stop_at_layer=self._from_end(stop_at_layer),
            tokens=tokens,
            attention_mask=attention_mask,
            past_kv_cache=past_kv_cache,
            **kwargs,
        )

    def _with_shortformer_pos_embed(self, pos_embed: Tensor, *args: Any, **kwargs: Any) -> Any:
        """The forward with `hook_pos_embed`'s value replaced by `pos_embed` (what TL's
        `shortformer_pos_embed` argument is), for a shortformer model only."""
        if self.cfg.positional_embedding_type != "shortformer":
            raise ValueError(
                f"shortformer_pos_embed is for a model with positional_embedding_type="
                f"'shortformer'; this one has {self.cfg.positional_embedding_type!r}"
            )
        with self.hooks([("hook_pos_embed", lambda _, hook: pos_embed)]):
            return self.forward(*args, **kwargs)

    def _from_end(self, layer: int | None) -> int | None:
        # TL slices the blocks with start_at_layer / stop_at_layer, so negatives count
        # from the end (-1 is the last block); the core refuses them, to be explicit.
        is_negative = isinstance(layer, int) and not isinstance(layer, bool) and layer < 0
        return layer + self.cfg.n_layers if is_negative else layer

    def run_with_cache(
        self,
        *model_args: Any,
        return_cache_object: bool = True,
        remove_batch_dim: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """`(output, cache)`: a TL `ActivationCache` bound to this model (or, with
        `return_cache_object=False`, a plain dict of tensors)."""
        out, core = _CoreModel.run_with_cache(
            self, *model_args, remove_batch_dim=remove_batch_dim, **kwargs
        )
        if not return_cache_object:
            return out, dict(core)
        tokens = self._input_tokens(model_args, kwargs)
        return out, ActivationCache(dict(core), self, not remove_batch_dim, tokens=tokens)

    def _input_tokens(self, model_args: tuple, kwargs: dict) -> Tensor | None:
        """The token ids a forward read, when its input was tokens or text."""
        if kwargs.get("start_at_layer") is not None or not model_args:
            return kwargs.get("tokens")
        first = model_args[0]
        if _tokenization.is_text(first):
            return self.to_tokens(first, kwargs.get("prepend_bos"), kwargs.get("padding_side"))
        if isinstance(first, Tensor) and not first.dtype.is_floating_point:
            return first if first.ndim == 2 else first[None]
        return None

    def input_to_embed(
        self,
        input: Any,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        attention_mask: Tensor | None = None,
        past_kv_cache: Any = None,
    ) -> tuple[Float[Tensor, "batch pos d_model"], Int[Tensor, "batch pos"], Tensor | None, Any]:
        """`(residual, tokens, shortformer_pos_embed, attention_mask)` before block 0.

        The residual is the embedding (plus positions) that block 0 reads; the hook points
        on the way (`hook_embed`, `hook_pos_embed`) run. `shortformer_pos_embed` is a
        shortformer model's positional embedding (which every layer's queries and keys
        read), None for the others.
        """
        if _tokenization.is_text(input):
            text = self.tokenize(input, self._prepend_bos(prepend_bos), self._side(padding_side))
            tokens = text.tokens
            if attention_mask is None and not bool(text.attention_mask.all()):
                attention_mask = text.attention_mask
        else:
            tokens = self._as_tokens(input)
        if self.cfg.positional_embedding_type != "shortformer":
            resid = super().forward(
                tokens, stop_at_layer=0, attention_mask=attention_mask, past_kv_cache=past_kv_cache
            )
            return resid, tokens, None, attention_mask
        resid, cache = _CoreModel.run_with_cache(
            self,
            tokens,
            names_filter="hook_pos_embed",
            stop_at_layer=0,
            attention_mask=attention_mask,
            past_kv_cache=past_kv_cache,
        )
        return resid, tokens, cache["hook_pos_embed"], attention_mask

    def loss_fn(
        self,
        logits: Float[Tensor, "batch pos d_vocab_out"],
        tokens: Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        per_token: bool = False,
    ) -> Tensor:
        """Next-token cross-entropy (`utils.lm_cross_entropy_loss`)."""
        return lm_cross_entropy_loss(logits, tokens.to(logits.device), attention_mask, per_token)

    # ------------------------------------------------------------------ text
    def to_tokens(
        self,
        input: Any,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> Int[Tensor, "batch pos"]:
        """Token ids `[batch pos]`; padding on `default_padding_side` unless told."""
        tokens = super().to_tokens(input, self._prepend_bos(prepend_bos), self._side(padding_side))
        return tokens[:, : self.cfg.n_ctx] if truncate else tokens

    def to_str_tokens(
        self, input: Any, prepend_bos: bool | None = None, padding_side: str | None = None
    ) -> list:
        """Each token as a string (TL's signature; `padding_side` changes nothing here)."""
        return super().to_str_tokens(input, self._prepend_bos(prepend_bos))

    def to_string(self, tokens: Any) -> str | list[str]:
        """The text of token ids: `[pos]` or a list of ints (a string), `[batch pos]` (one
        per row), and, as in TL, one id (an int or a 0-d tensor)."""
        if (isinstance(tokens, Tensor) and tokens.ndim == 0) or isinstance(tokens, int):
            tokens = torch.as_tensor(tokens).reshape(1)
        return super().to_string(tokens)

    # Loosely annotated, so that a wrong type gets our message rather than a type-check's.
    def to_single_str_token(self, int_token: object) -> str:
        """The string of one token id."""
        if not isinstance(int_token, int) or isinstance(int_token, bool):
            raise TypeError(f"to_single_str_token takes an int token id, got {int_token!r}")
        (token,) = self.to_str_tokens(torch.tensor([int_token]))
        return token

    def _prepend_bos(self, prepend_bos: bool | None) -> bool | None:
        return self.default_prepend_bos if prepend_bos is None else prepend_bos

    def _side(self, padding_side: str | None) -> str:
        return self.default_padding_side if padding_side is None else padding_side

    def generate(
        self,
        input: Any = "",
        max_new_tokens: int = 10,
        stop_at_eos: bool = True,
        eos_token_id: int | None = None,
        do_sample: bool = True,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float = 1.0,
        freq_penalty: float = 0.0,
        use_past_kv_cache: bool = True,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        return_type: str | None = "input",
        verbose: bool = True,
        **kwargs: Any,
    ) -> Any:
        """TL's `generate`: samples by default; `freq_penalty` (with sampling, as in TL)
        subtracts, after the temperature, `freq_penalty` times the number of times each
        token already occurs in its row. Other keywords of the core's `generate` pass
        through.

        `verbose` (TL's progress bar) is accepted and ignored. Without a tokenizer, text
        input and `stop_at_eos` without `eos_token_id` raise `TLAssertionError` (a
        `ValueError` that TL code catches as the `AssertionError` TL raises).
        """
        if use_past_kv_cache:
            self._check_cache_grouping()
        if self.tokenizer is None:
            if _tokenization.is_text(input):
                raise TLAssertionError(
                    "generate() got text, but this model has no tokenizer: pass token ids"
                )
            if stop_at_eos and eos_token_id is None:
                raise TLAssertionError(
                    "generate(stop_at_eos=True) needs eos_token_id= when the model has no "
                    "tokenizer (or pass stop_at_eos=False)"
                )
        return super().generate(
            input,
            max_new_tokens,
            stop_at_eos=stop_at_eos,
            eos_token_id=eos_token_id,
            do_sample=do_sample,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            freq_penalty=freq_penalty if do_sample else 0.0,  # TL's greedy path ignores it
            use_past_kv_cache=use_past_kv_cache,
            prepend_bos=self._prepend_bos(prepend_bos),
            return_type=return_type or "input",
            **kwargs,
        )

    # TL's streaming generation, with its signature (hookedattn_tl/_streaming.py).
    generate_stream = _streaming.generate_stream

    # ------------------------------------------------------------------ weights
    @property
    def QK(self) -> FactoredMatrix:
        """Every head's `W_Q @ W_K.T`, `[layer head d_model d_model]`, as TL's FactoredMatrix."""
        core = super().QK
        return FactoredMatrix(core.A, core.B)

    @property
    def OV(self) -> FactoredMatrix:
        """Every head's `W_V @ W_O`, `[layer head d_model d_model]`, as TL's FactoredMatrix."""
        core = super().OV
        return FactoredMatrix(core.A, core.B)

    @property
    def n_params_total(self) -> int:
        """Every parameter's element count, embeddings, biases and norm gains included."""
        return sum(p.numel() for p in self.parameters())

    @property
    def all_head_labels(self) -> list[str]:
        """`"L{layer}H{head}"` for every head; also callable, as TL's method."""
        return _CallableLabels(super().all_head_labels)

    def tokens_to_residual_directions(self, tokens: Any) -> Float[Tensor, "*tokens d_model"]:
        """Unembedding directions; a one-element tensor gives `[d_model]`, as in TL."""
        if isinstance(tokens, Tensor) and tokens.numel() == 1:
            tokens = int(tokens.item())
        return super().tokens_to_residual_directions(tokens)

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
    ) -> Float[Tensor, " d_model"]:
        """The sum of `b_O` (and `b_out`) of the blocks before `layer` (and block `layer`'s
        `b_O` with `mlp_input`): the bias part of the stream entering there. A hybrid's
        mixer adds none (its biases are inside its write), nor does a block without an MLP."""
        total = torch.zeros(self.cfg.d_model, dtype=self.cfg.dtype, device=self.cfg.device)
        for index, block in enumerate(self.blocks[:layer]):
            total = total + self._attention_bias(index)
            if include_mlp_biases and self.cfg.layer_has_mlp(index):
                total = total + block.mlp.b_out
        if mlp_input:
            if layer >= self.cfg.n_layers:
                raise ValueError(f"mlp_input needs a block: layer must be < {self.cfg.n_layers}")
            total = total + self._attention_bias(layer)
        return total

    def _attention_bias(self, layer: int) -> Float[Tensor, " d_model"] | float:
        """Block `layer`'s `b_O`, or 0 where a mixer holds attention's place."""
        return self.blocks[layer].attn.b_O if self.cfg.layer_mixer(layer) == "attention" else 0.0

    def all_composition_scores(self, mode: str) -> Float[Tensor, "layer head layer head"]:
        """Q-, K- or V-composition of every head with every later head (zero elsewhere),
        as TL's: `analysis.composition_scores(model, mode).scores`, in the weights' dtype."""
        scores = analysis.composition_scores(self, mode, n_samples=2).scores
        return scores.to(self.cfg.dtype)

    # ------------------------------------------------------------------ config toggles
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Add (or remove) the per-head `hook_result`."""
        self._rebuild_blocks(use_attn_result=use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Add (or remove) the per-head `hook_q_input`, `hook_k_input`, `hook_v_input`."""
        self._rebuild_blocks(use_split_qkv_input=use_split_qkv_input)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Add (or remove) `hook_mlp_in`."""
        self._rebuild_blocks(use_hook_mlp_in=use_hook_mlp_in)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Add (or remove) the per-head `hook_attn_in`."""
        self._rebuild_blocks(use_attn_in=use_attn_in)

    def set_ungroup_grouped_query_attention(self, ungroup_grouped_query_attention: bool) -> None:
        """Keys and values per query head: `hook_k`, `hook_v` (and `hook_k_input`,
        `hook_v_input`) widened to `n_heads` (`hookedattn_tl.components._ungrouped`); the
        output is unchanged. Stored only, on a model without grouped-query attention."""
        value = ungroup_grouped_query_attention
        if not isinstance(value, bool):
            raise TypeError(f"ungroup_grouped_query_attention must be a bool, got {value!r}")
        self._ungroup_blocks(value)
        self.cfg.set_in_place(ungroup_grouped_query_attention=value)

    def _ungroup_blocks(self, ungrouped: bool) -> None:
        if self.cfg.n_key_value_heads is None:
            return  # no grouped key/value heads: nothing to widen
        for block in self.blocks:
            _ungrouped.set_ungrouped(block.attn, self.cfg, ungrouped)
            block.attn_inputs.n_kv_heads = self.cfg.n_heads if ungrouped else self.cfg.n_kv_heads

    def _check_cache_grouping(self) -> None:
        if self.cfg.ungroup_grouped_query_attention and self.cfg.n_key_value_heads is not None:
            raise ValueError(
                "ungroup_grouped_query_attention=True: keys and values are per query head, "
                f"{self.cfg.n_heads} of them, but a key/value cache holds the "
                f"{self.cfg.n_key_value_heads} key/value heads (TL's fails the same way); "
                "pass use_past_kv_cache=False, or set the flag back to False first"
            )

    def _rebuild_blocks(self, **changes: bool) -> None:
        """Rebuild the blocks from `cfg.replace(**changes)`, sharing every parameter.

        The config is frozen and the blocks choose their hook points when they are built,
        so a toggle builds new blocks; they hold the same `Parameter` objects (an
        optimiser or a tied reference still sees them), and the hooks attached to a hook
        point that still exists are attached again to its new self. The model's own config
        is then changed in place, so every reference to `model.cfg` reads the new flags.
        """
        cfg = self.cfg.replace(**changes)
        if cfg == self.cfg:
            return
        with torch.random.fork_rng(devices=[]):  # building draws weights; keep the RNG
            new_blocks = type(self)(cfg).blocks
        old_params = dict(self.blocks.named_parameters())
        for name, _ in list(new_blocks.named_parameters()):
            module_path, leaf = name.rsplit(".", 1)
            setattr(new_blocks.get_submodule(module_path), leaf, old_params.pop(name))
        assert not old_params, f"parameters not carried over: {sorted(old_params)}"
        old_points = {name: p for name, p in self.hook_dict.items() if name.startswith("blocks.")}
        new_blocks.train(self.training)
        self.blocks = new_blocks
        self.cfg.set_in_place(**changes)
        self.setup()
        for name, point in old_points.items():
            for handle in (*point.fwd_hooks, *point.bwd_hooks):
                if name not in self.hook_dict:
                    logging.warning("hook at %s dropped: %s no longer exists", name, name)
                    continue
                self.hook_dict[name].add_hook(handle.fn, handle.dir, handle.is_permanent)

    def process_weights_(
        self,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool = True,
    ) -> "HookedTransformer":
        """TL's in-place processing: fold the norms, centre the writing weights and the
        unembedding, fold the value biases; returns this model, changed.

        Our processing (`hookedattn.core.processing.process_weights`) builds a new model;
        this one then takes its modules and config (its hooks are detached, as a rebuilt
        TL model's would be), so references to this model see the processed weights.
        """
        processed = _pretrained.written_out(
            processing.process_weights(
                self,
                fold_ln=fold_ln,
                center_writing_weights=center_writing_weights,
                center_unembed=center_unembed,
                fold_value_biases=fold_value_biases,
            )
        )
        defaults = (self.default_padding_side, self.default_prepend_bos)
        self.reset_hooks(including_permanent=True)
        self.__dict__.update(processed.__dict__)
        self.default_padding_side, self.default_prepend_bos = defaults
        self.setup()
        if refactor_factored_attn_matrices:
            refactor_attention(self)
        return self

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        checkpoint_index: int | None = None,
        checkpoint_value: int | None = None,
        hf_model: Any = None,
        device: str | None = None,
        n_devices: int = 1,
        tokenizer: Any = None,
        move_to_device: bool = True,
        fold_value_biases: bool = True,
        default_prepend_bos: bool | None = None,
        default_padding_side: str | None = None,
        dtype: torch.dtype | str = "float32",
        **from_pretrained_kwargs: Any,
    ) -> "HookedTransformer":
        """Load a model by name and process its weights for analysis, with TL's defaults.

        `model_name` is anything `hookedattn.HookedTransformer.from_pretrained` takes: one
        of TransformerLens's names (`"gpt2-small"`, `"pythia-70m"`, `"attn-only-2l"`), a
        hub repo id, a folder, or a shipped model; `revision`, `token`, `cache_dir` and
        `local_files_only` go to `huggingface_hub` (TL passes them on to transformers).
        Or pass `hf_model=` (a live `transformers` model). The weights are then processed
        (`hookedattn.core.processing.process_weights`) as asked: each step returns a new
        model, so nothing is changed in place.
        """
        hub_options = _pretrained.hub_options(from_pretrained_kwargs)
        _pretrained.refuse_unsupported(from_pretrained_kwargs)
        dtype = DTYPES[dtype] if isinstance(dtype, str) and dtype in DTYPES else dtype
        if hf_model is not None:
            model = cls.from_hf(hf_model, tokenizer=tokenizer, device=device)
        else:
            checkpoint = {"checkpoint_index": checkpoint_index,
                          "checkpoint_value": checkpoint_value}  # fmt: skip
            model = super().from_pretrained(
                model_name, tokenizer=tokenizer, dtype=dtype, device=device, **checkpoint,
                **hub_options,
            )  # fmt: skip
        if dtype != model.cfg.dtype:
            model = model.to(dtype)
        model = _pretrained.processed(
            model, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
            center_unembed=center_unembed, fold_value_biases=fold_value_biases,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
        )  # fmt: skip
        _pretrained.place(model, n_devices, device)
        if default_padding_side is not None:
            model.default_padding_side = default_padding_side
        model.default_prepend_bos = default_prepend_bos
        return model

    @classmethod
    def from_pretrained_no_processing(
        cls,
        model_name: str,
        fold_ln: bool = False,
        center_writing_weights: bool = False,
        center_unembed: bool = False,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool = False,
        dtype: torch.dtype | str = torch.float32,
        default_prepend_bos: bool | None = None,
        default_padding_side: str | None = None,
        **from_pretrained_kwargs: Any,
    ) -> "HookedTransformer":
        """`from_pretrained` with every processing step off."""
        return cls.from_pretrained(
            model_name,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
            fold_value_biases=fold_value_biases,
            dtype=dtype,
            default_prepend_bos=default_prepend_bos,
            default_padding_side=default_padding_side,
            **from_pretrained_kwargs,
        )


__all__ = ["HookedTransformer", "HookedTransformerKeyValueCache"]
