"""The refusal of layers not all alike names what differs (`_layer_differences`): modules
whose class or weight shape differ, in the order the first layer builds them, the config's
per-layer overrides, and the pieces its config asks for that nothing imports. Layers and
configs are built here by hand."""

import types

from torch import nn

from hookedattn.core.hf import _layer_differences


def _layer(width: int, extra: bool = False) -> nn.Module:
    layer = nn.Module()
    layer.q_proj = nn.Linear(8, width, bias=False)
    layer.o_proj = nn.Linear(width, 8, bias=False)
    layer.mlp = nn.Linear(8, width)
    if extra:
        layer.gate = nn.Identity()
    return layer


def _config(**fields) -> types.SimpleNamespace:
    per_layer = fields.pop("per_layer_config", None)
    return types.SimpleNamespace(to_dict=lambda: {"per_layer_config": per_layer}, **fields)


def test_modules_of_another_shape_are_named_in_the_first_layers_order():
    layers = [_layer(4), _layer(4), _layer(6)]
    said = _layer_differences.described(layers, (2, 0), ("mlp",), _config())
    assert said == (
        "q_proj Linear(6, 8) in layer 2, Linear(4, 8) in layer 0, "
        "o_proj Linear(8, 6) in layer 2, Linear(8, 4) in layer 0"
    )


def test_a_module_one_layer_lacks_is_named_absent():
    said = _layer_differences.described([_layer(4, extra=True), _layer(4)], (1, 0), (), _config())
    assert said == "gate absent in layer 1, Identity in layer 0"


def test_modules_beyond_the_first_three_are_counted_not_named():
    layers = [_layer(4, extra=True), _layer(6)]  # q_proj, o_proj, mlp and gate differ
    said = _layer_differences.described(layers, (1, 0), (), _config())
    assert said.startswith("q_proj Linear(6, 8) in layer 1, Linear(4, 8) in layer 0")
    assert said.endswith("mlp Linear(6, 8) in layer 1, Linear(4, 8) in layer 0 (and 1 more)")


def test_per_layer_overrides_are_named_by_field_and_layers():
    config = _config(per_layer_config={"05": {"head_dim": 512}, "11": {"head_dim": 512,
                                        "num_key_value_heads": 1}})  # fmt: skip
    said = _layer_differences.described([_layer(4), _layer(4)], (1, 0), (), config)
    assert said == (
        "per_layer_config sets head_dim in layers [5, 11], num_key_value_heads in layers [11]: "
        "blocks of different attention shapes are not imported by convention"
    )


def test_overrides_keyed_by_layer_type_are_named_by_it():
    config = _config(per_layer_config={"sliding_attention": {"head_dim": 16}})
    said = _layer_differences.described([_layer(4), _layer(4)], (1, 0), (), config)
    assert "head_dim in layers ['sliding_attention']" in said


def test_unimported_pieces_are_named_only_where_the_config_asks_for_them():
    asks = _config(hidden_size_per_layer_input=16, num_kv_shared_layers=0)
    said = _layer_differences.described([_layer(4), _layer(4)], (1, 0), (), asks)
    assert said == "its config also asks for per-layer input embeddings " \
                   "(hidden_size_per_layer_input), not imported"  # fmt: skip
    assert _layer_differences.described([_layer(4), _layer(4)], (1, 0), (), _config()) == ""
