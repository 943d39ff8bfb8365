"""hookedattn_tl.HookedTransformer: TransformerLens's model methods, arguments and defaults."""

from functools import partial

import pytest
import torch
from torch.testing import assert_close

import analysis
import hookedattn
from hookedattn import CharTokenizer
from hookedattn.testing import random_tiny_model, tiny_model
from hookedattn_tl import (
    HookedTransformer,
    HookedTransformerConfig,
    HookedTransformerKeyValueCache,
    TransformerLensKeyValueCache,
)

TOKENS = torch.tensor([[1, 5, 2, 7, 3, 3], [4, 4, 0, 6, 2, 1]])


make_model = partial(
    tiny_model, model_class=HookedTransformer, n_heads=2, d_head=8, d_mlp=24, n_ctx=24,
    d_vocab=12, act_fn="gelu", dtype=torch.float32,
)  # fmt: skip


def test_set_use_attn_result_shares_parameters_and_keeps_the_logits():
    model = make_model()
    before = model(TOKENS)
    W_Q, b_O = model.blocks[0].attn.W_Q, model.blocks[1].attn.b_O
    model.set_use_attn_result(True)
    assert model.cfg.use_attn_result
    assert model.blocks[0].attn.W_Q is W_Q and model.blocks[1].attn.b_O is b_O
    logits, cache = model.run_with_cache(TOKENS)
    assert_close(logits, before)
    heads = cache["result", 1].sum(-2) + model.blocks[1].attn.b_O
    assert_close(heads, cache["attn_out", 1])


@pytest.mark.parametrize(
    ("setter", "hook"),
    [
        ("set_use_split_qkv_input", "blocks.0.hook_q_input"),
        ("set_use_attn_in", "blocks.0.hook_attn_in"),
        ("set_use_hook_mlp_in", "blocks.1.hook_mlp_in"),
    ],
)
def test_use_toggles_add_hook_points_and_keep_the_function(setter, hook):
    model = make_model()
    before = model(TOKENS)
    getattr(model, setter)(True)
    assert hook in model.hook_dict
    assert_close(model(TOKENS), before)
    getattr(model, setter)(False)
    assert hook not in model.hook_dict


def test_toggle_keeps_hooks_attached_before_it():
    model = make_model()
    seen = []
    model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: seen.append(hook.name))
    model.set_use_attn_result(True)
    model(TOKENS)
    assert seen == ["blocks.0.hook_resid_pre"]


def test_input_to_embed_is_the_stream_entering_block_0():
    model = make_model()
    resid, tokens, shortformer, mask = model.input_to_embed(TOKENS)
    _, cache = model.run_with_cache(TOKENS)
    assert_close(resid, cache["resid_pre", 0])
    assert_close(resid, cache["hook_embed"] + cache["hook_pos_embed"])
    assert tokens is TOKENS or torch.equal(tokens, TOKENS)
    assert shortformer is None and mask is None


def test_loss_fn_matches_the_forward_loss():
    model = make_model()
    logits = model(TOKENS)
    assert_close(model.loss_fn(logits, TOKENS), model(TOKENS, return_type="loss"))
    per_token = model.loss_fn(logits, TOKENS, per_token=True)
    assert per_token.shape == (2, 5)


def test_text_helpers_with_a_tokenizer():
    tokenizer = CharTokenizer("abcdefg")
    model = make_model(d_vocab=tokenizer.vocab_size)
    model.tokenizer = tokenizer
    token = model.to_single_token("c")
    assert model.to_single_str_token(token) == "c"
    with pytest.raises(TypeError, match="int token id"):
        model.to_single_str_token("c")
    model.default_padding_side = "left"
    batch = model.to_tokens(["ab", "abcd"])
    assert batch[0, 0] == tokenizer.pad_token_id  # padded on the left by default
    assert model.to_tokens(["ab", "abcd"], padding_side="right")[0, -1] == tokenizer.pad_token_id
    # Left-padded text through the forward: the real tokens get their unpadded logits.
    short = model("ab")[0, -1]
    assert_close(model(["ab", "abcd"])[0, -1], short, atol=1e-5, rtol=1e-5)


def test_to_string_of_one_token_id_as_tl():
    tokenizer = CharTokenizer("abcdefg")
    model = make_model(d_vocab=tokenizer.vocab_size)
    model.tokenizer = tokenizer
    token = model.to_single_token("c")
    assert model.to_string(torch.tensor(token)) == "c"  # a 0-d tensor, as TL takes
    assert model.to_string(token) == "c"
    assert model.to_string(torch.tensor([token, token])) == "cc"


def test_refactor_factored_attn_matrices_balances_the_factors_and_keeps_the_logits():
    fields = dict(model_class=HookedTransformer, n_heads=2, d_head=4, d_mlp=16, d_vocab=12)
    model = random_tiny_model(**fields)  # float64, every bias and gain random
    before = model(TOKENS)
    model.process_weights_(refactor_factored_attn_matrices=True)
    assert_close(model(TOKENS).log_softmax(-1), before.log_softmax(-1), atol=1e-10, rtol=0)
    eye = torch.eye(4, dtype=torch.float64).expand(2, 4, 4)
    for block in model.blocks:
        attn = block.attn
        assert_close(attn.W_O @ attn.W_O.mT, eye, atol=1e-10, rtol=0)  # W_O = V^T
        gram = attn.W_V.mT @ attn.W_V  # W_V = U S: orthogonal columns
        assert_close(gram, torch.diag_embed(gram.diagonal(dim1=-2, dim2=-1)), atol=1e-10, rtol=0)
        assert not attn.b_V.any()
        # [W_Q; b_Q] and [W_K; b_K] are U sqrt(S) and V sqrt(S): equal column norms.
        q_eff = torch.cat([attn.W_Q, attn.b_Q[:, None]], dim=1)
        k_eff = torch.cat([attn.W_K, attn.b_K[:, None]], dim=1)
        assert_close(q_eff.norm(dim=1), k_eff.norm(dim=1), atol=1e-10, rtol=0)


def test_from_pretrained_refactors_factored_attn_matrices_when_asked():
    plain = HookedTransformer.from_pretrained("bytes-attn-only-2l")
    refactored = HookedTransformer.from_pretrained(
        "bytes-attn-only-2l", refactor_factored_attn_matrices=True
    )
    assert not refactored.blocks[0].attn.b_V.any()
    W_O = refactored.blocks[1].attn.W_O
    assert_close(W_O @ W_O.mT, torch.eye(W_O.shape[1]).expand_as(W_O @ W_O.mT), atol=1e-5, rtol=0)
    tokens = torch.tensor([[1, 5, 2, 7, 3, 3]])
    assert_close(refactored(tokens), plain(tokens), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("fields", "named"),
    [(dict(positional_embedding_type="rotary"), "rotary"), (dict(n_key_value_heads=1), "n_key")],
)
def test_refactor_factored_attn_matrices_refuses_rotary_and_grouped_query(fields, named):
    model = tiny_model(model_class=HookedTransformer, n_heads=2, d_head=4, **fields)
    with pytest.raises(ValueError, match=named):
        model.process_weights_(refactor_factored_attn_matrices=True)


def test_n_params_total_and_all_head_labels():
    model = make_model()
    assert model.n_params_total == sum(p.numel() for p in model.parameters())
    assert model.all_head_labels() == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert model.all_head_labels == ["L0H0", "L0H1", "L1H0", "L1H1"]


def test_tokens_to_residual_directions_squeezes_one_token_as_tl():
    model = make_model()
    assert model.tokens_to_residual_directions(torch.tensor([3])).shape == (16,)
    assert_close(model.tokens_to_residual_directions(3), model.W_U[:, 3])
    assert model.tokens_to_residual_directions(TOKENS).shape == (2, 6, 16)


def test_accumulated_bias():
    model = make_model()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    blocks = model.blocks
    expected = blocks[0].attn.b_O + blocks[0].mlp.b_out + blocks[1].attn.b_O
    assert_close(model.accumulated_bias(1, mlp_input=True), expected)
    no_mlp = model.accumulated_bias(2, include_mlp_biases=False)
    assert_close(no_mlp, blocks[0].attn.b_O + blocks[1].attn.b_O)


def test_kv_cache_init_cache_gives_the_full_forward_logits():
    model = make_model()
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 2)
    assert HookedTransformerKeyValueCache is TransformerLensKeyValueCache
    first = model(TOKENS[:, :4], past_kv_cache=cache)
    rest = model(TOKENS[:, 4:], past_kv_cache=cache)
    assert_close(torch.cat([first, rest], dim=1), model(TOKENS), atol=1e-5, rtol=1e-5)


def test_get_pos_offset_counts_a_hybrids_cached_positions():
    from hookedattn_tl.utilities import get_pos_offset
    from tests.helpers.mixers import hybrid_cfg, random_hybrid

    model = random_hybrid(hybrid_cfg(("mamba2", "attention")), 1)
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)
    assert get_pos_offset(None, 1) == 0
    model(torch.tensor([[1, 2, 3]]), past_kv_cache=cache)
    assert get_pos_offset(cache, 1) == 3


def test_generate_samples_by_default_and_greedy_matches_the_core():
    model = make_model()
    prompt = TOKENS[:1, :3]
    greedy = model.generate(prompt, 4, do_sample=False, stop_at_eos=False, verbose=False)
    core = hookedattn.HookedTransformer.generate(model, prompt, 4, stop_at_eos=False)
    assert torch.equal(greedy, core)
    torch.manual_seed(0)
    sampled = [model.generate(prompt, 6, stop_at_eos=False, verbose=False) for _ in range(4)]
    assert len({tuple(s[0].tolist()) for s in sampled}) > 1  # TL's default: do_sample=True


def test_generate_with_freq_penalty_never_repeats_a_token():
    model = make_model(d_vocab=20)
    prompt = torch.tensor([[1, 2]])
    torch.manual_seed(0)
    out = model.generate(prompt, 10, freq_penalty=1e4, stop_at_eos=False, verbose=False)
    assert out.shape == (1, 12)
    assert len(set(out[0].tolist())) == 12  # each token's count pushes it out of reach


def test_from_pretrained_with_hf_model_processes_by_default():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=16, vocab_size=20)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    processed = HookedTransformer.from_pretrained("gpt2", hf_model=hf)
    raw = HookedTransformer.from_pretrained_no_processing("gpt2", hf_model=hf)
    assert isinstance(processed, HookedTransformer) and isinstance(raw, HookedTransformer)
    assert processed.cfg.normalization_type == "LNPre"
    assert raw.cfg.normalization_type == "LN"
    tokens = torch.tensor([[1, 4, 9, 3]])
    assert_close(
        processed(tokens).log_softmax(-1), raw(tokens).log_softmax(-1), atol=1e-5, rtol=1e-5
    )
    assert_close(raw(tokens), hf(tokens).logits, atol=1e-4, rtol=1e-4)
    left = HookedTransformer.from_pretrained("gpt2", hf_model=hf, default_padding_side="left")
    assert left.default_padding_side == "left"


def test_from_pretrained_refuses_what_it_cannot_do():
    with pytest.raises(TypeError, match="first_n_layers"):
        HookedTransformer.from_pretrained("x", first_n_layers=1)


def test_negative_start_and_stop_layers_count_from_the_end_as_in_tl():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS)
    assert_close(model(TOKENS, stop_at_layer=-1), cache["resid_pre", 1])
    resid = cache["resid_pre", 1]
    assert_close(model(resid, start_at_layer=-1), model(TOKENS))


def test_from_pretrained_a_shipped_model_processes_it():
    name = hookedattn.list_pretrained()[-1].name
    processed = HookedTransformer.from_pretrained(name)
    raw = HookedTransformer.from_pretrained_no_processing(name)
    assert type(processed) is HookedTransformer and processed.tokenizer is not None
    assert (processed.cfg.normalization_type, raw.cfg.normalization_type) == ("LNPre", "LN")
    tokens = raw.to_tokens("hello world")
    assert_close(processed(tokens).log_softmax(-1), raw(tokens).log_softmax(-1), atol=1e-4, rtol=0)


def test_all_composition_scores_are_analysis_scores_masked_to_later_heads():
    model = make_model(n_layers=3)
    scores = model.all_composition_scores("K")
    assert scores.shape == (3, 2, 3, 2) and scores.dtype == model.cfg.dtype
    assert_close(scores, analysis.composition_scores(model, "K").scores.float())
    for earlier in range(3):
        assert bool((scores[earlier, :, : earlier + 1] == 0).all())
    assert bool((scores[0, :, 1:] > 0).all())


def test_a_tl_config_runs_written_out_so_the_cached_run_is_the_plain_forward():
    # TransformerLens code compares the two with torch.allclose's default tolerance.
    from hookedattn_tl import HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=8, d_vocab=12, act_fn="gelu", seed=0
    )
    assert not cfg.use_fused_kernels
    model = HookedTransformer(cfg)
    assert torch.equal(model(TOKENS), model.run_with_cache(TOKENS)[0])
    fused = HookedTransformer(cfg.replace(use_fused_kernels=True))
    assert_close(fused(TOKENS), model(TOKENS), rtol=1e-5, atol=1e-5)


def test_from_pretrained_returns_a_written_out_model_of_the_shipped_weights():
    model = HookedTransformer.from_pretrained_no_processing("bytes-attn-only-2l")
    assert not model.cfg.use_fused_kernels
    tokens = model.to_tokens("abcabc xyzxyz")
    assert torch.equal(model(tokens), model.run_with_cache(tokens)[0])
    core = hookedattn.HookedTransformer.from_pretrained("bytes-attn-only-2l")
    assert_close(model(tokens), core(tokens), rtol=1e-5, atol=1e-5)


def test_a_tl_config_with_experts_builds_the_cores_mixture_of_experts():
    fields = dict(
        n_layers=2, d_model=8, n_ctx=8, d_head=4, n_heads=2, d_mlp=6, d_vocab=10,
        act_fn="silu", gated_mlp=True, normalization_type="RMS", num_experts=4,
        experts_per_token=2, seed=3, dtype=torch.float64,
    )  # fmt: skip
    tl_model = HookedTransformer(HookedTransformerConfig(**fields))
    core = hookedattn.HookedTransformer(hookedattn.HookedTransformerConfig(**fields))
    core.load_state_dict(tl_model.state_dict())
    assert tl_model.cfg.num_experts == 4 and tl_model.cfg.is_moe
    assert_close(tl_model(TOKENS), core(TOKENS), rtol=0, atol=1e-12)
