"""Spec -> validated graph -> torchdata nodes -> Loader."""

from conveyor.graphs.api import check_spec, load_graph, read_spec

__all__ = ["check_spec", "load_graph", "read_spec"]
