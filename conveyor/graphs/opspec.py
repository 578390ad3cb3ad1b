"""What an op is to the compiler: the ``OpSpec`` and the facts it declares.

Every fact the compiler, the checks and the Loader need about an op is a field of its
``OpSpec``, never a test of its name somewhere else: its length rule, how it treats counts
across ranks, whether it lists, batches, collates or passes records through, its elastic
rule, which of its params leave the data unchanged, and its rules across the graph. A
plug-in op declares the same fields and gets the same answers. The registry
(``conveyor/graphs/registry.py``) keeps the table of ops and re-exports ``OpSpec``,
``param`` and ``Fn`` from here.

The types the fields use live here too: ``Where`` (where a node runs, for its length rule),
``Deal`` (what a dealing op deals by), ``SpecGraph`` and ``Problem`` (what a graph rule
sees and says), and the ready-made rules several ops share (``same_count`` ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

Inputs = Literal["none", "one", "many"]
# how an op's output count follows its input's across ranks (shard's equalize): "always" (equal
# counts in, equal counts out), "unless_skipping" (so, unless its on_error is skip), "never"
KeepsCount = Literal["always", "unless_skipping", "never"]


class Fn(str):
    """Marks a param as a callable named ``module:attr`` (imported when the spec is checked)."""


@dataclass(frozen=True)
class Where:
    """Where a node runs, for its length rule."""

    rank: int
    world: int
    worker: int = 0
    workers: int = 1


# rule(params, input counts, where, count of the built source) -> items per epoch, or None
LengthRule = Callable[[Any, "list[int]", Where, Callable[[], "int | None"]], "int | None"]


@dataclass(frozen=True)
class Deal:
    """What a dealing op (one that deals its input out to ranks and worker copies) does,
    given its params: whether it deals by rank, by worker copy, and whether it evens the
    ranks' counts (``equalize`` other than ``none``)."""

    by_rank: bool
    by_worker: bool
    even: bool


@dataclass(frozen=True)
class Problem:
    """One mistake a graph rule found: the node it is reported at, the message, and where
    in that node (``at``: a path below the node, ``("size",)`` or ``("args", "size")``;
    ``key``: point at the key rather than its value; ``param``: the param to name)."""

    node: str
    message: str
    at: tuple = ()
    param: str | None = None
    key: bool = False


@dataclass(frozen=True)
class SpecGraph:
    """What an op's ``graph_check`` sees: every node of the spec that has an op (a
    ``validate.NodePlan``: ``name``, ``op``, ``params`` (None where its own checks failed),
    ``inputs``), each node's inputs that exist, and whether the graph must resume exactly."""

    nodes: Mapping[str, Any]
    inputs: Mapping[str, list[str]]
    resumable: bool

    def upstream(self, name: str) -> set[str]:
        """Every node ``name`` reads from, directly or not."""
        seen: set[str] = set()
        todo = list(self.inputs.get(name, []))
        while todo:
            n = todo.pop()
            if n in seen or n not in self.inputs:
                continue
            seen.add(n)
            todo.extend(self.inputs[n])
        return seen


GraphCheck = Callable[[SpecGraph, str], "list[Problem]"]


@dataclass(frozen=True)
class OpSpec:
    """What the compiler knows about one op.

    Args:
        name: the op's name in specs.
        params: a frozen dataclass; its fields are the op's params.
        build: ``build(params, inputs, ctx) -> BaseNode``.
        inputs: ``"none"`` (a source), ``"one"`` or ``"many"`` (fan-in, inputs named as a list).
        doc: one line for ``conveyor show`` and error hints; says whether the op is elastic
            and, where it is not, why.
        check: optional ``check(params, n_inputs) -> [(param, message)]`` for rules that
            span several params or the inputs; ``param`` may be a path into a param,
            ``("args", "size")`` or ``("weights", 3)``, to point at that key or item.
        length: ``length(params, input_counts, where, source_count) -> int | None``, the
            node's items per epoch for ``len(loader)`` (see graphs/length.py; ``where`` is a
            ``Where``, ``source_count()`` what the built source node counts). None (no rule),
            or a rule returning None, makes ``len()`` unknown.
        items_in: what the op reads, for the reference (``conveyor ops OP``, docs/ops.md).
        items_out: what it yields.
        example: one spec line using it, ``name: {op: ..., ...}``.
        elastic: for an op that can be resumed on another world size or number of worker
            copies, ``elastic(params, ctx, cursor) -> cursor``: from what was consumed of
            its output (a ``Cursor`` from ``conveyor/nodes/_elastic.py``), what was consumed
            of its input (see ``conveyor/graphs/elastic.py``); for the dealing op (``deal``),
            what the old slot took of the deal. None: the op cannot (its doc says why).
        unknown_length: why ``len(loader)`` cannot be known through this op, where its
            ``length`` is None or may return None ("drops the items its fn rejects").
        keeps_count: whether ranks that had equal counts still have after it (what ``shard``'s
            ``equalize`` needs to hold to the end): ``"always"``, ``"unless_skipping"``
            (unless its ``on_error`` is ``skip``) or ``"never"`` (it may change counts by
            the data: a reader, a filter, length buckets). See graphs/even.py.
        shards_itself: a source running the user's code, which may give each rank its own
            share with no shard in the graph (an IterableDataset reading RANK), so its
            counts may differ by rank.
        listing: a source that lists files or keys itself on every rank; the ranks compare
            their listings (graphs/listings.py).
        reads_from: the URLs or paths its params name as where it reads (a glob, a folder, a
            file); ``conveyor validate`` warns when a local one does not exist.
        batches: it makes lists of items (batch, bucket_batch): the default end of graph-level
            worker copies, and where ``conveyor check`` cuts the graph.
        collates: it stacks a batch (a list of samples) into one: a batching op must come
            before it.
        per_record: it hands on single records when it reads single records (a reader, a
            shard, a filter), so a collating op after it needs a batching op between; a
            callable decides from the params (map: when its fn declares ``per_sample``).
            False: it may hand on lists (a user's op).
        writes_rows: a map whose outputs may be written straight into the rows of a batch
            (``BuildContext.slab``) when it feeds a ``batch_rows`` op that feeds a
            ``stacks_rows`` op, all built together (graphs/compile.py ``slabbed_maps``).
        batch_rows: for an op that cuts batches of a fixed number of rows (batch):
            ``batch_rows(params) -> int``.
        stacks_rows: it stacks a batch whose rows a ``writes_rows`` map wrote into one
            batch-shaped slab, without a copy (collate).
        not_global: why its output, above a rank shard, is not one order shared by every
            rank (then that shard cannot deal again elastically); empty: it is.
        deal: for the op that deals its input out to ranks and worker copies (shard):
            ``deal(params) -> Deal``. Elastic resume stops at it; ``equalize`` looks below it.
        pass_through: it hands on every item as it is (only timing, memory or device change:
            prefetch, pin_memory, to_device); rules look through it.
        safe_params: the params whose change leaves the data exactly the same (speed or
            memory only), so a state loads under ``strict=True`` after they change. Empty
            (the default): every param counts as changing the data.
        safe_change: for a param whose change leaves the data the same only with some values
            of the others: ``safe_change(params, name, saved, now) -> bool`` (``params``: the
            node's now). Its docstring's first line says when, for the reference. An elastic
            resume still refuses such a change, whatever ``strict`` says: its cursors count
            items by the params of now (map's ``batch``: when its fn is ``batch_invariant``).
        graph_check: optional ``graph_check(graph, name) -> [Problem]``: rules across nodes
            (its fn's rules, what comes before it), given the checked ``SpecGraph``.

    Every callable given here must be a function defined at module level (no lambda): a
    plan travels to worker processes by pickle, its ops with it.
    """

    name: str
    params: type
    build: Callable[..., Any]
    inputs: Inputs = "one"
    doc: str = ""
    check: Callable[[Any, int], list[tuple[str, str]]] | None = None
    length: LengthRule | None = None
    items_in: str = ""
    items_out: str = ""
    example: str = ""
    elastic: Callable[[Any, Any, Any], Any] | None = None
    unknown_length: str = ""
    keeps_count: KeepsCount = "never"
    shards_itself: bool = False
    listing: bool = False
    reads_from: Callable[[Any], list[str]] | None = None
    batches: bool = False
    collates: bool = False
    per_record: bool | Callable[[Any], bool] = False
    writes_rows: bool = False
    batch_rows: Callable[[Any], int] | None = None
    stacks_rows: bool = False
    not_global: str = ""
    deal: Callable[[Any], Deal] | None = None
    pass_through: bool = False
    safe_params: frozenset[str] = frozenset()
    safe_change: Callable[[Any, str, Any, Any], bool] | None = None
    graph_check: GraphCheck | None = None

    def passes_records(self, params: Any) -> bool:
        """``per_record`` for these params."""
        rule = self.per_record
        return bool(rule(params)) if callable(rule) else bool(rule)

    def keeps_counts_with(self, params: Any) -> bool:
        """``keeps_count`` for these params (``on_error: skip`` drops what fails)."""
        if self.keeps_count == "unless_skipping":
            return not skips(params)
        return self.keeps_count == "always"


def param(default: Any = dataclasses.MISSING, *, min: float | None = None, max: float | None = None,
          doc: str = "", factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with validation metadata (``min``, ``max``: a bound checked with the
    spec, so that a huge value is a spec error naming the limit, not a hang at run time) and a doc line."""
    meta = {"min": min, "max": max, "doc": doc}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def skips(params: Any) -> bool:
    """Whether the params say ``on_error: skip`` (items that fail are dropped and counted)."""
    value = getattr(params, "on_error", "raise")
    return getattr(value, "value", value) == "skip"


# Ready-made length rules.
def same_count(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    """One item out per item in."""
    return n[0]


def count_unless_skipping(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    """One out per item in, unless ``on_error: skip`` drops what fails (then unknown)."""
    return None if skips(p) else n[0]


def listed_count(p: Any, n: list[int], where: Where, source: Callable[[], int | None]) -> int | None:
    """A source: what the built node counts (``count()``), else unknown."""
    return source()
