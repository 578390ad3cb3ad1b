"""What trainers need from a loader: states torch.load reads, len(), epochs, peek(), safe
spec changes, rank-keyed states, torch.profiler ranges, `conveyor show --batch` (issue 14)."""

from __future__ import annotations

import json
import re
import logging
from pathlib import Path

import pytest
import torch

from conveyor import ConveyorError, StateError, load_graph
from conveyor.graphs.state import rank_states
from conveyor.tools.cli import main as cli_main
from resume_check import fingerprint

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
NUMBERS = ROOT / "specs/numbers.yaml"
SMALL = {
    "imagenet.yaml": {"batch_size": 16, "image_size": 32},
    "imagenet-procs.yaml": {"batch_size": 16, "image_size": 32},
    "imagenet-eval.yaml": {"batch_size": 16, "image_size": 32, "resize": 40},
    "imagenet-shards.yaml": {"batch_size": 16, "image_size": 32, "shuffle_window": 8},
    "numbers.yaml": {"batch_size": 3},
}
UNKNOWN_LENGTH = {"balanced.yaml": "node 'mixed' (mix)", "text.yaml": "node 'read' (read_jsonl)",
                  "imagenet-shards.yaml": "node 'samples' (read_tar)", "pretrain.yaml": "node 'read' (read_jsonl)"}
PLAIN = {dict, list, str, int, float, bool, type(None)}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from conveyor.pack import pack

    out = tmp_path_factory.mktemp("shards") / "train"
    pack(str(ROOT / "examples/data/imagenet-sample/train"), str(out), shard_size="1MB")
    return out


def _forked(spec: Path, tmp_path: Path) -> Path:
    """A copy of ``spec`` (same name) whose worker copies start from the fork server (conftest.py), not spawned."""
    text = spec.read_text()
    assert text.count("method: process,") == 1
    copy = tmp_path / spec.name
    copy.write_text(text.replace("method: process,", "method: process, mp_context: forkserver,"))
    return copy


def _plain_types(obj, where="state"):
    assert type(obj) in PLAIN, f"{where} is a {type(obj).__name__}"
    if type(obj) is dict:
        for k, v in obj.items():
            assert type(k) is str, f"{where} has a key of type {type(k).__name__}"
            _plain_types(v, f"{where}[{k!r}]")
    elif type(obj) is list:
        for i, v in enumerate(obj):
            _plain_types(v, f"{where}[{i}]")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec", SPECS, ids=[p.name for p in SPECS])
def test_every_spec_state_loads_with_plain_torch_load_and_len_is_exact(spec, shards, tmp_path):
    params = dict(SMALL.get(spec.name, {}))
    if spec.name == "imagenet-shards.yaml":
        params["root"] = str(shards)
    if spec.name == "imagenet-procs.yaml":  # fork server: what it saves does not depend on how its
        spec = _forked(spec, tmp_path)      # processes start (spawn took ~14 s on a busy host)
        params["root"] = str(ROOT / "examples/data/imagenet-sample/train")
    with load_graph(spec, **params) as loader:
        if spec.name in UNKNOWN_LENGTH:
            with pytest.raises(TypeError, match=re.escape(UNKNOWN_LENGTH[spec.name])):
                len(loader)
            length = None
        else:
            length = len(loader)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        rest = [fingerprint(b) for b in it]
        if length is not None:
            assert 1 + len(rest) == length == len(loader)  # the current epoch, then the coming one
            assert sum(1 for _ in loader) == length
    torch.save({"data": state}, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt")["data"]  # torch's defaults: weights_only=True
    _plain_types(loaded)
    for own in rank_states(loaded).values():
        _plain_types(own)  # the rank's own state too, not only its JSON
        for node in own["spec"].values():
            _plain_types(node["params"])
    if spec.name == "imagenet-procs.yaml":
        return  # its processes take seconds to start; test_resume.py restores it at many steps
    with load_graph(spec, **params) as fresh:
        fresh.load_state_dict(loaded)
        assert fingerprint(next(iter(fresh))) == rest[0]


def _rooted(text: str) -> str:
    """A copy of numbers.yaml that reads the bundled data from anywhere."""
    return re.sub(r"(?m)^  root: .*$", f"  root: {ROOT}/examples/data/numbers", text)


def _numbers_spec(tmp_path: Path, equalize: str, drop_last: bool) -> Path:
    text = NUMBERS.read_text().replace("{op: shard, by: [rank]}", f"{{op: shard, by: [rank], equalize: {equalize}}}")
    text = text.replace("drop_last: false", f"drop_last: {str(drop_last).lower()}")
    text = _rooted(text)
    path = tmp_path / f"numbers-{equalize}-{drop_last}.yaml"
    path.write_text(text)
    return path


@pytest.mark.timeout(120)
def test_len_follows_shard_equalize_and_drop_last_on_every_rank(tmp_path, monkeypatch):
    cases = [(1, "repeat", False), (1, "none", True)] + [(3, eq, dl) for eq, dl in
                                                          [("repeat", False), ("drop", True), ("none", False)]]
    seen = set()
    for world, equalize, drop_last in cases:
        spec = _numbers_spec(tmp_path, equalize, drop_last)
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            with load_graph(spec, batch_size=3) as loader:
                n = len(loader)
                assert sum(1 for _ in loader) == n, (world, rank, equalize, drop_last)
                seen.add(n)
    assert len(seen) >= 3  # 40 items: 14, 13, 5, 4 ... batches: the cases really differ
    copies = _rooted(NUMBERS.read_text()).replace("nodes:", "workers: {copies: 3, method: thread, until: batch}\nnodes:")
    copies = copies.replace("{op: shard, by: [rank]}", "{op: shard, by: [rank, worker]}")
    path = tmp_path / "copies.yaml"
    path.write_text(copies)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with load_graph(path, batch_size=3) as loader:
        # rank 1 gets 14 of 40 items, its copies 5, 5 and 4; each cuts its own batches: 2 + 2 + 2
        assert len(loader) == 6 == sum(1 for _ in loader)


def test_len_refuses_where_the_data_decide_and_list_still_works(write_spec):
    spec = write_spec(_rooted(NUMBERS.read_text()).replace(
        "  shuffle: {op: shuffle_buffer, size: 16}",
        "  keep:    {op: filter, fn: 'chain_fns:fewer_on_odd_ranks'}\n  shuffle: {op: shuffle_buffer, size: 16}"
    ))
    with load_graph(spec) as loader:
        with pytest.raises(TypeError, match=r"node 'keep' \(filter\) drops the items its fn rejects"):
            len(loader)
        assert bool(loader) is True
        assert len(list(loader)) > 0  # list() asks len() and goes on without it


def _ids(loader_or_it) -> list[list[int]]:
    return [b["index"].tolist() for b in loader_or_it]


def test_epoch_after_load_and_set_epoch_start_where_they_say():
    with load_graph(NUMBERS, batch_size=8) as ref:
        epochs = [_ids(ref) for _ in range(4)]
    with load_graph(NUMBERS, batch_size=8) as loader:
        it = iter(loader)
        for _ in range(2):
            next(it)
        mid = loader.state_dict()
        list(it)
        end = loader.state_dict()
    with load_graph(NUMBERS, batch_size=8) as fresh:
        assert fresh.epoch == -1
        fresh.load_state_dict(mid)
        assert fresh.epoch == 0
        fresh.set_epoch(0)  # the epoch it is about to iterate anyway: the position stays
        assert _ids(fresh) == epochs[0][2:]
        fresh.load_state_dict(end)
        assert fresh.epoch == 1  # taken after the last batch: resumes at the next epoch
        fresh.set_epoch(3)
        assert fresh.epoch == 3
        assert _ids(fresh) == epochs[3]  # shuffled as epoch 3
    with pytest.raises(ValueError, match="epoch=-1"):
        load_graph(NUMBERS).set_epoch(-1)


def test_restored_iterator_dropped_before_its_first_batch_leaves_nothing_behind():
    # issue 13 item 8: the batch read ahead by the restore must not leak into a later epoch
    with load_graph(NUMBERS, batch_size=8) as ref:
        it = iter(ref)
        next(it), next(it)
        state = ref.state_dict()
        rest0 = _ids(it)
        epoch1 = _ids(ref)
    with load_graph(NUMBERS, batch_size=8) as f:
        f.load_state_dict(state)
        it = iter(f)
        list(zip(range(0), it))
        assert _ids(f) == rest0  # nothing was taken since the restore: that epoch goes on
        assert _ids(f) == epoch1
        assert rank_states(f.state_dict())[0]["epoch"] == 1
    with load_graph(NUMBERS, batch_size=8) as f:
        f.load_state_dict(state)
        it = iter(f)
        next(it)
        assert _ids(f) == epoch1  # a batch was taken: a new iter() is the next epoch, no leftover
        assert rank_states(f.state_dict())[0]["yielded"] == 5


def test_peek_takes_nothing_and_says_when_there_is_nothing(caplog):
    with load_graph(NUMBERS, batch_size=8) as ref:
        epochs = [_ids(ref) for _ in range(2)]
    with load_graph(NUMBERS, batch_size=8) as loader:
        before = loader.state_dict()
        assert loader.peek()["index"].tolist() == epochs[0][0]
        assert loader.peek()["index"].tolist() == epochs[0][0]
        assert loader.state_dict() == before
        it = iter(loader)
        assert next(it)["index"].tolist() == epochs[0][0]
        state = loader.state_dict()
        assert loader.peek()["index"].tolist() == epochs[0][1]
        assert loader.state_dict() == state
        assert _ids(it) == epochs[0][1:]
        assert loader.peek()["index"].tolist() == epochs[1][0]  # between epochs: the next one's first
        assert _ids(loader) == epochs[1]
        it = iter(loader)
        for _ in range(5):
            next(it)
        with pytest.raises(ConveyorError, match="epoch 2 has no batch left after 5"):
            loader.peek()
        with pytest.raises(StopIteration):
            next(it)
    with pytest.raises(RuntimeError, match="closed"):
        loader.peek()
    with load_graph(NUMBERS, batch_size=8) as loader:
        with caplog.at_level(logging.WARNING, logger="conveyor.graphs.epochs"):
            for _ in range(3):
                it = iter(loader)
                next(it)
        left = [r for r in caplog.records if "is left after 1 batch(es) with more to come" in r.getMessage()]
        assert len(left) == 1  # said once


def test_safe_param_changes_load_under_strict_and_data_changes_do_not(caplog):
    with load_graph(NUMBERS, batch_size=8) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        rest = _ids(it)
    with load_graph(NUMBERS, batch_size=8, workers=0) as other:  # inline map: same data
        with caplog.at_level(logging.INFO, logger="conveyor.graphs.state"):
            other.load_state_dict(state)
        assert _ids(other) == rest
    assert any("param 'workers': saved 2, now 0 (safe" in r.getMessage() for r in caplog.records)
    with load_graph(NUMBERS, batch_size=4, workers=0) as other:
        with pytest.raises(StateError) as info:
            other.load_state_dict(state)
    assert "node 'batch' param 'size': saved 8, now 4" in str(info.value)
    assert "workers" not in str(info.value)  # only what breaks exactness is named


def test_states_are_keyed_by_rank_and_each_rank_takes_its_own(monkeypatch):
    states, rests = {}, {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        with load_graph(NUMBERS, batch_size=4) as loader:
            it = iter(loader)
            next(it)
            states[rank] = loader.state_dict()
            rests[rank] = _ids(it)
        assert set(states[rank]) == {"format", f"rank{rank}"}
    merged = json.loads(json.dumps({**states[0], **states[1]}))
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        with load_graph(NUMBERS, batch_size=4) as loader:
            loader.load_state_dict(merged)
            assert _ids(loader) == rests[rank]
            with pytest.raises(StateError, match=f"saved by rank {1 - rank} of world 2, this is rank {rank}"):
                loader.load_state_dict(states[1 - rank])  # another rank's own state
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with load_graph(NUMBERS, batch_size=4) as loader:
        with pytest.raises(StateError, match=r"rank 0 of world 2, this is rank 2 of world 3.*every rank"):
            loader.load_state_dict(states[0])  # not every rank's: no elastic resume
        loader.load_state_dict(merged)  # every rank's: the epoch goes on, on 3 ranks (test_elastic.py)
        assert loader.epoch == 0


def test_a_state_of_another_world_says_how_to_read_every_ranks_from_dcp(monkeypatch):
    # dcp.load({"data": loader}) on 2 ranks of a 3-rank checkpoint gives each rank one old entry:
    # the error said to load every rank's states, not that conveyor.dcp_states reads them
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with load_graph(NUMBERS, batch_size=4) as loader:
        state = loader.state_dict()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with load_graph(NUMBERS, batch_size=4) as loader:
        with pytest.raises(StateError, match=r"rank 0 of world 3, this is rank 0 of world 2.*conveyor\.dcp_states"):
            loader.load_state_dict(state)
        rank0 = loader.state_dict()
    monkeypatch.setenv("RANK", "1")  # rank 0's entry only, on rank 1 of the same world: a Lightning checkpoint
    with load_graph(NUMBERS, batch_size=4) as loader:
        with pytest.raises(StateError, match=r"rank 0 of world 2, this is rank 1 of world 2.*ExactResume"):
            loader.load_state_dict(rank0)


def test_profiler_shows_a_range_per_node():
    from torch.profiler import ProfilerActivity, profile

    with load_graph(NUMBERS, batch_size=4) as loader:
        it = iter(loader)
        next(it)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            next(it)
        assert "conveyor/out" in {e.key for e in prof.key_averages()}  # the training thread's wait
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
            for _ in range(3):
                next(it)
        names = {e.key for e in prof.key_averages()}
    # the nodes in the prefetch thread too; files/shard/shuffle may have nothing to do in 3 batches
    assert {"conveyor/out", "conveyor/collate", "conveyor/batch", "conveyor/parse"} <= names, names


def test_show_batch_prints_the_first_batch_structure(capsys):
    assert cli_main(["show", str(NUMBERS), "--batch", "--set", "batch_size=4"]) == 0
    out = capsys.readouterr().out
    assert "first batch of epoch 0 (10 batches per epoch on this rank):" in out
    assert "  x  tensor float32 [4, 4]  min " in out and "  index  tensor int64 [4]  min " in out


def test_len_of_a_map_style_dataset_source_with_an_explicit_shard(write_spec):
    spec = write_spec("nodes:\n"
                      "  samples: {op: dataset, dataset: 'byo_fns:Squares', args: {n: 22}, sampler: shuffle}\n"
                      "  shard:   {op: shard, rank: 1, world: 3, equalize: drop}\n"
                      "  load:    {op: map, fn: conveyor.dataset:getitem}\n"
                      "  batch:   {op: batch, size: 4}\n"
                      "  collate: {op: collate}\n")
    with load_graph(spec) as loader:
        assert len(loader) == 2 == sum(1 for _ in loader)  # 22 -> 7 per rank (drop) -> 2 batches


@pytest.mark.timeout(30)
def test_a_loader_refuses_pickle_and_copy_saying_what_to_do_instead():
    # a LightningModule holding the loader under strategy="ddp_spawn", or mp.spawn(train,
    # args=(loader,)), pickles it: the error was "cannot pickle '_thread.lock' object"; a
    # copy.copy shared the running nodes of the original between two loaders
    import copy
    import pickle

    with load_graph(NUMBERS, batch_size=4) as loader:
        for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match=r"cannot be pickled or copied.*load_graph"):
                attempt(loader)
        assert len([b for b in loader]) == 10  # the loader itself goes on


@pytest.mark.timeout(30)
def test_state_dict_behind_is_the_state_from_before_the_last_batches(tmp_path):
    # what conveyor.lightning.ExactResume asks for when Lightning has read a batch ahead
    spec = tmp_path / "filtered.yaml"
    spec.write_text(NUMBERS.read_text().replace("${spec_dir}/../examples", str(ROOT / "examples"))
                    .replace("  batch:", "  keep:    {op: filter, fn: chain_fns:keep_two_of_three}\n  batch:"))
    with load_graph(spec, batch_size=4) as loader:
        with pytest.raises(TypeError):
            len(loader)  # unknown: Lightning would read ahead, and ExactResume asks for two states
        loader.keep_behind(2)
        it = iter(loader)
        states, batches = [], []
        for _ in range(4):
            states.append(loader.state_dict())
            batches.append(next(it)["index"].tolist())
        assert loader.state_dict(behind=1) == states[3] and loader.state_dict(behind=2) == states[2]
        with pytest.raises(ValueError, match=r"the states from before the last 2 batch.*keep_behind\(3\)"):
            loader.state_dict(behind=3)
        saved = json.loads(json.dumps(loader.state_dict(behind=1)))
    with load_graph(spec, batch_size=4) as again:
        again.load_state_dict(saved)
        assert next(iter(again))["index"].tolist() == batches[3]
    with load_graph(NUMBERS, batch_size=4) as plain:  # not asked: only the state before the first batch
        it = iter(plain)
        start = plain.state_dict()
        next(it)
        assert plain.state_dict(behind=1) == start
        next(it)
        with pytest.raises(ValueError, match="last 0 batch"):
            plain.state_dict(behind=1)
        with pytest.raises(ValueError, match="keep_behind: batches=-1"):
            plain.keep_behind(-1)
