"""Even batches across ranks: which graphs need the ranks to agree, and what a cut epoch does
to the loader's state. The agreement itself runs under real torchrun in test_torchrun.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import conveyor.graphs.distributed as distributed_mod
from conveyor import SpecErrors, check_spec, load_graph
from conveyor.graphs.state import rank_states
from resume_check import fingerprint

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("spec, uneven", [
    ("numbers.yaml", []),            # shard, then only count-keeping nodes
    ("imagenet.yaml", []),           # fetch and map raise on errors: counts kept
    ("text.yaml", ["read", "batch"]),  # files sharded, records read after; token-budget buckets
    ("imagenet-shards.yaml", ["samples"]),  # tar shards expand into samples after the shard
])
def test_the_nodes_that_can_make_ranks_uneven_are_found(spec: str, uneven: list[str]) -> None:
    from conveyor.graphs.even import uneven_nodes

    assert uneven_nodes(check_spec(ROOT / "specs" / spec)) == uneven


def test_an_iterable_source_may_shard_itself_so_the_ranks_agree(tmp_path: Path) -> None:
    # a user's IterableDataset that reads RANK (or Hugging Face's split_dataset_by_node) gives
    # each rank its own count, with no shard in the graph: nothing made the ranks agree, and the
    # rank with more batches waited in DDP's all-reduce for ever (test_torchrun.py runs one)
    from conveyor.graphs.even import uneven_nodes

    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""\
        nodes:
          stream:  {op: iterable, iterable: "byo_fns:RankStream", args: {n: 9}}
          batch:   {op: batch, size: 2}
          collate: {op: collate}
        """))
    assert uneven_nodes(check_spec(path)) == ["stream"]


def test_skipping_errors_and_an_unequalized_shard_make_ranks_uneven(tmp_path: Path) -> None:
    from conveyor.graphs.even import uneven_nodes

    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""\
        nodes:
          files: {{op: list_files, url: "{ROOT}/examples/data/numbers/*/*.txt"}}
          pick:  {{op: filter, fn: "chain_fns:keep_two_of_three"}}   # before the shard: same on every rank
          shard: {{op: shard, by: [rank], equalize: "${{eq}}"}}
          parse: {{op: map, fn: "conveyor.files:read_numbers", on_error: "${{on_error}}"}}
          batch: {{op: batch, size: 4}}
        params: {{eq: repeat, on_error: raise}}
        """))
    assert uneven_nodes(check_spec(path)) == []
    assert uneven_nodes(check_spec(path, {"on_error": "skip"})) == ["parse"]
    assert uneven_nodes(check_spec(path, {"eq": "none"})) == ["shard"]


def test_even_batches_takes_three_values(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    body = (ROOT / "specs/numbers.yaml").read_text()
    path.write_text("even_batches: sometimes\n" + body)
    with pytest.raises(SpecErrors, match="even_batches must be one of auto | always | never, got 'sometimes'"):
        check_spec(path)
    path.write_text("even_batches: always\n" + body)
    assert check_spec(path).even_batches == "always"


class _StopAfter:
    """Stands for the other ranks: they have batches for ``n`` steps, then none."""

    active = True

    def __init__(self, n: int):
        self.n = n

    def all_have(self, have: bool) -> bool:
        self.n -= 1
        return have and self.n >= 0


def test_an_epoch_cut_by_the_other_ranks_resumes_at_the_next_epoch(monkeypatch) -> None:
    spec = ROOT / "specs/numbers.yaml"
    with load_graph(spec, batch_size=4) as plain:
        reference = [[fingerprint(b) for b in plain] for _ in range(2)]
    assert len(reference[0]) == 10
    monkeypatch.setattr(distributed_mod, "agreement_for", lambda plan, world: _StopAfter(3))
    with load_graph(spec, batch_size=4) as cut:
        first = [fingerprint(b) for b in cut]
        state = cut.state_dict()
        stats = cut.stats()["even_batches"]
    assert first == reference[0][:3]  # the other ranks ran out after 3: so does this one
    assert rank_states(state)[0]["cut"] is True and rank_states(state)[0]["yielded"] == 3
    assert stats == {"agreeing": True, "epochs_cut": 1, "this_epoch_cut": True}
    monkeypatch.setattr(distributed_mod, "agreement_for", lambda plan, world: None)
    with load_graph(spec, batch_size=4) as resumed:
        resumed.load_state_dict(state)
        after = [fingerprint(b) for b in resumed]
        assert resumed.epoch == 1
    assert after == reference[1]  # the whole next epoch, not the cut one's unread rest


def test_a_rank_that_runs_out_first_is_not_counted_as_cut(monkeypatch) -> None:
    monkeypatch.setattr(distributed_mod, "agreement_for", lambda plan, world: _StopAfter(100))
    with load_graph(ROOT / "specs/numbers.yaml", batch_size=4) as loader:
        assert sum(1 for _ in loader) == 10
        assert loader.stats()["even_batches"]["epochs_cut"] == 0
        assert rank_states(loader.state_dict())[0]["cut"] is False


def test_show_says_when_the_ranks_agree() -> None:
    from conveyor.tools.show import show_text

    text = show_text(check_spec(ROOT / "specs/text.yaml"))
    assert "ranks: agree on each epoch's last batch under torch.distributed (read, batch can give" in text
    assert "ranks:" not in show_text(check_spec(ROOT / "specs/numbers.yaml"))


def test_without_a_process_group_the_ranks_cannot_agree_and_it_is_said_once(caplog) -> None:
    from conveyor.graphs.even import Agreement

    agree = Agreement("spec.yaml", ["read", "batch"])
    with caplog.at_level("WARNING", logger="conveyor.graphs.even"):
        assert agree.all_have(True) is True and agree.all_have(False) is False  # batches pass
        agree.all_have(True)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "torch.distributed is not initialised" in warned[0]
    assert "nodes read, batch can give them different counts" in warned[0]
    assert agree.active is False


def test_the_listings_the_ranks_compare_are_those_a_rank_shard_deals(tmp_path: Path) -> None:
    from conveyor.graphs.listings import listings_to_check
    from conveyor.nodes.list_files import ListFiles

    assert listings_to_check(check_spec(ROOT / "specs/numbers.yaml")) == ["files"]
    assert listings_to_check(check_spec(ROOT / "specs/imagenet-procs.yaml")) == ["files"]
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""\
        nodes:
          files: {{op: list_files, url: "{ROOT}/examples/data/numbers/*/*.txt"}}
          parse: {{op: map, fn: "conveyor.files:read_numbers"}}
        """))
    assert listings_to_check(check_spec(path)) == []  # no rank shard: each rank reads its own on purpose
    with load_graph(ROOT / "specs/numbers.yaml", batch_size=4) as loader:
        next(iter(loader))
        assert ListFiles.listings_in(rank_states(loader.state_dict())[0]["graph"]) == [(40, "8af054f968f8bc62")]
