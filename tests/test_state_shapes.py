"""A state that breaks exactly-once is refused (issue 32 item 4).

- The graph's seed param is part of what a state must fit: a state taken with ``seed=1`` is
  refused under ``strict=True`` by a ``seed=0`` loader (it loaded silently, and the rest of the
  epoch followed seed 0's order: items repeated, others never seen).
- Every state is checked against the shape its nodes declare (``nodes/state_shape.py``)
  before anything is restored: a malformed one is a ``StateError`` naming the key path and the
  value, never repeated or missing items or a raw ``KeyError``/``TypeError`` deep inside.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_node_contract as contract
from conveyor import load_graph
from conveyor.errors import StateError
from conveyor.nodes import check_state
from resume_check import fingerprint

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = ROOT / "specs" / "numbers.yaml"
STEP = 3  # batches taken before the state (of 10 in an epoch at batch_size 4)


def _run(seed: int, state: dict | None = None, strict: bool = True) -> tuple[dict, list]:
    """(the state after STEP batches, the rest of the epoch) of numbers.yaml, or, given a state,
    ({}, the epoch's rest after it)."""
    with load_graph(NUMBERS, batch_size=4, seed=seed, workers=1) as loader:
        if state is not None:
            loader.load_state_dict(state, strict=strict)
            return {}, [fingerprint(b) for b in loader]
        it = iter(loader)
        for _ in range(STEP):
            next(it)
        taken = loader.state_dict()
        return taken, [fingerprint(b) for b in it]


@pytest.fixture(scope="module")
def saved() -> tuple[dict, list]:
    return _run(seed=0)


def _rank(state: dict) -> dict:
    return json.loads(state["rank0"])


def _with(state: dict, rank: dict) -> dict:
    return {**state, "rank0": json.dumps(rank)}


def _holding(tree: Any, key: str) -> dict:
    """The first dict in ``tree`` (depth first) that holds ``key``."""
    if isinstance(tree, dict):
        if key in tree:
            return tree
        for v in tree.values():
            got = _holding(v, key)
            if got is not None:
                return got
    return None  # type: ignore[return-value]


# ----- the seed ------------------------------------------------------------------------

def test_a_state_of_another_seed_is_refused_under_strict_and_named() -> None:
    state, _ = _run(seed=1)
    with pytest.raises(StateError, match=r"seed.*saved 1, now 0"):
        _run(seed=0, state=state)


def test_a_state_of_another_seed_loads_with_strict_false_and_a_warning(caplog) -> None:
    state, rest_of_seed1 = _run(seed=1)
    _, rest = _run(seed=0, state=state, strict=False)
    assert any("seed" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert len(rest) == len(rest_of_seed1)


def test_a_state_of_the_same_seed_still_resumes_exactly(saved) -> None:
    state, rest = saved
    assert _run(seed=0, state=state)[1] == rest


def test_a_state_from_before_the_seed_was_recorded_loads() -> None:
    state, rest = _run(seed=0)
    rank = _rank(state)
    del rank["seed"]
    assert _run(seed=0, state=_with(state, rank))[1] == rest


# ----- malformed states ----------------------------------------------------------------

RANK_KEYS = ("graph", "epoch", "world", "rank", "yielded", "cut")


def _in(rank: dict, key: str) -> dict:
    """The dict holding ``key``: the rank state for its own keys, else a node's in the graph."""
    return rank if key in RANK_KEYS else _holding(rank["graph"], key)


def _set(key: str, value: Any, holder: str | None = None) -> Callable[[dict], None]:
    def mutate(rank: dict) -> None:
        _in(rank, holder or key)[key] = value
    return mutate


def _drop(key: str) -> Callable[[dict], None]:
    def mutate(rank: dict) -> None:
        del _in(rank, key)[key]
    return mutate


# (mutation of the rank state, what the message must name: key path, value)
MALFORMED: dict[str, tuple[Callable[[dict], None], str]] = {
    "graph null": (_set("graph", None), "rank0 > graph: expected a dict"),
    "graph a list": (_set("graph", [1, 2]), "rank0 > graph: expected"),
    "epoch -1": (_set("epoch", -1), "rank0 > epoch: expected an int >= 0, got -1"),
    "epoch 1.5": (_set("epoch", 1.5), "rank0 > epoch: expected an int >= 0, got 1.5"),
    "epoch true": (_set("epoch", True), "rank0 > epoch: expected an int >= 0, got True"),
    "epoch NaN": (_set("epoch", math.nan), "rank0 > epoch: expected an int >= 0, got nan"),
    "world a string": (_set("world", "1"), "rank0 > world: expected an int >= 1, got '1'"),
    "world 0": (_set("world", 0), "rank0 > world: expected an int >= 1, got 0"),
    "rank past world": (_set("rank", 3), "rank0 > rank: expected a rank < world (1), got 3"),
    "yielded -2": (_set("yielded", -2), "rank0 > yielded: expected an int >= 0, got -2"),
    "cut 1": (_set("cut", 1), "rank0 > cut: expected true or false, got 1"),
    "yielded missing": (_drop("yielded"), "rank0: expected the key 'yielded' (missing)"),
    "unknown rank key": (_set("extra", 1, holder="epoch"), "rank0 > extra: expected no such key"),
    "window pos -1": (_set("pos", -1, holder="window"), "rank0 > graph > shuffle > pos: expected an int >= 0, got -1"),
    "window pos past the window": (_set("pos", 17, holder="window"),
                                   "rank0 > graph > shuffle > pos: expected an int <= size (16), got 17"),
    "window a string": (_set("window", "0"), "rank0 > graph > shuffle > window: expected an int >= 0, got '0'"),
    "window key missing": (_drop("window"), "rank0 > graph > shuffle: expected the key 'window' (missing)"),
    "shard pos 1.5": (_set("pos", 1.5, holder="wrapped"), "rank0 > graph > shard > pos: expected an int >= 0, got 1.5"),
    "shard wrapped null": (_set("wrapped", None), "rank0 > graph > shard > wrapped: expected true or false, got None"),
    "shard source null": (_set("source", None, holder="wrapped"), "rank0 > graph > files: expected a dict"),
    "listing pos past count": (_set("pos", 41, holder="digest"),
                               "rank0 > graph > files > pos: expected an int <= count (40), got 41"),
    "listing digest int": (_set("digest", 7), "rank0 > graph > files > digest: expected a string, got 7"),
    "map skip -1": (_set("skip", -1), "rank0 > graph > parse > skip: expected an int >= 0, got -1"),
    "ledger garbage": (_set("ledger", "x"), "rank0 > graph > parse > ledger: expected a dict"),
    "prefetch steps 1.5": (_set("steps_since_snapshot", 1.5),
                           "rank0 > graph > out > it > steps_since_snapshot: expected an int >= 0, got 1.5"),
    "prefetch snapshot garbage": (_set("snapshot", {"junk": 1}), "rank0 > graph > collate > junk: expected no such key"),
    "nested unknown key": (_set("extra", {"a": [1]}, holder="window"), "rank0 > graph > shuffle > extra: expected no such key"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_state_is_a_state_error_naming_the_key_and_the_value(saved, name: str) -> None:
    mutate, message = MALFORMED[name]
    state, _ = saved
    rank = _rank(state)
    mutate(rank)
    with pytest.raises(StateError) as err:
        _run(seed=0, state=_with(state, rank))
    assert message in str(err.value)


@pytest.mark.parametrize("outer", [{"format": 2.0, "rank0": "{}"}, {"format": "2"}, {"format": None},
                                   {"format": 2, "rank0": "[1]"}, {"format": 2, "rank0": 5}])
def test_a_malformed_outer_state_is_a_state_error(outer: dict) -> None:
    with load_graph(NUMBERS, batch_size=4, workers=1) as loader, pytest.raises(StateError):
        loader.load_state_dict(outer)


def test_the_fixture_states_fit_the_shapes() -> None:
    from conveyor.graphs.state import check_rank_state

    for path in sorted((ROOT / "tests" / "fixtures" / "states").glob("*[!t].json")):
        state = json.loads(path.read_text())
        for key, value in state.items():
            if key.startswith("rank"):
                check_rank_state(json.loads(value), key)


# ----- every node's shape holds every state it writes ------------------------------------

@pytest.mark.parametrize("name", sorted(contract.CHAINS))
def test_every_state_a_node_writes_fits_its_declared_shape(name: str) -> None:
    root = contract.CHAINS[name]()
    try:
        states: list = []
        contract._epoch(root, 0, states=states)
        for s in states:
            check_state(root, s)
        undeclared = [type(n).__name__ for n in contract._nodes(root)
                      if type(n).__module__.startswith("conveyor.") and not hasattr(type(n), "STATE_SHAPE")]
        assert undeclared == []
    finally:
        contract._close(root)


def test_the_message_names_a_plain_node_by_its_class() -> None:
    root = contract.CHAINS["shuffle_buffer"]()
    try:
        root.reset()
        state = root.state_dict()
        state["pos"] = -1
        with pytest.raises(StateError, match=r"state ShuffleBuffer > pos: expected an int >= 0, got -1"):
            check_state(root, state)
    finally:
        contract._close(root)


# ----- mutated real states: refused, or resumed exactly -----------------------------------

def _paths(tree: Any, at: tuple = ()) -> list[tuple]:
    out = [at]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += _paths(v, at + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _paths(v, at + (i,))
    return out


def _garbage(value: Any) -> st.SearchStrategy:
    """Values that do not fit where ``value`` stood: another type, or a negative count (a
    value of the right type and bounds is another position, which no shape can tell)."""
    others = [st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3),
              st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1)]
    kinds = {bool: 1, float: 2, str: 3, list: 4, dict: 5}
    if isinstance(value, bool):
        others.pop(kinds[bool])
        others.append(st.integers(0, 1))
    elif isinstance(value, int):
        others.append(st.integers(-5, -1))
        others.append(st.floats(0, 50).filter(lambda f: not f.is_integer()))
    elif value is not None and type(value) in kinds:
        others.pop(kinds[type(value)])
        others.append(st.integers(0, 3))
    if value is None:
        others.pop(0)
    return st.one_of(others)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_state_is_refused_or_resumes_exactly(saved, data) -> None:
    state, rest = saved
    rank = _rank(state)
    paths = [p for p in _paths(rank) if p and p[0] not in ("digest", "spec")]  # those are compared
    path = data.draw(st.sampled_from(paths))
    holder = rank
    for k in path[:-1]:
        holder = holder[k]
    how = data.draw(st.sampled_from(["set", "drop", "add"]))
    if how == "drop" and isinstance(holder, dict):
        del holder[path[-1]]
    elif how == "add" and isinstance(holder, dict):
        holder[data.draw(st.text(min_size=1, max_size=3).filter(lambda k: k not in holder))] = 0
    else:
        holder[path[-1]] = data.draw(_garbage(holder[path[-1]]))
    try:
        _, got = _run(seed=0, state=_with(state, rank))
    except StateError:
        return
    assert got == rest


def _copies_state(tmp_path: Path, method: str) -> tuple[Path, dict]:
    """A spec of two worker copies (``method``) and its state after 3 batches, round-tripped."""
    spec = tmp_path / "copies.yaml"
    spec.write_text(f"""workers: {{copies: 2, method: {method}, until: batch, mp_context: forkserver}}
nodes:
  files: {{op: list_files, url: "{ROOT}/examples/data/numbers/*/*.txt"}}
  shard: {{op: shard, by: [rank, worker]}}
  shuffle: {{op: shuffle_buffer, size: 8}}
  parse: {{op: map, fn: "conveyor.files:read_numbers"}}
  batch: {{op: batch, size: 2}}
output: batch
""")
    return spec, _spec_state(spec, 3)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_worker_copy_checks_its_own_state_before_its_reset(tmp_path: Path, method: str) -> None:
    # a copy's graph is built in the copy, so its base state is checked there, named as such
    spec, state = _copies_state(tmp_path, method)
    rank = _rank(state)
    base = rank["graph"]["copies"][0]["base"]
    _holding(base, "pos")["pos"] = -1
    with load_graph(spec) as loader:
        with pytest.raises(StateError, match=r"worker copy > base > .*-1"):
            loader.load_state_dict(_with(state, rank))
            next(iter(loader))


def test_a_copies_turn_past_the_copies_is_a_state_error(tmp_path: Path) -> None:
    # the copy whose batch comes next: a number past the copies was an IndexError in next()
    spec, state = _copies_state(tmp_path, "thread")
    rank = _rank(state)
    _holding(rank["graph"], "next")["next"] = 2
    with load_graph(spec) as loader:
        with pytest.raises(StateError, match=r"> next: expected an int < copies \(2\), got 2"):
            loader.load_state_dict(_with(state, rank))
            next(iter(loader))


# ----- the bucketing, packing and synthetic graphs' own lists and counters ------------------

TEXT, PRETRAIN, SYNTHETIC = (ROOT / "specs" / name for name in ("text.yaml", "pretrain.yaml", "synthetic.yaml"))


def _spec_state(spec: Path, steps: int, **params: Any) -> dict:
    with load_graph(spec, **params) as loader:
        it = iter(loader)
        for _ in range(steps):
            next(it)
        return json.loads(json.dumps(loader.state_dict()))


@pytest.fixture(scope="module")
def spec_states() -> dict[str, dict]:
    return {"text": _spec_state(TEXT, 3), "pretrain": _spec_state(PRETRAIN, 3),
            "synthetic": _spec_state(SYNTHETIC, 2, count=64, image_size=8, batch_size=4)}


def _bucket(rank: dict) -> dict:
    return _holding(rank["graph"], "boundaries")


def _pack(rank: dict) -> dict:
    return _holding(rank["graph"], "settings")


def _replay_short(rank: dict) -> None:  # more items of a bucket emitted than its replay holds
    b = _bucket(rank)
    b["done"][-1] = b["replay"] + 1


# (spec, mutation, what the message must name): each was a raw KeyError, IndexError or
# TypeError deep in the node, or a ValueError, before the shapes and checks said what is wrong
SPEC_MALFORMED: dict[str, tuple[str, Callable[[dict], None], str]] = {
    "pack stats empty": ("pretrain", lambda r: _pack(r).update(stats={}),
                         "rank0 > graph > pack > stats: expected the key 'real' (missing)"),
    "pack stats a list": ("pretrain", lambda r: _pack(r)["stats"].update(real=[1]),
                          "rank0 > graph > pack > stats > real: expected an int >= 0, got [1]"),
    "pack min_real -2": ("pretrain", lambda r: _pack(r)["stats"].update(min_real=-2),
                         "rank0 > graph > pack > stats > min_real: expected an int >= -1, got -2"),
    "bucket stats empty": ("text", lambda r: _bucket(r).update(stats={}),
                           "rank0 > graph > batch > stats: expected the key 'real' (missing)"),
    "bucket stats' batches an int": ("text", lambda r: _bucket(r)["stats"].update(batches=-1),
                                     "rank0 > graph > batch > stats > batches: expected a list"),
    "bucket stats' batches short": ("text", lambda r: _bucket(r)["stats"].update(batches=[]),
                                    "the state's stats' batches has 0 entries, its boundaries make 10 buckets"),
    "bucket done short": ("text", lambda r: _bucket(r).update(done=[0]),
                          "the state's done has 1 entries, its boundaries make 10 buckets"),
    "bucket boundaries empty": ("text", lambda r: _bucket(r).update(boundaries=[]),
                                "the state's boundaries [] are not a non-empty list of increasing lengths"),
    "bucket boundaries down": ("text", lambda r: _bucket(r).update(boundaries=[64, 32] + _bucket(r)["boundaries"][2:]),
                               "are not a non-empty list of increasing lengths"),
    "bucket boundaries a float": ("text", lambda r: _bucket(r)["boundaries"].__setitem__(0, 31.5),
                                  "rank0 > graph > batch > boundaries > 0: expected an int >= 1, got 31.5"),
    "bucket emitting past the buckets": ("text", lambda r: _bucket(r).update(emitting=10),
                                         "the state emits the pool of bucket 10, of 10 buckets"),
    "bucket done past its replay": ("text", _replay_short, "its replay of"),
    "bucket out_pos past the pool": ("text", lambda r: _bucket(r).update(out_pos=10 ** 6),
                                     "the state is at batch 1000000 of a pool that now cuts into"),
    "prefetch steps past the input": ("text", _set("steps_since_snapshot", 10 ** 6),
                                      "prefetch: the state says 1000000 items were emitted after its snapshot"),
    "synthetic pos past count": ("synthetic", lambda r: _holding(r["graph"], "count").update(pos=65),
                                 "rank0 > graph > fake > pos: expected an int <= count (64), got 65"),
    "synthetic count missing": ("synthetic", lambda r: _holding(r["graph"], "count").pop("count"),
                                "rank0 > graph > fake: expected the key 'count' (missing)"),
    "shard pos past the listing": ("text", lambda r: _holding(r["graph"], "wrapped").update(pos=5),
                                   "shard: the state is at position 5 of an input whose epoch deals 4 positions"),
}


@pytest.mark.parametrize("name", sorted(SPEC_MALFORMED))
def test_a_malformed_state_of_the_text_packing_or_synthetic_graph_is_a_state_error(spec_states, name: str) -> None:
    which, mutate, message = SPEC_MALFORMED[name]
    state = copy.deepcopy(spec_states[which])
    rank = _rank(state)
    if name == "bucket out_pos past the pool":  # only a state taken while a pool is emitted has one to check
        assert _bucket(rank)["emitting"] >= 0
    mutate(rank)
    spec = {"text": TEXT, "pretrain": PRETRAIN, "synthetic": SYNTHETIC}[which]
    params = {"count": 64, "image_size": 8, "batch_size": 4} if which == "synthetic" else {}
    with load_graph(spec, **params) as loader:
        with pytest.raises(StateError) as err:
            loader.load_state_dict(_with(state, rank))
            next(iter(loader))
    assert message in str(err.value)


@pytest.mark.parametrize("which", ["text", "pretrain"])
def test_the_unmutated_states_of_those_graphs_still_resume(spec_states, which: str) -> None:
    spec = TEXT if which == "text" else PRETRAIN
    with load_graph(spec) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        rest = [fingerprint(b) for b in it]
    with load_graph(spec) as loader:
        loader.load_state_dict(spec_states[which])
        assert [fingerprint(b) for b in loader] == rest

