"""`HookedTransformer`: a GPT-style decoder built from hook points.

    resid  = ln_embed(W_E[tokens] + W_pos[positions])   (hook_embed, hook_pos_embed)
             (or ln_embed(W_E[tokens]) + W_pos[positions]: `embed_norm_before_positions`)
    resid  = embed_proj(resid)                          (`d_embed`: ELECTRA, RemBERT)
    resid  = block(resid)  for each block                (see components/block.py)
    logits = unembed_transform(ln_final(resid)) @ W_U + b_U

`ln_embed` (`embed_norm`: BERT, BART), `embed_proj` (embeddings `d_embed` wide projected
to the stream) and `unembed_transform` (BERT's head: dense, act, norm) are the identity
where the config has none; there is no `ln_final` after
post-residual norms (`normalization_placement="post_residual"`).

A shortformer model (`positional_embedding_type="shortformer"`) keeps `W_pos[positions]`
(still at `hook_pos_embed`) out of the stream: `resid = W_E[tokens]`, and every block adds
the positional embedding to its queries' and keys' normed inputs (the attention context
carries it: `with_query_key_positions`).

`forward` is that loop, after turning its input into a residual stream: text is tokenized
and ids are checked (`_inputs.py`), and the masks and positions every attention layer
shares are built once (`_masks.py`). Caching and editing happen at the hook points; the
stacked weight views (`model.W_Q: [layer head d_model d_head]`, `QK`, `OV`) live in
`_stacked_weights.py`.
"""

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core import (
    _inputs,
    _recording,
    _tokenization,
    generation,
    kernels,
)
from hookedattn.core._model_io import ModelIO
from hookedattn.core._stacked_weights import StackedWeights
from hookedattn.core._tl_names import TLNamesMixin
from hookedattn.core.cache import ActivationCache
from hookedattn.core.components.block import make_block
from hookedattn.core.components.embed import Embed, PosEmbed, Unembed
from hookedattn.core.components.embed_projection import make_embed_projection
from hookedattn.core.components.norm import make_embed_norm, make_final_norm
from hookedattn.core.components.per_layer_input import PerLayerInputs
from hookedattn.core.components.unembed_transform import make_unembed_transform
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.hooked_root import HookedRootModule
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn.core.loss import lm_cross_entropy_loss
from hookedattn.core.shapes import Logits, Resid


class LogitsAndLoss(NamedTuple):
    """What `forward(..., return_type="both")` returns; unpacks as `logits, loss`."""

    logits: Logits
    loss: Tensor


class HookedTransformer(ModelIO, StackedWeights, TLNamesMixin, HookedRootModule):
    """A decoder-only transformer whose every activation passes through a named hook point.

    Build one from a `HookedTransformerConfig` (random weights, seeded by `cfg.seed`), or
    load one with `HookedTransformer.load(path)`. Weights are in circuits notation and are
    also exposed stacked across layers: `model.W_Q` is `[layer head d_model d_head]`.
    """

    # `hookedattn.sae.spliced`, registered by the SAE package when it is imported.
    sae_splicer: Callable[..., Any] | None = None
    # The config of the checkpoint a model was imported from (`from_hf`: its config.json as
    # a dict), an outside record of its constants for independent checks; None otherwise.
    checkpoint_config: dict[str, Any] | None = None
    # How `from_hf` verified the directory it read (`hookedattn.core.hf.Verification`);
    # None otherwise (a live model, `verify=False`, a model not imported).
    verification: Any = None

    def __init__(self, cfg: HookedTransformerConfig, tokenizer: Any = None) -> None:
        super().__init__()
        if not isinstance(cfg, HookedTransformerConfig):
            raise TypeError(f"cfg must be a HookedTransformerConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tokenizer = tokenizer
        # What a load by name read (`hookedattn.core.hub.Resolved`); None when built here.
        self.source: Any = None
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # [batch pos d_model]
        # The forward's chosen steps, kept as functions of the model (`embed_tokens`,
        # `with_query_key_positions`, `with_per_layer_inputs` call them): a method bound to
        # the model and kept on it would make the model a reference cycle (`_variants`).
        cls = type(self)
        self._embedding = cls._token_embedding
        self._query_key_positions = _without_query_key_positions
        if cfg.has_learned_positions:
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()
        if cfg.positional_embedding_type == "standard":
            self._embedding = cls._token_and_position_embedding
            if cfg.embed_norm_before_positions:
                self._embedding = cls._normed_token_and_position_embedding
        elif cfg.positional_embedding_type == "shortformer":
            self._query_key_positions = cls._with_query_key_positions
        # rotary models rotate q and k instead; "none" has no positional signal
        self.ln_embed = make_embed_norm(cfg)
        self.embed_proj = make_embed_projection(cfg)
        self._per_layer_inputs = _without_per_layer_inputs
        if cfg.d_per_layer_input is not None:  # Gemma 4's small sizes
            self.per_layer_inputs = PerLayerInputs(cfg)
            self._per_layer_inputs = cls._with_per_layer_inputs
        self.blocks = nn.ModuleList([make_block(cfg, layer) for layer in range(cfg.n_layers)])
        self.ln_final = make_final_norm(cfg)
        self.unembed_transform = make_unembed_transform(cfg)
        self.unembed = Unembed(cfg)
        if cfg.init_weights:
            self.init_weights()
        self.setup()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        # Loose annotations on purpose: bad input gets our own error, which names the
        # expected shape or values, rather than a generic type-check failure.
        input: Tensor | str | list[str],
        return_type: str | None = "logits",
        *,
        loss_per_token: bool = False,
        start_at_layer: Any = None,
        stop_at_layer: Any = None,
        tokens: Tensor | None = None,
        attention_mask: Any = None,
        past_kv_cache: KeyValueCache | None = None,
    ) -> Any:
        """Run the model.

        `input` is token ids `[batch pos]` (or `[pos]`), a string or a list of strings
        (tokenized, padded and masked), or, with `start_at_layer=L`, the residual stream
        `[batch pos d_model]` entering block L (how a hand-made `X_IN` goes in; give
        `tokens=` too for a loss). With `stop_at_layer=L` the residual stream entering
        block L is returned and `return_type` is ignored. Layer bounds are ints in
        `0..n_layers` with start <= stop. `return_type`: "logits", "loss" (mean next-token
        cross-entropy, or per token with `loss_per_token`), "both" (a `LogitsAndLoss`), or
        None. With `past_kv_cache` the cache is extended all or nothing: if anything in
        the forward raises, the cache is left as it was.

        The model itself is the code below: the input stage (`_inputs.prepare`: tokenize,
        check, embed, masks), the blocks, the final norm and the unembedding, the loss.
        """
        self._notice_wrappers()  # nnsight's, on the hook points (`hook_points` docstring)
        with _transaction(past_kv_cache):
            x = _inputs.prepare(
                self,
                input,
                return_type=return_type,
                start_at_layer=start_at_layer,
                stop_at_layer=stop_at_layer,
                tokens=tokens,
                attention_mask=attention_mask,
                past_kv_cache=past_kv_cache,
            )
            unembed = stop_at_layer is None
            out = self._through_blocks(x.resid, x.context, past_kv_cache, x.start, x.stop, unembed)
            if not unembed:
                return out
            logits = out
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if x.tokens is None:
            raise ValueError("a loss needs the tokens: pass tokens= with start_at_layer")
        loss = lm_cross_entropy_loss(logits, x.tokens, x.attention_mask, per_token=loss_per_token)
        return loss if return_type == "loss" else LogitsAndLoss(logits, loss)

    def _through_blocks(
        self,
        resid: Resid,
        context: AttentionContext,
        past_kv_cache: KeyValueCache | None,
        start: int,
        stop: int,
        unembed: bool,
    ) -> Tensor:
        """Blocks `start..stop-1`, then with `unembed` the final norm and the unembedding;
        the fused kernels' non-finite guard decided once for all the blocks where nothing
        listens (`kernels.guarded`: it reads the stream they leave, which every value they
        wrote reaches, a `d_model` wide pass rather than a `d_vocab` wide one)."""

        def run() -> Resid:
            return self._blocks(resid, context, past_kv_cache, start, stop)

        out = kernels.guarded(self, run, context.guard, past_kv_cache)
        return self.unembed(self.unembed_transform(self.ln_final(out))) if unembed else out

    def _blocks(
        self,
        resid: Resid,
        context: AttentionContext,
        past_kv_cache: KeyValueCache | None,
        start: int,
        stop: int,
    ) -> Resid:
        """Blocks `start..stop-1` in turn, each reading its layer of the KV cache (if any)."""
        blocks = self.blocks._modules  # ModuleList's own indexing is costlier than the dict's
        for layer in range(start, stop):
            past = None if past_kv_cache is None else past_kv_cache.entries[layer]
            resid = blocks[str(layer)](resid, context, past)
        return resid

    def _next_token_step(
        self, tokens: Int[Tensor, "batch 1"], past_kv_cache: KeyValueCache
    ) -> tuple[Float[Tensor, "batch d_vocab_out"], bool]:
        """One generation step: the logits after one more token per row, which follows
        the cache's real (unpadded) tokens, and whether they are known to be finite.
        `forward` without its input checks, for ids the generation loop chose itself
        (hooks run as in any forward). Where nothing listens, the fused kernels' guard
        (`kernels.guarded`) reads these logits rather than the stream: a value that is not
        finite in the stream reaches them through the final norm, and the generation loop,
        which checks the logits it chooses from, need not read them a second time."""
        self._notice_wrappers()
        with past_kv_cache.transaction():
            resid, context = _inputs.prepare_next_token(self, tokens, past_kv_cache)
            n_layers, guard = self.cfg.n_layers, context.guard

            def run() -> Tensor:  # batch 1 d_vocab_out
                out = self._blocks(resid, context, past_kv_cache, 0, n_layers)
                return self.unembed(self.unembed_transform(self.ln_final(out)))

            logits = kernels.guarded(self, run, guard, past_kv_cache)[:, -1]
        return logits, guard.passed

    def embed_tokens(
        self, tokens: Int[Tensor, "batch pos"], positions: Int[Tensor, "batch pos"]
    ) -> Resid:
        """The stream entering the first block: the token embedding, with the learned
        positions where the model has them, through any embedding norm and projection (the
        form chosen at construction)."""
        return self._embedding(self, tokens, positions)

    def with_query_key_positions(self, context: AttentionContext) -> AttentionContext:
        """The context with the positional embedding the queries and keys read (a
        shortformer's), or as it is."""
        return self._query_key_positions(self, context)

    def with_per_layer_inputs(
        self,
        context: AttentionContext,
        tokens: Int[Tensor, "batch pos"] | None,
        embedding: Resid | None,
    ) -> AttentionContext:
        """The context with every block's per-layer input (Gemma 4's small sizes), or as
        it is."""
        return self._per_layer_inputs(self, context, tokens, embedding)

    def _token_and_position_embedding(
        self, tokens: Int[Tensor, "batch pos"], positions: Int[Tensor, "batch pos"]
    ) -> Resid:
        embed, pos_embed = self.embed(tokens), self.pos_embed(positions)
        return self.embed_proj(
            self.ln_embed(self.hook_embed(embed) + self.hook_pos_embed(pos_embed))
        )

    def _normed_token_and_position_embedding(
        self, tokens: Int[Tensor, "batch pos"], positions: Int[Tensor, "batch pos"]
    ) -> Resid:
        """BlenderbotSmall's order: the token embedding normed, then the positions added."""
        embed, pos_embed = self.embed(tokens), self.pos_embed(positions)
        return self.embed_proj(
            self.ln_embed(self.hook_embed(embed)) + self.hook_pos_embed(pos_embed)
        )

    def _token_embedding(
        self, tokens: Int[Tensor, "batch pos"], positions: Int[Tensor, "batch pos"]
    ) -> Resid:
        return self.embed_proj(self.ln_embed(self.hook_embed(self.embed(tokens))))

    def _with_query_key_positions(self, context: AttentionContext) -> AttentionContext:
        """The context with the positional embedding of its positions, which every layer's
        queries and keys read (shortformer: it never enters the stream)."""
        pos_embed = self.hook_pos_embed(self.pos_embed(context.positions))
        return dataclasses.replace(context, pos_embed=pos_embed)

    def _with_per_layer_inputs(
        self,
        context: AttentionContext,
        tokens: Int[Tensor, "batch pos"] | None,
        embedding: Resid | None,
    ) -> AttentionContext:
        """The context with every block's per-layer input, made from the tokens and their
        embedding (`components.per_layer_input`; `embedding` None: `W_E[tokens]`, for a
        forward from a residual stream). A ValueError where there are no tokens."""
        if tokens is None:
            raise ValueError(
                "this model's blocks read inputs made from the tokens (d_per_layer_input="
                f"{self.cfg.d_per_layer_input}): with start_at_layer, give tokens= too"
            )
        embedding = self.embed(tokens) if embedding is None else embedding
        per_layer_inputs = self.per_layer_inputs(tokens, embedding)
        return dataclasses.replace(context, per_layer_inputs=per_layer_inputs)

    # ------------------------------------------------------------------ caching
    def run_with_cache(
        self,
        *model_args: Any,
        names_filter: str | Sequence[str] | Callable[[str], bool] | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        pos_slice: int | slice | Sequence[int] | None = None,
        **model_kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """Run the model and record activations: returns `(output, ActivationCache)`.

        `names_filter`: None (every hook point), a name, a list of names, or a predicate on
        names; only the chosen activations are kept alive. `device`/`dtype` move or cast
        them as they are recorded; `pos_slice` keeps only some positions (the query
        position for scores and patterns; an int keeps its axis, of size 1).
        `remove_batch_dim` needs a batch of 1. `incl_bwd=True` also differentiates the
        output, which must then be a scalar (use `return_type="loss"`), and stores each
        gradient under `name + "_grad"` (parameter `.grad`s are left untouched). Cached
        tensors never change afterwards: they are copied only when a hook that could edit
        them in place is attached.
        """
        return _recording.run_with_cache(
            self,
            model_args,
            model_kwargs,
            names_filter=names_filter,
            device=device,
            dtype=dtype,
            remove_batch_dim=remove_batch_dim,
            incl_bwd=incl_bwd,
            pos_slice=pos_slice,
        )

    # ------------------------------------------------------------------ text in, text out
    def tokenize(
        self,
        input: Any,
        prepend_bos: bool | None = None,
        padding_side: str = "right",
    ) -> _tokenization.TokenizedText:
        """Token ids and attention mask `[batch pos]` of a string or a list of strings.

        The mask marks padding with 0; pass both on (`model(t.tokens,
        attention_mask=t.attention_mask)`) and every real token gets the result it would
        get alone. Strings passed to the forward get their mask the same way.
        """
        return _tokenization.tokenize(self, input, prepend_bos, padding_side)

    def to_tokens(
        self,
        input: Any,
        prepend_bos: bool | None = None,
        padding_side: str = "right",
    ) -> Int[Tensor, "batch pos"]:
        """Token ids `[batch pos]` of a string or a list of strings, padded on `padding_side`.

        BOS is prepended (by default, when the tokenizer has one); with left padding it
        sits after the padding, before the prompt. The mask of a padded batch comes from
        `tokenize`.
        """
        return _tokenization.tokenize(self, input, prepend_bos, padding_side).tokens

    def to_str_tokens(self, input: Any, prepend_bos: bool | None = None) -> list:
        """Each token as a string: a list for a string or one sequence of ids `[pos]`/`[1
        pos]`, and a list of lists for a list of strings."""
        return _tokenization.to_str_tokens(self, input, prepend_bos)

    def to_string(self, tokens: Any) -> str | list[str]:
        """The text of `[pos]` token ids (a string) or of `[batch pos]` (one per row)."""
        return _tokenization.to_string(self, tokens)

    def to_single_token(self, string: Any) -> int:
        """The id of a string that is exactly one token."""
        return _tokenization.to_single_token(self, string)

    def get_token_position(
        self,
        single_token: Any,
        input: Any,
        mode: str = "first",
        prepend_bos: bool | None = None,
    ) -> int:
        """The first (or, `mode="last"`, last) position of a token in a string or id sequence."""
        return _tokenization.get_token_position(self, single_token, input, mode, prepend_bos)

    # Continue a prompt token by token (`hookedattn.core.generation`; the options are in the
    # signature, as `help(model.generate)` shows): all at once, step by step with each step's
    # activations, or as a stream of tokens or text (TransformerLens's `generate_stream`).
    generate = generation.generate
    generate_steps = generation.generate_steps
    generate_stream = generation.generate_stream

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal(0, init_range) for weight matrices, zero biases (and a Mamba-2 mixer's
        `A_log`, `D`, `dt_bias`), unit norm gains.

        Drawn in float32 from a generator seeded by `cfg.seed` (the global RNG when None)
        and then cast, so models of different dtypes from one seed hold the same weights.
        """
        generator = None
        if self.cfg.seed is not None:
            generator = torch.Generator().manual_seed(self.cfg.seed)
        for name, param in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1].removeprefix("_")  # grouped `_W_K` is a weight too
            if leaf.startswith("W_"):
                values = torch.randn(param.shape, generator=generator) * self.cfg.init_range
                param.copy_(values.to(param.dtype))
            elif leaf == "w" or leaf.startswith("w_"):  # norm gains (Mamba-2's `w_norm`)
                param.fill_(1.0)
            else:
                param.zero_()

    def to(self, *args: Any, **kwargs: Any) -> "HookedTransformer":
        """`nn.Module.to`, keeping `cfg.dtype` and `cfg.device` true to the weights."""
        device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
        super().to(*args, **kwargs)
        changes = {}
        if dtype is not None:
            changes["dtype"] = dtype
        if device is not None:
            changes["device"] = str(device)
        if changes:
            self.cfg = dataclasses.replace(self.cfg, **changes)
        return self

    @contextlib.contextmanager
    def keeping_fused_weights(self) -> Iterator[None]:
        """Within this scope, keep each layer's fused q/k/v weights between forwards.

        Generation runs one token at a time, where copying the weights side by side costs
        as much as the product itself; this keeps the copy (rebuilt whenever a weight
        changes) until the scope ends, at the cost of one more copy of the attention
        weights in memory meanwhile.
        """
        with kernels.keeping_fused_weights(self):
            yield

    def saes(self, saes: Any, use_error_term: bool = True) -> Any:
        """Splice sparse autoencoders at their hook points for a `with` block.

        The SAE package (`hookedattn.sae`, an application built on this core) provides the
        splicing; importing it (as `import hookedattn` does) registers it here, so the core
        never imports it.
        """
        if HookedTransformer.sae_splicer is None:
            raise RuntimeError("model.saes needs the SAE package: import hookedattn.sae first")
        return HookedTransformer.sae_splicer(self, saes, use_error_term)

    def copy(self) -> "HookedTransformer":
        """An independent deep copy (weights, config and attached hooks)."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------------ input checks
    def _as_tokens(self, input: Any) -> Int[Tensor, "batch pos"]:
        """Checked token ids `[batch pos]` of ids or text (the input stage's check, for the
        generation loop and the TransformerLens facade)."""
        return _inputs.as_tokens(self, input)


def _without_per_layer_inputs(
    model: Any, context: AttentionContext, tokens: Tensor | None, embedding: Tensor | None
) -> AttentionContext:
    """The context as it is: no block reads an input of its own."""
    return context


def _without_query_key_positions(model: Any, context: AttentionContext) -> AttentionContext:
    """The context as it is: no positional embedding for the queries and keys to read."""
    return context


@contextlib.contextmanager
def _transaction(past_kv_cache: KeyValueCache | None) -> Iterator[None]:
    """The KV cache's all-or-nothing extension, or nothing without a cache."""
    if past_kv_cache is None:
        yield
        return
    with past_kv_cache.transaction():
        yield
