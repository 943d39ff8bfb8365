"""Tensor parallelism: two ranks under a real `torchrun --nproc_per_node 2` (gloo, CPU) give
what one process gives, and bad sizes or launches are refused by name.

One launch (`tests/parallel/_tensor_parallel_worker.py`) runs every check on fifteen models
(GPT-2-like, Llama-like with grouped keys and values, per-head input copies in a parallel
block, a float32 model with fused kernels and per-head q/k norms, a shortformer, two
hybrids whose gated delta nets and Mamba-2 mixers are split by heads (a short convolution
by channels), one whose Mamba-1 mixer is split by channels, two of Kimi Delta Attention
beside latent attention (Kimi Linear's, Bailing Hybrid's), three models of latent
attention (one with a dense block then a mixture of experts, one with a lightning indexer),
and two mixtures of experts whose experts' neurons are split) against the one-process
model each rank splits, and reports per rank; each test below reads one kind of check.
float64 agrees to 1e-12 and float32 to 1e-5, relative to the reference's scale: the ranks
sum their heads' (or neurons') partial sums in another order than one process does,
nothing else differs.
"""

import json
from pathlib import Path

import pytest
import torch
from helpers.torchrun import torchrun

from hookedattn import HookedTransformer
from hookedattn.core import parallel
from hookedattn.core.parallel._shards import chunk_lengths, chunk_range
from hookedattn.testing import random_tiny_model, tiny_model

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_tensor_parallel_worker.py")
TOLERANCE = {"float32_fused": 1e-5, "moe_float32": 1e-5}  # every other case is float64
FAMILIES = ("llama", "gpt2", "neox", "phi3", "bamba", "qwen3_moe", "qwen3_5", "deepseek_v3",
            "jamba", "falcon_mamba")  # fmt: skip


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Path:
    """One launch for the whole file: the checks on split models, and the loading."""
    out = tmp_path_factory.mktemp("tensor_parallel")
    hf_dirs = [save_hf(family, out / family) for family in FAMILIES]
    random_tiny_model(d_vocab=33).save(out / "ours")  # 4 heads: tp_size=4 divides them
    torchrun(WORKER, str(out), *map(str, hf_dirs), str(out / "ours"))
    return out


@pytest.fixture(scope="module")
def ranks(launched) -> list[dict]:
    return [json.loads((launched / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def loaded(launched) -> list[dict]:
    return [json.loads((launched / f"loading{r}.json").read_text()) for r in (0, 1)]


def save_hf(family: str, path: Path) -> Path:
    """A tiny HF model directory: Llama with grouped keys and values, GPT-2 (fused
    `c_attn`, a vocabulary of 65 cut 33 + 32), GPT-NeoX (q/k/v interleaved per head) or
    Phi-3 (fused q/k/v of unequal parts, fused gate/up), Bamba (a Mamba-2 mixer, then
    attention), Qwen3-MoE (4 experts, 2 per token), Qwen3.5 (a gated delta net, then gated
    attention), DeepSeek V3 (latent attention, a dense block, then 4 experts), Jamba (a
    Mamba-1 mixer and an MLP, then attention and 4 experts) or Falcon Mamba (Mamba-1 mixers
    alone)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=32)  # fmt: skip
    if family == "neox":
        hf = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**small, rotary_pct=0.5))
    elif family == "phi3":
        config = transformers.Phi3Config(**small, num_key_value_heads=2, pad_token_id=0)
        hf = transformers.Phi3ForCausalLM(config)
    elif family == "qwen3_moe":
        experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
        config = transformers.Qwen3MoeConfig(**small, num_key_value_heads=2, **experts)
        hf = transformers.Qwen3MoeForCausalLM(config)
    elif family == "qwen3_5":
        linear = dict(layer_types=["linear_attention", "full_attention"],
                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                      linear_value_head_dim=8)  # fmt: skip
        config = transformers.Qwen3_5TextConfig(**small, num_key_value_heads=2, **linear)
        hf = transformers.Qwen3_5ForCausalLM(config)
    elif family == "bamba":
        mamba = dict(attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2,
                     mamba_d_state=6, mamba_expand=2)  # fmt: skip
        config = transformers.BambaConfig(**small, num_key_value_heads=2, **mamba)
        hf = transformers.BambaForCausalLM(config)
    elif family == "deepseek_v3":  # latent attention with a query latent, 4 experts
        latent = dict(q_lora_rank=12, kv_lora_rank=10, qk_rope_head_dim=4, qk_nope_head_dim=6,
                      v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16, first_k_dense_replace=1, n_group=1,
                      topk_group=1, pad_token_id=0)  # fmt: skip
        config = transformers.DeepseekV3Config(**small, num_key_value_heads=4, **latent)
        hf = transformers.DeepseekV3ForCausalLM(config)
    elif family == "jamba":  # Mamba-1 mixers and attention, MLPs and 4 experts
        jamba = dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                     expert_layer_offset=1, num_experts=4, num_experts_per_tok=2,
                     mamba_d_state=4, mamba_d_conv=3, mamba_expand=2, mamba_dt_rank=4,
                     pad_token_id=0)  # fmt: skip
        config = transformers.JambaConfig(**small, num_key_value_heads=2, **jamba)
        hf = transformers.JambaForCausalLM(config)
    elif family == "falcon_mamba":  # Mamba-1 mixers alone: no attention, no heads
        config = transformers.FalconMambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                state_size=4, expand=2, conv_kernel=3,
                                                time_step_rank=4)  # fmt: skip
        hf = transformers.FalconMambaForCausalLM(config)
    elif family == "llama":
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, num_key_value_heads=2))
    else:
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32,
                                         vocab_size=65)  # fmt: skip
        hf = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(0.1 * torch.randn_like(param))
    hf.save_pretrained(path)
    return path


def checks(ranks: list[dict], *names: str):
    """`(case, check, value, tolerance)` for every rank, case and named check."""
    for result in ranks:
        for case, values in result.items():
            for name in names:
                if name in values:
                    yield case, name, values[name], TOLERANCE.get(case, 1e-12)


def assert_close(ranks: list[dict], *names: str) -> None:
    found = list(checks(ranks, *names))
    assert found, names
    bad = [(case, name, value) for case, name, value, tol in found if not value <= tol]
    assert not bad, bad


def assert_true(ranks: list[dict], *names: str) -> None:
    found = list(checks(ranks, *names))
    assert found, names
    assert all(value is True for _, _, value, _ in found), found


def test_logits_and_every_cached_activation_equal_one_process(ranks):
    assert_true(ranks, "cache_names")
    assert_close(ranks, "logits", "cached_logits", "cache")


def test_a_hook_edits_the_whole_activation_and_the_edit_acts_on_the_right_rank(ranks):
    # Head 3 of hook_z lives on rank 1; both ranks see it zeroed, as one process does.
    assert_true(ranks, "hook_edit_changes_logits")
    assert_close(ranks, "hook_edit")


def test_activation_patching_equals_one_process(ranks):
    assert_close(ranks, "patch_z", "patch_resid_pre", "patch_v", "patch_pattern")
    assert_close(ranks, "patch_v_by_pos_declared")
    assert_close(ranks, "patch_v_by_pos_one_at_a_time")


def test_greedy_generation_gives_the_one_process_tokens(ranks):
    assert_true(ranks, "generate_kv_cache_True", "generate_kv_cache_False")


def test_a_spliced_sae_at_a_sharded_hook_point_sees_every_neuron(ranks):
    assert_true(ranks, "sae_changes_logits")
    assert_close(ranks, "sae_splice", "sae_acts")


def test_gradients_at_every_hook_point_equal_one_process(ranks):
    assert_true(ranks, "gradient_names")
    assert_close(ranks, "loss", "gradients")


def test_local_activations_are_each_ranks_own_heads(ranks):
    assert_close(ranks, "local_z")
    heads = [sorted({tuple(v["local_z_heads"]) for v in result.values()}) for result in ranks]
    assert heads == [[(0, 2)], [(2, 4)]]


def test_each_rank_holds_about_half_the_weights(ranks):
    # (A lightning indexer is whole on every rank, as latent attention's latents are.)
    fractions = [v for case, _, v, _ in checks(ranks, "parameter_fraction")
                 if "hybrid" not in case and case != "latent_indexed"]  # fmt: skip
    fractions += [value for _, _, value, _ in checks(ranks, "parameter_fraction_beside_mixers")]
    assert fractions and all(0.5 <= f <= 0.6 for f in fractions), fractions
    indexed = [
        v for case, _, v, _ in checks(ranks, "parameter_fraction") if case == "latent_indexed"
    ]
    assert indexed and all(0.5 <= f <= 0.65 for f in indexed), indexed
    assert_close(ranks, "weight_views")  # model.W_Q etc. gather the whole weights
    assert_true(ranks, "dtensor_state_dict")  # each slice a Shard of the whole weight


def test_a_hybrids_delta_nets_and_mamba2s_split_their_heads_other_mixers_run_whole(ranks):
    assert_true(ranks, "mixers_whole", "mixer_edit_changes_logits", "mixers_split")
    assert_close(ranks, "mixer_edit")
    kinds = {(case, name): value for case, name, value, _ in
             checks(ranks, "mixers_split_kinds", "mixers_run_whole")}  # fmt: skip
    assert kinds == {
        ("hybrid", "mixers_split_kinds"): ["gated_delta", "mamba2", "short_conv"],
        ("hybrid", "mixers_run_whole"): ["rg_lru"],
        ("hybrid_beside", "mixers_split_kinds"): ["mamba2"],  # one group: its norm spans ranks
        ("hybrid_beside", "mixers_run_whole"): [],
        ("hybrid_kimi", "mixers_split_kinds"): ["kimi_delta"],  # beside latent attention
        ("hybrid_kimi", "mixers_run_whole"): [],
        ("hybrid_bailing", "mixers_split_kinds"): ["kimi_delta"],
        ("hybrid_bailing", "mixers_run_whole"): [],
        ("hybrid_mamba", "mixers_split_kinds"): ["mamba"],  # Mamba-1: by channels
        ("hybrid_mamba", "mixers_run_whole"): [],
    }
    # Their fused xBC (or q/k/v) weight and convolution stay whole on every rank.
    fractions = [value for _, _, value, _ in checks(ranks, "parameter_fraction_split_mixers")]
    assert fractions and all(0.5 < f < 0.8 for f in fractions), fractions


def test_latent_attention_splits_its_heads_and_keeps_its_latents_whole(ranks):
    # Also every check above (logits, cache, gradients at every hook point, patching, ...).
    assert_true(ranks, "latents_whole", "heads_split")
    assert {case for result in ranks for case in result if "latent" in case} == {
        "latent",
        "latent_indexed",
        "latent_gated",
    }


def test_a_mixture_of_experts_routes_alike_on_every_rank_and_splits_each_experts_neurons(ranks):
    assert_close(ranks, *(f"routing_{point}" for point in ROUTING), "expert_edit")
    assert_close(ranks, "expert_weight_views")  # model.W_in etc. gather each expert's neurons
    assert_true(ranks, "expert_edit_changes_logits")
    assert {case for result in ranks for case in result if "moe" in case} == {"moe", "moe_float32"}


ROUTING = ("hook_router_logits", "hook_expert_indices", "hook_expert_weights")


def test_loading_with_tp_size_reads_exactly_each_ranks_slices_and_runs_as_one_process(loaded):
    for result in loaded:
        assert set(result) == {*(f"from_hf {family}" for family in FAMILIES), "load"}
        for name, values in result.items():
            assert values["slices_exact"] and values["sharded_parameters"] > 10, name
            assert values["logits"] <= 1e-12 and values["cache"] <= 1e-12, (name, values)
            # Bamba's Mamba-2 mixer keeps its fused xBC weight whole on each rank.
            assert values["parameter_fraction"] <= (0.7 if "bamba" in name else 0.6), values


def test_a_split_model_saves_as_the_whole_model(loaded):
    assert all(result["load"]["saved_whole"] for result in loaded)


def test_tp_size_other_than_the_job_is_refused_inside_torchrun(loaded):
    for result in loaded:
        assert "tp_size=4 but the job has 2 processes" in result["load"]["tp_size_4"]


# ------------------------------------------------------------------ in one process
def test_chunks_are_cut_as_torch_chunk_cuts():
    for size in (1, 7, 32, 33, 50257):
        for n_ranks in (1, 2, 3, 8):
            pieces = torch.arange(size).chunk(n_ranks)
            expected = [len(p) for p in pieces] + [0] * (n_ranks - len(pieces))
            assert chunk_lengths(size, n_ranks) == expected
            starts = [chunk_range(size, r, n_ranks)[0] for r in range(len(pieces))]
            assert starts == [int(p[0]) for p in pieces]


def test_a_tp_size_that_does_not_divide_the_heads_is_refused_with_the_valid_sizes():
    with pytest.raises(ValueError, match=r"tp_size=3 does not divide n_heads=4.*can be 1, 2, 4"):
        parallel.check_tp_size(tiny_model().cfg, 3)
    grouped = tiny_model(n_heads=8, n_key_value_heads=2).cfg
    message = r"tp_size=4 does not divide n_key_value_heads=2.*can be 1, 2 for"
    with pytest.raises(ValueError, match=message):
        parallel.check_tp_size(grouped, 4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(d_vocab=5), r"leaves rank 3 no token of d_vocab=5 .*\[2, 2, 1, 0\]"),
        (dict(d_mlp=5), r"leaves rank 3 no neuron of d_mlp=5"),
    ],
)
def test_a_size_that_leaves_a_rank_nothing_is_refused(fields, message):
    # Parts are ceil-sized: 5 over 4 ranks is 2, 2, 1, 0, although 5 >= 4.
    with pytest.raises(ValueError, match=message):
        parallel.check_tp_size(tiny_model(n_heads=4, **fields).cfg, 4)


@pytest.mark.parametrize("tp_size", [True, 0])
def test_a_tp_size_that_is_not_a_positive_int_is_refused_on_load(tp_size, tmp_path):
    tiny_model().save(tmp_path)
    with pytest.raises(ValueError, match="tp_size must be an int >= 1"):
        HookedTransformer.load(tmp_path, tp_size=tp_size)


def test_q_k_norms_over_all_heads_cannot_be_split():
    olmo_like = tiny_model(use_qk_norm=True, qk_norm_per_head=False, normalization_type="RMS").cfg
    with pytest.raises(ValueError, match="over all heads together"):
        parallel.check_tp_size(olmo_like, 2)


def test_tp_size_outside_a_torchrun_job_is_refused(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(
        ValueError, match=r"tp_size=2 needs a job of 2 processes started by torchrun"
    ):
        parallel.tensor_parallel_group(2)


def test_tp_size_other_than_the_world_size_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"tp_size=2 but the job has 4 processes.*tp_size=4"):
        parallel.tensor_parallel_group(2)
