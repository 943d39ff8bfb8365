"""The former import paths of analysis's modules (`analysis.attribution`, `analysis.graphs`, ...).

The rooms were renamed for what they hold (the four kinds of attribution told apart, the
two kinds of graph, the interventions gathered in `patching/`). A script that still
imports a former path gets the module at its new one, the same module object, with a
`DeprecationWarning` naming it; a submodule of a moved package resolves the same way
(`analysis.graphs.pruning` is `analysis.attribution_graphs.pruning`), by the finder the core
uses for its own former paths (`hookedattn/_moved.py`); the design page (`docs/design.md`)
lists the rooms.
"""

from hookedattn._moved import MovedFinder, install_finder

# Modules before the renaming -> where they are now (private ones too: scripts used them).
MOVED: dict[str, str] = {
    "analysis.attribution": "analysis.direct_logit_attribution",
    "analysis.graphs": "analysis.attribution_graphs",
    "analysis.graphs.graph": "analysis.attribution_graphs.attribution_graph",
    "analysis.discovery.attribution": "analysis.discovery.edge_attribution",
    "analysis.discovery.graph": "analysis.discovery.computational_graph",
    "analysis.feature_patching": "analysis.patching.feature_patching",
    "analysis._ablations": "analysis.patching._ablations",
    "analysis._pattern_ablation": "analysis.patching._pattern_ablation",
    "analysis.patching._attribution": "analysis.patching._attribution_patching",
    "analysis.patching._engine": "analysis.patching._sweep",
}


def new_path(name: str) -> str | None:
    """Where the module `name` (a former path, or a submodule of one) lives now."""
    return MovedFinder(MOVED, "analysis").new_path(name)


def install() -> None:
    """Put the finder of former paths first on `sys.meta_path` (once)."""
    install_finder(MOVED, "analysis")
