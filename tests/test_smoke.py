import torch

from hookedattn import HookedTransformer, HookedTransformerConfig


def test_forward_runs_under_shape_checks():
    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=32,
        n_heads=4,
        n_ctx=16,
        d_vocab=50,
        d_mlp=64,
        seed=0,
        use_split_qkv_input=True,
        use_attn_result=True,
        positional_embedding_type="rotary",
    )
    model = HookedTransformer(cfg)
    logits, _ = model.run_with_cache(torch.randint(0, 50, (2, 5)))
    assert logits.shape == (2, 5, 50)
