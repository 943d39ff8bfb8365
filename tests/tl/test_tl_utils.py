"""hookedattn_tl.utils: TransformerLens's shorthand, Slice, masks, loss and test_prompt."""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from hookedattn import CharTokenizer
from hookedattn.testing import tiny_model
from hookedattn_tl import HookedTransformer, utils


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("embed",), "hook_embed"),
        (("pos_embed",), "hook_pos_embed"),
        (("k", 6, "a"), "blocks.6.attn.hook_k"),
        (("k6",), "blocks.6.attn.hook_k"),
        (("key", 6), "blocks.6.attn.hook_k"),
        (("query", 2), "blocks.2.attn.hook_q"),
        (("value", 0, "attention"), "blocks.0.attn.hook_v"),
        (("scale4ln1",), "blocks.4.ln1.hook_scale"),
        (("normalized", 27, "ln2"), "blocks.27.ln2.hook_normalized"),
        (("pre", 2), "blocks.2.mlp.hook_pre"),
        (("pre5",), "blocks.5.mlp.hook_pre"),
        (("mlp_post", 1), "blocks.1.mlp.hook_post"),
        (("attn", 3), "blocks.3.attn.hook_pattern"),
        (("attn_logits", 3), "blocks.3.attn.hook_attn_scores"),
        (("resid_pre", 4), "blocks.4.hook_resid_pre"),
        (("resid_mid", 4, "b"), "blocks.4.hook_resid_mid"),
        (("scale",), "ln_final.hook_scale"),
        (("normalized",), "ln_final.hook_normalized"),
        (("blocks.0.attn.hook_z",), "blocks.0.attn.hook_z"),
        (("z", 0, "attn"), "blocks.0.attn.hook_z"),
        (("post", 1, "mlp"), "blocks.1.mlp.hook_post"),
    ],
)
def test_get_act_name_expands_every_tl_shorthand(args, name):
    assert utils.get_act_name(*args) == name


def test_get_act_name_names_the_problem_with_a_negative_layer():
    with pytest.raises(ValueError, match="non-negative"):
        utils.get_act_name("resid_pre", -1)


def test_slice_modes():
    x = torch.arange(24).reshape(2, 3, 4)
    assert_close(utils.Slice(None).apply(x, 1), x)
    assert_close(utils.Slice(2).apply(x, -1), x[..., 2])
    assert_close(utils.Slice((1, 3)).apply(x, -1), x[..., 1:3])
    assert_close(utils.Slice((0, 4, 2)).apply(x, 2), x[:, :, 0:4:2])
    assert_close(utils.Slice([0, 2]).apply(x, 1), x[:, [0, 2]])
    assert_close(utils.Slice(torch.tensor([1])).apply(x, 0), x[[1]])
    assert_close(utils.Slice(np.array([3, 0])).apply(x, -1), x[..., [3, 0]])
    assert utils.Slice(slice(1, None)).mode == "slice"
    assert utils.Slice(2).indices().tolist() == [2]
    assert utils.Slice((1, 5, 2)).indices(6).tolist() == [1, 3]
    assert utils.Slice.unwrap(3).mode == "array"  # an int keeps the axis here
    with pytest.raises(ValueError, match="invalid input_slice"):
        utils.Slice("last")


def test_get_attention_mask_right_and_left_padding():
    tokenizer = CharTokenizer("abc")
    pad, bos = tokenizer.pad_token_id, tokenizer.bos_token_id
    tokens = torch.tensor([[bos, 1, 2, pad, pad], [bos, 1, pad, 2, pad]])
    mask = utils.get_attention_mask(tokenizer, tokens, prepend_bos=True)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]  # only trailing padding
    tokenizer.padding_side = "left"
    tokens = torch.tensor([[pad, pad, bos, 1, 2], [pad, bos, 1, pad, 2]])
    mask = utils.get_attention_mask(tokenizer, tokens, prepend_bos=True)
    assert mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert utils.get_attention_mask(None, tokens, True).tolist() == [[1] * 5] * 2


def test_transpose_to_numpy_and_remove_batch_dim():
    x = torch.randn(2, 3, 4)
    assert_close(utils.transpose(x), x.transpose(-1, -2))
    assert np.allclose(utils.to_numpy(x), x.numpy())
    assert utils.to_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype == np.float32
    assert utils.to_numpy([1, 2]).tolist() == [1, 2]
    assert utils.remove_batch_dim(x[:1]).shape == (3, 4)
    with pytest.raises(ValueError, match="to_numpy takes"):
        utils.to_numpy(object())


def test_lm_cross_entropy_loss_with_padding_mask():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    log_probs = logits.log_softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    keep = (mask[:, :-1] * mask[:, 1:]).bool()
    assert_close(utils.lm_cross_entropy_loss(logits, tokens, mask), -log_probs[keep].mean())
    per_token = utils.lm_cross_entropy_loss(logits, tokens, per_token=True)
    assert_close(per_token, -log_probs)


def test_test_prompt_prints_rank_and_top_tokens(capsys):
    tokenizer = CharTokenizer("abcdefgh ")
    fields = dict(n_layers=1, d_model=8, n_heads=2, d_vocab=tokenizer.vocab_size, attn_only=True)
    model = tiny_model(
        model_class=HookedTransformer, tokenizer=tokenizer, dtype=torch.float32, **fields
    )
    utils.test_prompt("abc", "d", model, prepend_space_to_answer=False, top_k=3)
    out = capsys.readouterr().out
    assert "Tokenized prompt:" in out and "Rank:" in out
    assert out.count("Top ") == 3
    # TL's last line: each answer token with its rank, as in the rank line above it.
    rank = int(out.split("Rank: ")[1].split()[0])
    assert out.rstrip().splitlines()[-1] == f"Ranks of the answer tokens: [('d', {rank})]"
