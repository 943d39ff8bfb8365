"""Multi-head latent attention (MLA; DeepSeek-V2, section 2.1, and DeepSeek-V3, Kimi K2).

Keys and values are not read from the stream per head but from one shared, normed latent
of it, `kv_lora_rank` wide, which each head expands; queries likewise from a latent of
width `q_lora_rank` (or from the stream itself when the config has no `q_lora_rank`).
Rotary positions cannot ride on a latent that every head expands (the rotation would not
commute with the expansion), so each head's query and key end in `rotary_dim` "decoupled"
dimensions: the query's from the query latent, the key's from one projection of the stream
that every head shares.

    c_q   = rms(x @ W_Q_a + b_Q_a)                         (hook_q_latent) [batch pos q_rank]
    q     = c_q @ W_Q[h]        = [q_nope, q_rope]         (hook_q) [batch pos head d_head]
    c_kv  = rms(x @ W_KV_a + b_KV_a)                      (hook_kv_latent) [batch pos kv_rank]
    k_r   = x @ W_K_rope + b_K_rope                        (hook_k_rope) [batch pos d_rope]
    k     = [c_kv @ W_K[h], k_r]                           (hook_k) [batch pos head d_head]
    v     = c_kv @ W_V[h]                                  (hook_v) [batch pos head d_head_v]
            (`W_K`, `W_V` are the two parts of one stored `W_KV_b: [head kv_rank d_nope +
            d_head_v]`, as the keys and values come from one expansion of the latent)
    q, k  = their last rotary_dim dimensions rotated       (hook_rot_q, hook_rot_k)
            (none in a block that does not rotate, `rotary_layers`: Kimi Linear's latent
            attention keeps these dimensions, and so the shared key part, unrotated)
            [with a lightning indexer (`index_topk`), each query reads only the keys it
             chooses: `components.indexer`, blocked keys as any attention's]
    scores, pattern, z, out: as any attention (`Attention`: hook_attn_scores, hook_pattern,
            hook_z [batch pos head d_head_v], hook_result, `sum_h z_h @ W_O[h] + b_O`),
            `z` gated as any attention's where the config has `attn_gate` (Bailing
            Hybrid's one sigmoid factor per head, `hook_attn_gate`) before `hook_z`

`d_head` is the query/key width, unrotated part (`d_nope = d_head - rotary_dim`) then
rotated part; `d_head_v` the value width. The scale is `attn_scale` (`sqrt(d_head)`, over
YaRN's `mscale` squared where the model has it: `hf._deepseek`). The latents' norms are
RMSNorms over the latent (`q_a_norm`, `kv_a_norm`, with their own hook points and epsilon
`latent_norm_eps`). The KV cache holds each head's rotated key and value, as any
attention's: the latent is what a cache of this kind could hold instead, smaller, at the
cost of expanding it at every step.

The circuits live in latent space. The norms sit between the stream and every latent, so no
`d_model x d_model` matrix gives a head's scores or writes (`model.QK` and `model.OV` refuse
this attention); between the latents they are exact bilinear maps:

    QK[h]      = W_Q[h][:, :d_nope] @ W_K[h].T    [q_rank kv_rank]   content score (times
                 `1 / attn_scale`) = c_q QK[h] c_kv^T
    QK_rope[h] = W_Q[h][:, d_nope:] @ W_K_rope.T  [q_rank d_model]   positional score, before
                 the rotation (the score at equal positions) = c_q QK_rope[h] x^T
    OV[h]      = W_V[h] @ W_O[h]                 [kv_rank d_model]  what a head writes per
                 key it attends to = c_kv OV[h]

each a `FactoredMatrix` (`q_rank` is `d_model` without a query latent). `model.W_Q`,
`model.W_K`, `model.W_V` and `model.W_O` stack these layers' own (`W_Q: [layer head q_rank
d_head]`, ...: reading the latents, not the stream); there is no `b_Q`, `b_K` or `b_V`.
"""

import torch
from einops import einsum, repeat
from jaxtyping import Float
from torch import Tensor

from hookedattn.core import kernels
from hookedattn.core.components.attention import Attention, AttnInput
from hookedattn.core.components.embed import _param, affine
from hookedattn.core.components.indexer import Indexer
from hookedattn.core.components.norm import RMSNorm
from hookedattn.core.components.rotary import Rotary
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.factored_matrix import FactoredMatrix
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCacheEntry
from hookedattn.core.shapes import HeadVectors

Stream = Float[Tensor, "batch pos d_model"]


class LatentAttention(Attention):
    """Multi-head latent attention (module docstring): the latents and the heads' expansion
    of them are its own; scores, pattern, `z` and the write are `Attention`'s."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        torch.nn.Module.__init__(self)
        n_heads, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        kv_rank, d_rope = cfg.kv_lora_rank, cfg.rotary_dim
        self.d_nope, self.d_head_v = d_head - d_rope, cfg.d_value
        if cfg.q_lora_rank is None:
            self.W_Q = _param(n_heads, d_model, d_head, cfg=cfg)
            self.query_input = self._stream_as_query_input
        else:
            self.W_Q_a = _param(d_model, cfg.q_lora_rank, cfg=cfg)
            self.b_Q_a = _param(cfg.q_lora_rank, cfg=cfg)
            self.q_a_norm = _latent_norm(cfg, cfg.q_lora_rank)
            self.hook_q_latent = HookPoint()  # [batch pos q_rank]
            self.W_Q = _param(n_heads, cfg.q_lora_rank, d_head, cfg=cfg)
            self.query_input = self._query_latent
        self.W_KV_a = _param(d_model, kv_rank, cfg=cfg)
        self.b_KV_a = _param(kv_rank, cfg=cfg)
        self.kv_a_norm = _latent_norm(cfg, kv_rank)
        self.hook_kv_latent = HookPoint()  # [batch pos kv_rank]
        self.W_K_rope = _param(d_model, d_rope, cfg=cfg)
        self.b_K_rope = _param(d_rope, cfg=cfg)
        self.hook_k_rope = HookPoint()  # [batch pos d_rope], one for every head
        # Each head's unrotated key and its value, side by side: one expansion of the latent.
        self.W_KV_b = _param(n_heads, kv_rank, self.d_nope + self.d_head_v, cfg=cfg)
        self.W_O = _param(n_heads, self.d_head_v, d_model, cfg=cfg)
        self.b_O = _param(d_model, cfg=cfg)
        self._init_scoring(cfg, layer)
        self.hook_q = HookPoint()  # [batch pos head d_head]
        self.hook_k = HookPoint()  # [batch pos head d_head]
        self.hook_v = HookPoint()  # [batch pos head d_head_v]
        # A block that does not rotate (`rotary_layers`: Kimi Linear's latent attention,
        # which keeps the decoupled key part unrotated) has no rotary and no rot hooks.
        self.apply_positions = self._unrotated
        if cfg.layer_rotates(layer):
            self.rotary = Rotary(cfg)
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
            self.apply_positions = self.rotate_last
        self._init_pattern_and_write(cfg)
        self.select_keys = self._every_key
        if cfg.layer_indexes(layer):
            self.indexer = Indexer(cfg, self.attn_type)
            self.select_keys = self.indexer.__call__  # bound: registered once, as `indexer`
            # The chosen keys are a mask of this forward's own, which a recorder's later
            # rerun of the scores from the queries alone (`kernels.defer`) would not have.
            self.fused = False

    def forward(
        self,
        query_input: AttnInput,
        key_input: AttnInput,
        value_input: AttnInput,
        context: AttentionContext,
        past_kv: KeyValueCacheEntry | None = None,
    ) -> Float[Tensor, "batch query_pos d_model"]:
        x = query_input  # one shared input (the config refuses per-head copies)
        q_in = self.query_input(x)
        q = self.hook_q(self.per_head(q_in, self.W_Q))
        c_kv = self.hook_kv_latent(self.kv_a_norm(affine(x, self.W_KV_a, self.b_KV_a)))
        k_rope = self.hook_k_rope(affine(x, self.W_K_rope, self.b_K_rope))
        k_nope, v = self.per_head(c_kv, self.W_KV_b).split([self.d_nope, self.d_head_v], dim=-1)
        k, v = self.hook_k(self.keys(k_nope, k_rope)), self.hook_v(v)
        q, k = self.apply_positions(q, k, context)
        context = self.select_keys(x, q_in, context, past_kv)  # a lightning indexer's, or all
        if past_kv is not None:
            k, v = past_kv.append(k, v)
        z = kernels.attend(self, q, k, v, context)  # `written_out`, or one fused kernel
        return self.write(self.hook_z(self.gated(z, x)))

    def key_value_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Refused: keys and values here are not read from the stream by one matrix each."""
        raise TypeError(
            "latent attention has no W_K, b_K, W_V, b_V reading the stream: its keys and "
            "values are expanded from a normed latent (W_KV_a, kv_a_norm, W_KV_b) plus a "
            "shared rotary key (W_K_rope)"
        )

    def _every_key(
        self,
        x: Stream,
        query_input: Tensor,
        context: AttentionContext,
        past_kv: KeyValueCacheEntry | None,
    ) -> AttentionContext:
        """The keys each query reads without an indexer: those `context` lets it."""
        return context

    def _query_latent(self, x: Stream) -> Float[Tensor, "batch pos q_rank"]:
        return self.hook_q_latent(self.q_a_norm(affine(x, self.W_Q_a, self.b_Q_a)))

    def _stream_as_query_input(self, x: Stream) -> Stream:
        return x

    def per_head(
        self, latent: Float[Tensor, "batch pos rank"], W: Float[Tensor, "head rank d_out"]
    ) -> Float[Tensor, "batch pos head d_out"]:
        """Each head's expansion `latent @ W[h]` of a shared latent (or of the stream)."""
        return einsum(latent, W, "batch pos rank, head rank d_out -> batch pos head d_out")

    def keys(
        self,
        k_nope: Float[Tensor, "batch pos head d_nope"],
        k_rope: Float[Tensor, "batch pos d_rope"],
    ) -> Float[Tensor, "batch pos head d_head"]:
        """`[k_nope[h], k_rope]` for every head: the rotary part is the same key for all."""
        shared = repeat(k_rope, "batch pos d_rope -> batch pos head d_rope", head=k_nope.shape[2])
        return torch.cat([k_nope, shared], dim=-1)

    def scored(
        self, q: HeadVectors, k: HeadVectors, context: AttentionContext
    ) -> tuple[HeadVectors, HeadVectors]:
        """The queries and keys the scores read, from the values at `hook_q` and `hook_k`."""
        return self.apply_positions(q, k, context)

    def rotate_last(
        self, q: HeadVectors, k: HeadVectors, context: AttentionContext
    ) -> tuple[HeadVectors, HeadVectors]:
        """`q` and `k` with their last `rotary_dim` dimensions rotated by position."""
        positions, d = context.positions, self.d_nope
        q = torch.cat([q[..., :d], self.rotary(q[..., d:], positions)], dim=-1)
        k = torch.cat([k[..., :d], self.rotary(k[..., d:], positions)], dim=-1)
        return self.hook_rot_q(q), self.hook_rot_k(k)

    @property
    def W_K(self) -> Float[Tensor, "head kv_rank d_nope"]:
        """Each head's unrotated key read of the latent: `W_KV_b[..., :d_nope]`."""
        return self.W_KV_b[..., : self.d_nope]

    @property
    def W_V(self) -> Float[Tensor, "head kv_rank d_head_v"]:
        """Each head's value read of the latent: `W_KV_b[..., d_nope:]`."""
        return self.W_KV_b[..., self.d_nope :]

    # The circuits between the latents (module docstring).
    @property
    def QK(self) -> FactoredMatrix:
        """Each head's content score circuit `W_Q[h][:, :d_nope] @ W_K[h].T`: `[head q_in
        kv_rank]`, from the query latent (or the stream) to the key/value latent."""
        return FactoredMatrix(self.W_Q[..., : self.d_nope], self.W_K.mT)

    @property
    def QK_rope(self) -> FactoredMatrix:
        """Each head's positional score circuit before the rotation, `W_Q[h][:, d_nope:] @
        W_K_rope.T`: `[head q_in d_model]`, from the query latent to the stream."""
        return FactoredMatrix(self.W_Q[..., self.d_nope :], self.W_K_rope.mT)

    @property
    def OV(self) -> FactoredMatrix:
        """Each head's OV circuit `W_V[h] @ W_O[h]`: `[head kv_rank d_model]`, from the
        key/value latent to the stream."""
        return FactoredMatrix(self.W_V, self.W_O)


def _latent_norm(cfg: HookedTransformerConfig, width: int) -> RMSNorm:
    """The RMSNorm of a latent, with its gain and the latents' own epsilon."""
    norm = RMSNorm(cfg, (width,))
    norm.eps = cfg.latent_norm_eps
    return norm
