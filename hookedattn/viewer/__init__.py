"""Self-contained HTML views of a model's activations, for a browser or a notebook.

    from hookedattn.viewer import attention
    page = attention(model, "abcabc xyzxyz")     # a `Page`
    page.save("attention.html")                  # one file: data, script and style inside
    page                                         # in Jupyter: shown in a sandboxed frame

A `Page` is a template, a stylesheet and a small script of this package's own, with the
data embedded as JSON; opening one needs no server and fetches nothing. `analysis.view`
adds the views of analysis results (attributions, decompositions, patching) on the same
machinery. `python -m hookedattn view MODEL PROMPT -o attention.html` writes the attention
page from the shell. `circuit` draws a graph of components and scored edges (the circuit
view; `analysis.view.circuit` makes one from edge scores); `graph_page` draws an
attribution graph of transcoder features (`analysis.attribution_graphs`).
"""

from hookedattn.core import html_table
from hookedattn.viewer.attention import attention, attention_data
from hookedattn.viewer.circuit import CircuitEdge, CircuitNode, circuit, circuit_data
from hookedattn.viewer.graph import GraphPage, graph_page
from hookedattn.viewer.page import Page, float32_base64, script_json
from hookedattn.viewer.tokens import token_strings

__all__ = [
    "CircuitEdge",
    "CircuitNode",
    "GraphPage",
    "Page",
    "attention",
    "attention_data",
    "circuit",
    "circuit_data",
    "float32_base64",
    "graph_page",
    "html_table",
    "script_json",
    "token_strings",
]
