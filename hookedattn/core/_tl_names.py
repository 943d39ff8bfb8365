"""TransformerLens names the core API spells differently, and what to write instead.

Code ported from TransformerLens reaches for methods our core classes do not have (the
cache holds no model, so it has no `decompose_resid`; the config is frozen, so the model
has no `set_use_attn_result`). Those lookups fail with an `AttributeError` that says what
to write here, from the tables below, and points at `hookedattn_tl`, the package that
provides TransformerLens's surface itself. Names that are not TransformerLens's get the
ordinary message.
"""

_FACADE = (
    "or, to keep TransformerLens's code as it is, import from hookedattn_tl "
    "(`import hookedattn_tl as transformer_lens`)"
)

CACHE: dict[str, str] = {
    "decompose_resid": "analysis.decompose_resid(model, cache, layer) (a Decomposition: "
    ".components, .labels)",
    "accumulated_resid": "analysis.accumulated_resid(model, cache, layer, incl_mid=...); "
    "for the logit lens, analysis.logit_lens(model, cache)",
    "stack_head_results": "analysis.decompose_resid(model, cache, granularity='head'), or "
    "analysis.head_results(model, cache, layer) for one layer",
    "stack_neuron_results": "analysis.decompose_resid(model, cache, granularity='neuron')",
    "get_neuron_results": "analysis.decompose_resid(model, cache, granularity='neuron')",
    "get_full_resid_decomposition": "analysis.decompose_resid(model, cache, "
    "granularity='neuron') (heads, neurons, embeddings and each bias, labelled)",
    "apply_ln_to_stack": "analysis.apply_ln_to_stack(model, cache, decomposition) (it also "
    "applies the norm's gain and bias, so the parts sum to the norm's hook_out)",
    "logit_attrs": "analysis.direct_logit_attribution(model, cache, tokens)",
    "compute_head_results": "analysis.head_results(model, cache, layer), or build the model "
    "with use_attn_result=True",
    "stack_activation": "cache.stack(name) (and cache.stack('scale', 'ln1') for the norms)",
    "apply_slice_to_batch_dim": "ActivationCache({name: t[batch_slice] for name, t in "
    "cache.items()}, cache.n_layers)",
    "toggle_autodiff": "torch.set_grad_enabled(mode), or `with torch.inference_mode():`",
    "model": "nothing: the cache holds no model; pass it explicitly, analysis.f(model, cache)",
    "cache_dict": "dict(cache), or the cache itself (it is a read-only mapping)",
    "has_embed": "'hook_embed' in cache",
    "has_pos_embed": "'hook_pos_embed' in cache",
}

MODEL: dict[str, str] = {
    "from_pretrained_no_processing": "HookedTransformer.from_pretrained(name), which loads "
    "the weights unprocessed; hookedattn.process_weights(model) processes them",
    "set_use_attn_result": "HookedTransformer(model.cfg.replace(use_attn_result=True)) and "
    "load_state_dict(model.state_dict()) (the config is frozen)",
    "set_use_split_qkv_input": "HookedTransformer(model.cfg.replace(use_split_qkv_input=True)) "
    "and load_state_dict(model.state_dict()) (the config is frozen)",
    "set_use_hook_mlp_in": "HookedTransformer(model.cfg.replace(use_hook_mlp_in=True)) and "
    "load_state_dict(model.state_dict()) (the config is frozen)",
    "set_use_attn_in": "HookedTransformer(model.cfg.replace(use_attn_in=True)) and "
    "load_state_dict(model.state_dict()) (the config is frozen)",
    "input_to_embed": "model(tokens, stop_at_layer=0) (the stream entering block 0)",
    "loss_fn": "hookedattn.core.loss.lm_cross_entropy_loss(logits, tokens)",
    "to_single_str_token": "model.to_str_tokens(torch.tensor([token]))[0]",
    "n_params_total": "sum(p.numel() for p in model.parameters())",
    "accumulated_bias": "the bias components of analysis.decompose_resid(model, cache, "
    "granularity='head') (L0_attn_bias, ...)",
    "process_weights_": "model = hookedattn.process_weights(model) (a new model; nothing is "
    "changed in place)",
    "fold_layer_norm": "model = hookedattn.fold_layer_norm(model)",
    "center_writing_weights": "model = hookedattn.center_writing_weights(model)",
    "center_unembed": "model = hookedattn.center_unembed(model)",
    "fold_value_biases": "model = hookedattn.fold_value_biases(model)",
    "refactor_factored_attn_matrices": "model.QK and model.OV (FactoredMatrix circuits, the "
    "same however W_Q, W_K, W_V, W_O are split)",
    "all_composition_scores": "analysis.composition_scores(model)",
    "set_tokenizer": "model.tokenizer = hookedattn.HFTokenizer(tokenizer)",
    "list_hooks": "model.attached_hooks()",
    "load_and_process_state_dict": "model.load_state_dict(state_dict), then "
    "hookedattn.process_weights(model)",
}

TABLES: dict[str, dict[str, str]] = {"ActivationCache": CACHE, "HookedTransformer": MODEL}

# Keyword arguments of TransformerLens's methods that ours do not take.
KEYWORDS: dict[str, str] = {
    "return_cache_object": "run_with_cache always returns an ActivationCache (dict(cache) "
    "is a dict)",
    "prepend_bos": "tokenize first: model.to_tokens(text, prepend_bos=...)",
    "padding_side": "tokenize first: model.tokenize(text, padding_side=...), and pass its "
    "attention_mask",
    "shortformer_pos_embed": "nothing: there are no shortformer positional embeddings here",
    "freq_penalty": "nothing in the core generator; hookedattn_tl's generate has it",
    "verbose": "nothing: generate shows no progress bar",
    "fold_ln": "hookedattn.process_weights(model, fold_ln=...) after loading (from_pretrained "
    "loads the weights as saved)",
    "center_writing_weights": "hookedattn.process_weights(model, center_writing_weights=...)",
    "center_unembed": "hookedattn.process_weights(model, center_unembed=...)",
    "fold_value_biases": "hookedattn.process_weights(model, fold_value_biases=...)",
    "refactor_factored_attn_matrices": "model.QK and model.OV",
    "hf_model": "HookedTransformer.from_hf(hf_model)",
    "dtype": "model.to(dtype) after loading",
    "default_padding_side": "model.to_tokens(text, padding_side=...) at each call",
    "default_prepend_bos": "model.to_tokens(text, prepend_bos=...) at each call",
}


def unexpected_keywords(function: str, names: list[str]) -> str:
    """The `TypeError` message for keyword arguments `function` does not take, with what
    to write instead of each of TransformerLens's."""
    parts = [f"{function}() got unexpected keyword arguments {sorted(names)}"]
    parts += [
        f"{name!r} is TransformerLens's: use {KEYWORDS[name]}"
        for name in sorted(names)
        if name in KEYWORDS
    ]
    if len(parts) > 1:
        parts.append(_FACADE)
    return "; ".join(parts)


def missing_attribute(class_name: str, name: str) -> str:
    """The `AttributeError` message for `name` on our `class_name`: the replacement when
    `name` is TransformerLens's, the ordinary message otherwise."""
    replacement = TABLES.get(class_name, {}).get(name)
    plain = f"{class_name!r} object has no attribute {name!r}"
    if replacement is None:
        return plain
    return f"{plain} (it is TransformerLens's); here use {replacement}; {_FACADE}"


class TLNamesMixin:
    """Gives a module's failed attribute lookups the message of `missing_attribute`.

    Put first among the bases of an `nn.Module` subclass: its `__getattr__` runs only when
    the ordinary lookup and `nn.Module`'s (parameters, buffers, submodules) both fail.
    """

    def __getattr__(self, name: str) -> object:
        try:
            return super().__getattr__(name)  # type: ignore[misc]
        except AttributeError:
            cls = type(self)
            owner = next((c.__name__ for c in cls.__mro__ if c.__name__ in TABLES), cls.__name__)
            raise AttributeError(missing_attribute(owner, name)) from None
