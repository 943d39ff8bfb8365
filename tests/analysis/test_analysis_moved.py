"""The former paths of analysis's modules still import, as the modules at their new paths,
with a DeprecationWarning naming where they went (`analysis/_moved.py`)."""

import importlib
import sys

import pytest

from analysis._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_former_path_warns_and_gives_the_module_at_its_new_path(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} has moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_a_submodule_of_a_moved_package_is_the_module_at_its_new_path(monkeypatch):
    monkeypatch.delitem(sys.modules, "analysis.graphs.pruning", raising=False)
    with pytest.warns(DeprecationWarning, match="analysis.attribution_graphs.pruning"):
        module = importlib.import_module("analysis.graphs.pruning")
    assert module is importlib.import_module("analysis.attribution_graphs.pruning")


def test_a_module_imported_by_its_former_path_keeps_its_own_name_and_spec(monkeypatch):
    monkeypatch.delitem(sys.modules, "analysis.discovery.graph", raising=False)
    with pytest.warns(DeprecationWarning):
        module = importlib.import_module("analysis.discovery.graph")
    assert module.__name__ == module.__spec__.name == "analysis.discovery.computational_graph"


def test_a_name_imported_from_a_former_path_is_the_current_one(monkeypatch):
    monkeypatch.delitem(sys.modules, "analysis.graphs", raising=False)
    with pytest.warns(DeprecationWarning):
        from analysis.graphs import attribution_graph
    from analysis import attribution_graph as current

    assert attribution_graph is current
