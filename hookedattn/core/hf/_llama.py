"""The Llama-like table the families written out (Gemma 4, GPT-OSS, DiffLlama, MiniMax,
JetMoE, Falcon-H1, latent attention) extend. Llama itself, Mistral, Qwen, OLMo, Phi-3, Gemma 2
and 3 and the mixtures are imported by convention (`_convention`): what they add to this
table (windows, biases, q/k norms, post-norms, fused projections, experts) is recognised there.

Beyond GPT-2: RMSNorm, a gated MLP (`down(act(gate(x)) * up(x))`: our `W_gate`, `W_in`,
`W_out`), grouped-query attention (`num_key_value_heads` < `num_attention_heads`: keys and
values stored once per group as `_W_K`, `_W_V: [kv_head d_model d_head]`; query head `h`
reads group `h // (head / kv_head)`, as HF's `repeat_kv`), rotary positions on the whole
head, biases on q, k, v and o together when `attention_bias`, `rope_parameters` "linear"
or "llama3".

Every weight is an `nn.Linear` `[out in]`, so each one is transposed.
"""

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf._family import tied_unembedding
from hookedattn.core.hf._table import Rule, Table, zeros

L = "model.layers.{layer}"
# Our norm name -> HF module name, for the usual two pre-norms.
PRE_NORMS = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}


def llama_like_rules(
    cfg: HookedTransformerConfig,
    *,
    norms: Mapping[str, str] = PRE_NORMS,
    qkv_bias: bool = False,
    o_bias: bool = False,
    norm_adjust: Callable[[Tensor], Tensor] | None = None,
    embed_adjust: Callable[[Tensor], Tensor] | None = None,
) -> list[Rule]:
    """The rules of a Llama-like model (unexpanded); `norms` maps our block norm names to
    HF's, `norm_adjust` and `embed_adjust` apply to every norm gain and to the embedding."""
    grouped = cfg.n_kv_heads != cfg.n_heads
    kv, k_name, v_name = ("kv_head", "_W_K", "_W_V") if grouped else ("head", "W_K", "W_V")
    a = f"{L}.self_attn"

    def bias(ours: str, hf: str, axes: str, present: bool) -> Rule:
        if not present:
            return zeros(ours, axes)
        return Rule(ours, hf, f"({axes}) -> {axes}" if " " in axes else f"{axes} -> {axes}")

    def gain(ours: str, hf: str) -> Rule:
        return Rule(ours, hf, "d_model -> d_model", adjust=norm_adjust)

    b = "blocks.{layer}"
    heads_in = "(head d_head) d_model -> head d_model d_head"
    kv_in = f"({kv} d_head) d_model -> {kv} d_model d_head"
    mlp_in, mlp_out = "d_mlp d_model -> d_model d_mlp", "d_model d_mlp -> d_mlp d_model"
    return [
        Rule("embed.W_E", "model.embed_tokens.weight", "d_vocab d_model -> d_vocab d_model",
             adjust=embed_adjust),
        *(gain(f"{b}.{ours}.w", f"{L}.{hf}.weight") for ours, hf in norms.items()),
        Rule(f"{b}.attn.W_Q", f"{a}.q_proj.weight", heads_in),
        Rule(f"{b}.attn.{k_name}", f"{a}.k_proj.weight", kv_in),
        Rule(f"{b}.attn.{v_name}", f"{a}.v_proj.weight", kv_in),
        Rule(f"{b}.attn.W_O", f"{a}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        bias(f"{b}.attn.b_Q", f"{a}.q_proj.bias", "head d_head", qkv_bias),
        bias(f"{b}.attn.{k_name.replace('W', 'b')}", f"{a}.k_proj.bias", f"{kv} d_head", qkv_bias),
        bias(f"{b}.attn.{v_name.replace('W', 'b')}", f"{a}.v_proj.bias", f"{kv} d_head", qkv_bias),
        bias(f"{b}.attn.b_O", f"{a}.o_proj.bias", "d_model", o_bias),
        Rule(f"{b}.mlp.W_gate", f"{L}.mlp.gate_proj.weight", mlp_in),
        Rule(f"{b}.mlp.W_in", f"{L}.mlp.up_proj.weight", mlp_in),
        zeros(f"{b}.mlp.b_in", "d_mlp"),
        Rule(f"{b}.mlp.W_out", f"{L}.mlp.down_proj.weight", mlp_out),
        zeros(f"{b}.mlp.b_out", "d_model"),
        gain("ln_final.w", "model.norm.weight"),
        Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
        zeros("unembed.b_U", "d_vocab_out"),
    ]  # fmt: skip


def llama_like_table(
    hf_config: Any, cfg: HookedTransformerConfig, rules: list[Rule], label: str
) -> Table:
    """`rules` expanded per block, with the tied unembedding and the ignored buffers."""
    return Table(
        rules=tuple(r for rule in rules for r in rule.expand(cfg.n_layers)),
        aliases=tied_unembedding(hf_config, "model.embed_tokens.weight"),
        ignored=(r"rotary_emb\.inv_freq$",),  # saved by older versions; derived from config
        label=label,
        base_prefix="model.",
    )
