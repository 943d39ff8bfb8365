"""TransformerLens's `components.grouped_query_attention`: `GroupedQueryAttention`."""

from hookedattn_tl.components.abstract_attention import GroupedQueryAttention

__all__ = ["GroupedQueryAttention"]
