"""The bare reference of `scripts/bench`: the same weights, written for speed by hand.

Plain torch (views and permutes rather than einops) on purpose: this is the fastest forward
one would write without hooks, the "physical limit" every contender is measured against.
It is the independent reference forward of the tests (`hookedattn.testing.reference`) with
its weights fused further and its attention and norm replaced by torch's fused kernels.
"""

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.testing.reference import ReferenceTransformer


class BareTransformer(ReferenceTransformer):
    """The same weights, laid out for speed: what a hand-written forward would do.

    It starts from the independent reference's layout (`hookedattn.testing.reference`: one
    matrix per projection over all heads) and fuses it further: q, k and v come from one
    `[3 * n_heads * d_head, d_model]` matmul, attention is `scaled_dot_product_attention`,
    the norm `layer_norm`, and each linear map one `F.linear` (bias fused).
    """

    activations = ReferenceTransformer.activations | {
        "gelu_new": lambda x: F.gelu(x, approximate="tanh")
    }

    def __init__(self, model: HookedTransformer) -> None:
        cfg = model.cfg
        if cfg.positional_embedding_type == "rotary" or cfg.normalization_type not in (
            "LN",
            "LNPre",
            None,
        ):
            raise NotImplementedError(
                f"the bare reference supports standard/none positions and LN/LNPre/None "
                f"norms, not {cfg.positional_embedding_type}/{cfg.normalization_type}"
            )
        super().__init__(model)
        self.layers = [self._fused(layer) for layer in self.layers]
        self.W_U = self.W_U.T.contiguous()

    def _fused(self, layer: dict) -> dict:
        """A block's weights as `F.linear` takes them (`[out, in]`), q, k, v stacked."""
        fused = {
            "ln1": layer["ln1"],
            "W_qkv": torch.cat([layer[f"W_{c}"] for c in "QKV"], dim=1).T.contiguous(),
            "b_qkv": torch.cat([layer[f"b_{c}"] for c in "QKV"]),
            "W_O": layer["W_O"].T.contiguous(),
            "b_O": layer["b_O"],
        }
        if not self.cfg.attn_only:
            fused |= {
                "ln2": layer["ln2"],
                "W_in": layer["W_in"].T.contiguous(),
                "b_in": layer["b_in"],
                "W_out": layer["W_out"].T.contiguous(),
                "b_out": layer["b_out"],
            }
        return fused

    def norm(self, x: Tensor, weights: dict | None) -> Tensor:
        """LayerNorm with `weights` (`w`, `b`); the identity where there is none."""
        if weights is None:
            return x
        return F.layer_norm(x, (self.cfg.d_model,), weights["w"], weights["b"], self.cfg.eps)

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Token embeddings plus positional ones from position `start`."""
        x = F.embedding(tokens, self.W_E)
        if self.W_pos is not None:
            x = x + self.W_pos[start : start + tokens.shape[1]]
        return x

    def qkv(self, layer: dict, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of `layer` from one fused matmul."""
        batch, pos, _ = x.shape
        qkv = F.linear(self.norm(x, layer["ln1"]), layer["W_qkv"], layer["b_qkv"])
        q, k, v = qkv.view(batch, pos, 3, self.cfg.n_heads, self.cfg.d_head).permute(2, 0, 3, 1, 4)
        return q, k, v  # each [batch head pos d_head]

    def finish_layer(self, layer: dict, x: Tensor, z: Tensor) -> Tensor:
        """The stream after `layer`: the heads' outputs `z` written in, then the MLP."""
        batch, _, pos, _ = z.shape
        z = z.transpose(1, 2).reshape(batch, pos, -1)
        x = x + F.linear(z, layer["W_O"], layer["b_O"])
        if self.cfg.attn_only:
            return x
        h = self.act(F.linear(self.norm(x, layer["ln2"]), layer["W_in"], layer["b_in"]))
        return x + F.linear(h, layer["W_out"], layer["b_out"])

    def unembed(self, x: Tensor) -> Tensor:
        """Logits from the final stream."""
        return F.linear(self.norm(x, self.ln_final), self.W_U, self.b_U)

    def __call__(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        scale = 1 / self.cfg.attn_scale
        for layer in self.layers:
            q, k, v = self.qkv(layer, x)
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            x = self.finish_layer(layer, x, z)
        return self.unembed(x)

    def generate(self, tokens: Tensor, n_new: int, use_cache: bool) -> Tensor:
        """Greedy decoding; with `use_cache`, keys and values live in preallocated buffers."""
        if not use_cache:
            for _ in range(n_new):
                nxt = self(tokens)[:, -1].argmax(-1, keepdim=True)
                tokens = torch.cat([tokens, nxt], dim=1)
            return tokens
        cfg, (batch, prompt) = self.cfg, tokens.shape
        shape = (batch, cfg.n_heads, prompt + n_new, cfg.d_head)
        device = self.W_E.device
        keys = [torch.empty(shape, dtype=cfg.dtype, device=device) for _ in self.layers]
        values = [torch.empty(shape, dtype=cfg.dtype, device=device) for _ in self.layers]
        out, step, start = tokens, tokens, 0
        scale = 1 / cfg.attn_scale
        for _ in range(n_new):
            x, end = self.embed(step, start), start + step.shape[1]
            for layer, K, V in zip(self.layers, keys, values, strict=True):
                q, k, v = self.qkv(layer, x)
                K[:, :, start:end], V[:, :, start:end] = k, v
                z = F.scaled_dot_product_attention(
                    q, K[:, :, :end], V[:, :, :end], is_causal=start == 0, scale=scale
                )
                x = self.finish_layer(layer, x, z)
            step = self.unembed(x[:, -1:]).argmax(-1)
            out, start = torch.cat([out, step], dim=1), end
        return out


def build(cfg: dict, batch: int, pos: int) -> tuple[HookedTransformer, Tensor]:
    """A seeded model and a seeded batch of tokens."""
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    model.eval()
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=generator)
    return model, tokens.to(model.cfg.device)


def transformer_lens_model(model: HookedTransformer) -> Any:
    """The same weights in TransformerLens (state-dict names match), or None if not installed."""
    try:
        import transformer_lens
    except ImportError:
        return None
    c = model.cfg
    tl_cfg = transformer_lens.HookedTransformerConfig(
        n_layers=c.n_layers,
        d_model=c.d_model,
        n_ctx=c.n_ctx,
        d_head=c.d_head,
        n_heads=c.n_heads,
        d_mlp=c.d_mlp,
        d_vocab=c.d_vocab,
        d_vocab_out=c.d_vocab_out,
        act_fn=c.act_fn,
        attn_only=c.attn_only,
        normalization_type=c.normalization_type,
        positional_embedding_type=c.positional_embedding_type,
        dtype=c.dtype,
        device=c.device,
    )
    tl = transformer_lens.HookedTransformer(tl_cfg)
    tl.load_state_dict(model.state_dict(), strict=False)
    # TransformerLens's generate() insists on a tokenizer even for token input; it only reads
    # these fields (a pad id no token has: nothing is padding).
    tl.tokenizer = SimpleNamespace(
        pad_token_id=-1, bos_token_id=-1, eos_token_id=None, padding_side="right"
    )
    tl.eval()
    return tl
