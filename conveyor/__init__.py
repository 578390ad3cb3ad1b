"""conveyor: PyTorch data loading as a declared graph.

``loader = load_graph("specs/imagenet.yaml", batch_size=256)`` compiles a YAML spec into
torchdata nodes and returns a ``Loader`` with epochs, exact mid-epoch resume and stats.
"""

from conveyor.errors import (ConveyorError, SampleError, SourceError, SpecError, SpecErrors,
                             StateError, WorkerError)
from conveyor.graphs.api import check_spec, load_graph
from conveyor.graphs.builder import Graph
from conveyor.graphs.elastic import dcp_states
from conveyor.graphs.loader import Loader

__all__ = [
    "ConveyorError",
    "Graph",
    "Loader",
    "SampleError",
    "SourceError",
    "SpecError",
    "SpecErrors",
    "StateError",
    "WorkerError",
    "check_spec",
    "dcp_states",
    "load_graph",
]
__version__ = "0.1.0"
