"""The bare reference of `scripts/bench.py`: the same weights, written for speed by hand.

Plain torch (views and permutes rather than einops) on purpose: this is the fastest forward
one would write without hooks, the "physical limit" every contender is measured against.
"""

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hookedattn import HookedTransformer, HookedTransformerConfig


class BareTransformer:
    """The same weights, laid out for speed: what a hand-written forward would do.

    q, k and v come from one `[3 * n_heads * d_head, d_model]` matmul, attention is
    `scaled_dot_product_attention`, and each linear map is one `F.linear` (bias fused).
    """

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
        sd = {k: v.detach() for k, v in model.state_dict().items()}
        self.cfg = cfg
        self.W_E = sd["embed.W_E"]
        self.W_pos = sd.get("pos_embed.W_pos")
        self.layers = [self._layer(sd, f"blocks.{i}.") for i in range(cfg.n_layers)]
        self.ln_final = self._norm(sd, "ln_final.")
        self.W_U = sd["unembed.W_U"].T.contiguous()
        self.b_U = sd["unembed.b_U"]
        self.act = {
            "gelu": F.gelu,
            "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
            "relu": F.relu,
            "silu": F.silu,
        }[cfg.act_fn]

    def _norm(self, sd: dict, prefix: str) -> tuple | None:
        if self.cfg.normalization_type is None:
            return None
        return sd.get(prefix + "w"), sd.get(prefix + "b")

    def _layer(self, sd: dict, p: str) -> dict:
        def flat_in(w: Tensor) -> Tensor:  # [head d_model d_head] -> [(head d_head) d_model]
            return w.permute(0, 2, 1).reshape(-1, w.shape[1])

        layer = {
            "ln1": self._norm(sd, p + "ln1."),
            "W_qkv": torch.cat([flat_in(sd[p + f"attn.W_{c}"]) for c in "QKV"]).contiguous(),
            "b_qkv": torch.cat([sd[p + f"attn.b_{c}"].reshape(-1) for c in "QKV"]),
            "W_O": sd[p + "attn.W_O"].reshape(-1, self.cfg.d_model).T.contiguous(),
            "b_O": sd[p + "attn.b_O"],
        }
        if not self.cfg.attn_only:
            layer |= {
                "ln2": self._norm(sd, p + "ln2."),
                "W_in": sd[p + "mlp.W_in"].T.contiguous(),
                "b_in": sd[p + "mlp.b_in"],
                "W_out": sd[p + "mlp.W_out"].T.contiguous(),
                "b_out": sd[p + "mlp.b_out"],
            }
        return layer

    def norm(self, x: Tensor, wb: tuple | None) -> Tensor:
        if wb is None:
            return x
        return F.layer_norm(x, (self.cfg.d_model,), wb[0], wb[1], self.cfg.eps)

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        x = F.embedding(tokens, self.W_E)
        if self.W_pos is not None:
            x = x + self.W_pos[start : start + tokens.shape[1]]
        return x

    def qkv(self, layer: dict, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        batch, pos, _ = x.shape
        qkv = F.linear(self.norm(x, layer["ln1"]), layer["W_qkv"], layer["b_qkv"])
        q, k, v = qkv.view(batch, pos, 3, self.cfg.n_heads, self.cfg.d_head).permute(2, 0, 3, 1, 4)
        return q, k, v  # each [batch head pos d_head]

    def finish_layer(self, layer: dict, x: Tensor, z: Tensor) -> Tensor:
        batch, _, pos, _ = z.shape
        z = z.transpose(1, 2).reshape(batch, pos, -1)
        x = x + F.linear(z, layer["W_O"], layer["b_O"])
        if self.cfg.attn_only:
            return x
        h = self.act(F.linear(self.norm(x, layer["ln2"]), layer["W_in"], layer["b_in"]))
        return x + F.linear(h, layer["W_out"], layer["b_out"])

    def unembed(self, x: Tensor) -> Tensor:
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
