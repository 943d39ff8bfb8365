import torch

from hookedattn.testing import tiny_model


def test_forward_runs_under_shape_checks():
    model = tiny_model(
        d_model=32, d_vocab=50, use_split_qkv_input=True, use_attn_result=True,
        positional_embedding_type="rotary", dtype=torch.float32,
    )  # fmt: skip
    logits, _ = model.run_with_cache(torch.randint(0, 50, (2, 5)))
    assert logits.shape == (2, 5, 50)
