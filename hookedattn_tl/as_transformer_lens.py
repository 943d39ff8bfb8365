"""The alias line as an import: `import hookedattn_tl.as_transformer_lens`.

Importing this module calls `hookedattn_tl.install()`, after which `import transformer_lens`
and every `from transformer_lens.... import ...` reach this package. Put it first in a
TransformerLens script, before anything imports `transformer_lens`.
"""

from hookedattn_tl._alias import install

install()

__all__: list[str] = []
