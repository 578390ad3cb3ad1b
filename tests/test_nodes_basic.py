"""Each op as a plain torchdata node, without YAML: what it yields, counts, and restores."""

from __future__ import annotations

import json
import os

import logging
import threading
import time
from pathlib import Path

import pytest
import torch
from torchdata.nodes import BaseNode, IterableWrapper

import conveyor
import helpers_fns as fns
from conveyor import SourceError, StateError
from conveyor.nodes.batch import Batch
from conveyor.nodes.collate import Collate
from conveyor.nodes.filter import Filter
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.map import Map
from conveyor.nodes.mix import Mix
from conveyor.nodes import pin_memory
from conveyor.nodes.pin_memory import PinMemory
from conveyor.nodes.prefetch import Prefetch
from conveyor.nodes.shard import Shard
from conveyor.nodes.shuffle_buffer import ShuffleBuffer
from conveyor.graphs.state import rank_states

NUMBERS = Path(__file__).resolve().parent.parent / "examples" / "data" / "numbers"


def take(node: BaseNode, n: int = 10**6) -> list:
    """Up to ``n`` items from a node that has been reset."""
    out = []
    for _ in range(n):
        try:
            out.append(next(node))
        except StopIteration:
            break
    return out


def run(node: BaseNode, state: dict | None = None) -> list:
    node.reset(state)
    return take(node)


def resumes_from_every_step(make, *, steps: int | None = None) -> None:
    """A fresh node restored from the state after step k yields what the first one yields after k."""
    node = make()
    full = run(node)
    for k in range(min(len(full), steps or len(full)) + 1):
        node = make()
        node.reset()
        head = take(node, k)
        state = node.state_dict()
        again = make()
        assert head + run(again, state) == full, f"resume after {k} items"
        for n in (node, again):
            getattr(n, "close", lambda: None)()


# ----- list_files --------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for rel in ["dogs/b.txt", "dogs/a.txt", "cats/z.txt", "cats/notes.md", "birds/x.txt", "top.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / "fish.txt").mkdir()  # a folder whose name matches the glob is not a file
    return tmp_path


def test_list_files_sorted_with_parent_dir_labels(tree: Path):
    node = ListFiles(url=f"{tree}/*/*.txt", label="parent_dir")
    assert run(node) == [
        {"path": f"{tree}/birds/x.txt", "label": 0, "index": 0},
        {"path": f"{tree}/cats/z.txt", "label": 1, "index": 1},
        {"path": f"{tree}/dogs/a.txt", "label": 2, "index": 2},
        {"path": f"{tree}/dogs/b.txt", "label": 2, "index": 3},
    ]
    assert node.classes == ["birds", "cats", "dogs"]


def test_list_files_without_labels_skips_folders(tree: Path):
    assert [(r["path"], r["label"]) for r in run(ListFiles(url=f"{tree}/*.txt"))] == [(f"{tree}/top.txt", -1)]
    assert [r["index"] for r in run(ListFiles(url=f"file://{tree}/dogs/*.txt"))] == [0, 1]


def test_list_files_glob_that_matches_nothing_names_the_url(tmp_path: Path):
    url = f"{tmp_path}/missing/*.jpg"
    node = ListFiles(url=url)
    with pytest.raises(SourceError) as info:
        node.reset()
    assert repr(url) in str(info.value)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, conveyor.ConveyorError)


def test_list_files_shuffle_is_a_permutation_per_epoch_and_a_position_state(tree: Path):
    def make(epoch: int = 0, seed: int = 7) -> ListFiles:
        node = ListFiles(url=f"{tree}/**/*.txt", shuffle=True, seed=seed)
        node.set_epoch(epoch)
        return node

    orders = {tuple(r["index"] for r in run(make(e))) for e in range(6)}
    assert all(sorted(o) == list(range(5)) for o in orders)
    assert len(orders) > 1  # epochs reshuffle
    assert run(make(3)) == run(make(3))
    resumes_from_every_step(lambda: make(2))
    node = make(1)
    node.reset()
    take(node, 2)
    state = node.state_dict()
    assert state["pos"] == 2 and state["count"] == 5 and len(state["digest"]) == 16


def test_list_files_refuses_a_state_that_no_longer_fits_the_listing(tree: Path):
    """Issue 13.9: a file inserted since the state, a renamed file, a position past the end."""
    url = f"{tree}/*/*.txt"
    node = ListFiles(url=url)
    node.reset()
    take(node, 2)
    state = node.state_dict()
    (tree / "birds" / "a.txt").write_text("new")  # sorts first: position 2 would repeat a file
    with pytest.raises(StateError, match=r"taken over 4 files, the listing now has 5 \(added: 1\)"):
        ListFiles(url=url).reset(state)
    (tree / "birds" / "a.txt").rename(tree / "birds" / "y.txt")
    (tree / "birds" / "x.txt").unlink()  # 4 files again, not the same ones
    with pytest.raises(StateError, match="same count, 4, but other paths"):
        ListFiles(url=url).reset(state)
    with pytest.raises(StateError, match="at file 13, the listing has 4"):
        ListFiles(url=url).reset({"pos": 13})
    # the same files under another root: the state moves with the data
    import shutil
    node = ListFiles(url=url)
    node.reset()
    take(node, 3)
    state = node.state_dict()
    shutil.copytree(tree, tree.parent / "copy")
    assert run(ListFiles(url=f"{tree.parent}/copy/*/*.txt"), state) == [
        {"path": f"{tree.parent}/copy/dogs/b.txt", "label": -1, "index": 3}]


def test_list_files_keeps_the_extensions_asked_for_in_any_case(tree: Path, caplog):
    (tree / "cats/Y.TXT").write_text("upper")
    node = ListFiles(url=f"{tree}/*/*", extensions=["txt", ".MD"], label="parent_dir")
    assert [(r["path"][len(str(tree)) + 1:], r["label"]) for r in run(node)] == [
        ("birds/x.txt", 0), ("cats/Y.TXT", 1), ("cats/notes.md", 1), ("cats/z.txt", 1),
        ("dogs/a.txt", 2), ("dogs/b.txt", 2)]
    assert "left out" not in caplog.text
    only_md = ListFiles(url=f"{tree}/*/*", extensions=[".md"], label="parent_dir")
    assert [(r["path"][len(str(tree)) + 1:], r["label"]) for r in run(only_md)] == [("cats/notes.md", 0)]
    assert "5 of the 6 files matching" in caplog.text and "(.txt (5))" in caplog.text  # not silently
    with pytest.raises(SourceError) as info:  # what is there instead is named
        ListFiles(url=f"{tree}/*/*", extensions=[".jpg", ".png"]).reset()
    assert "none is a visible file ending in .jpg .png (found: .txt (5), .md (1))" in str(info.value)
    assert "set extensions to take them" in str(info.value)
    for bad in ([], ".jpg", [""], [3]):
        with pytest.raises(ValueError, match="extensions"):
            ListFiles(url=f"{tree}/*", extensions=bad)


def test_list_files_top_dir_labels_as_imagefolder(tree: Path, monkeypatch, caplog):
    (tree / "cats/kittens").mkdir()
    (tree / "cats/kittens/k.txt").write_text("nested")  # ImageFolder: a cat, like cats/z.txt
    want = [("birds/x.txt", 0), ("cats/kittens/k.txt", 1), ("cats/notes.md", 1), ("cats/z.txt", 1),
            ("dogs/a.txt", 2), ("dogs/b.txt", 2)]
    monkeypatch.chdir(tree.parent)
    for url in (f"{tree}/*/**", f"file://{tree}/*/**", f"{tree.name}/*/**", f"{tree}/./*/**",
                f"{tree}//*/**", f"file://{tree}///*/**"):  # a root given with a trailing slash
        node = ListFiles(url=url, label="top_dir")
        got = [(r["path"].split(f"{tree.name}/", 1)[1].removeprefix("./"), r["label"]) for r in run(node)]
        assert all("//" not in r["path"] for r in run(node)), url
        assert got == want, url
        assert node.classes == ["birds", "cats", "dogs", "fish.txt"]  # numbered as ImageFolder does
    assert "with no file listed, their labels kept free: fish.txt" in caplog.text  # an empty folder
    parent = [r["label"] for r in run(ListFiles(url=f"{tree}/*/**", label="parent_dir"))]
    assert parent == [0, 3, 1, 1, 2, 2]  # kittens would be a class of its own
    (tree / ".ipynb_checkpoints").mkdir()  # Jupyter's copies: hidden, no class, not listed
    (tree / ".ipynb_checkpoints/c-checkpoint.txt").write_text("copy")
    (tree / "dogs/.ipynb_checkpoints").mkdir()
    (tree / "dogs/.ipynb_checkpoints/a-checkpoint.txt").write_text("copy")
    images = ListFiles(url=f"{tree}/*/**", label="top_dir", extensions=[".txt", ".md"])
    assert [(r["path"].split(f"{tree.name}/", 1)[1], r["label"]) for r in run(images)] == want
    assert images.classes == ["birds", "cats", "dogs", "fish.txt"]
    with pytest.raises(SourceError, match="top.txt' is not in a folder below"):
        ListFiles(url=str(tree), label="top_dir").reset()  # a folder: top.txt has no class folder



def test_a_hidden_folder_is_no_class_without_extensions_too(tree: Path, caplog):
    """Jupyter's .ipynb_checkpoints sorts first: taken as a class, it shifted every label by one
    (and disagreed with pack and the imagenet specs, which pass extensions)."""
    want = [(r["path"], r["label"]) for r in run(ListFiles(url=f"{tree}/*/**", label="top_dir"))]
    (tree / ".ipynb_checkpoints").mkdir()
    (tree / ".ipynb_checkpoints/x-checkpoint.txt").write_text("copy")
    (tree / "dogs/.a.txt.swp").write_text("an editor's swap file")
    for label in ("top_dir", "parent_dir"):
        node = ListFiles(url=f"{tree}/*/**", label=label)
        assert all("/." not in r["path"] for r in run(node)) and ".ipynb_checkpoints" not in node.classes
    assert [(r["path"], r["label"]) for r in run(ListFiles(url=f"{tree}/*/**", label="top_dir"))] == want
    assert "2 of the 7 files" in caplog.text and "hidden" in caplog.text
    assert [r["path"] for r in run(ListFiles(url=f"{tree}/*/**"))] == [p for p, _ in want]  # no label too
    with pytest.raises(SourceError, match="every one is hidden"):
        ListFiles(url=f"{tree}/.ipynb*/*", label="parent_dir").reset()


def test_hidden_files_are_listed_only_by_a_pattern_that_starts_with_a_dot(tmp_path: Path, caplog):
    """As in the shell and Python's glob: a folder copied from a Mac holds ._a.jsonl (a binary
    resource fork) beside a.jsonl, and *.jsonl read it as records (an error at its first byte)."""
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "._a.jsonl").write_bytes(b"\0\5\26\7 resource fork")
    (tmp_path / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/b.jsonl").write_text('{"text": "b"}\n')
    (tmp_path / "sub/.b.jsonl.swp").write_text("an editor's swap file")
    names = lambda url: [r["path"].removeprefix(f"{tmp_path}/") for r in run(ListFiles(url=url))]
    with caplog.at_level(logging.WARNING):
        assert names(f"{tmp_path}/*.jsonl") == ["a.jsonl"]
    assert "1 of the 2 files" in caplog.text and "._a.jsonl" in caplog.text  # named, not dropped silently
    assert names(str(tmp_path)) == ["a.jsonl", "sub/b.jsonl"]  # a folder: every visible file below it
    assert names(f"{tmp_path}/**") == ["a.jsonl", "sub/b.jsonl"]
    assert names(f"{tmp_path}/.*.jsonl") == ["._a.jsonl"]  # asked for by name
    assert names(f"{tmp_path}/sub/.*") == ["sub/.b.jsonl.swp"]
    with pytest.raises(SourceError, match="every one is hidden.*starts with a dot"):
        ListFiles(url=f"{tmp_path}/*/*.swp").reset()  # a match, but only hidden ones: said, not 'no file'


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_list_files_leaves_out_what_is_not_a_file_and_says_so(tmp_path: Path, caplog):
    # a named pipe that the glob matches: opening it to read waits for a writer for ever
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    os.mkfifo(tmp_path / "b.jsonl")
    os.mkfifo(tmp_path / "c.txt")  # not matched: not named
    (tmp_path / "d.jsonl").symlink_to(tmp_path / "b.jsonl")  # a link to a pipe is one too
    got = [r["path"] for r in run(ListFiles(url=f"{tmp_path}/*.jsonl"))]
    assert got == [f"{tmp_path}/a.jsonl"]
    assert "2 match(es) left out that are not files" in caplog.text and f"{tmp_path}/b.jsonl" in caplog.text
    assert "c.txt" not in caplog.text


def test_list_files_follows_symlinked_folders_as_imagefolder(tree: Path, tmp_path_factory, monkeypatch, caplog):
    store = tmp_path_factory.mktemp("store")
    (store / "lions").mkdir()
    (store / "lions/l.txt").write_text("a lion")
    (tree / "lions").symlink_to(store / "lions")  # a subset made of links, as ImageNet-100s are
    (tree / "big_cats").symlink_to(store / "lions")  # the same folder twice: listed twice
    (store / "lions/loop").symlink_to(tree)  # a link back up: followed once, not for ever
    (tree / "dogs/gone.txt").symlink_to(store / "nothing.txt")  # broken: listed, its read fails
    (tree / "moved").symlink_to(store / "moved")  # a class folder's link that points nowhere: named
    node = ListFiles(url=f"{tree}/*/**", label="top_dir")
    got = [(r["path"][len(str(tree)) + 1:], r["label"]) for r in run(node)]
    assert got == [("big_cats/l.txt", 0), ("birds/x.txt", 1), ("cats/notes.md", 2), ("cats/z.txt", 2),
                   ("dogs/a.txt", 3), ("dogs/b.txt", 3), ("dogs/gone.txt", 3), ("lions/l.txt", 5)]
    assert "2 broken symbolic link(s)" in caplog.text and f"{tree}/dogs/gone.txt" in caplog.text
    real_scandir = os.scandir

    def denied(path):
        if str(path).endswith("birds"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(SourceError, match="cannot list .*birds: Permission denied"):
        ListFiles(url=f"{tree}/*/**").reset()


def test_a_local_listing_reads_no_deeper_than_its_pattern_reaches(tree: Path, monkeypatch):
    (tree / "cats/deep/deeper").mkdir(parents=True)
    (tree / "cats/deep/deeper/d.txt").write_text("deep")
    real_scandir, scanned = os.scandir, []
    monkeypatch.setattr(os, "scandir", lambda path: scanned.append(str(path)) or real_scandir(path))
    assert [r["path"] for r in run(ListFiles(url=f"{tree}/*.txt"))] == [f"{tree}/top.txt"]
    assert scanned == [str(tree)]  # the folders below hold nothing *.txt can match
    scanned.clear()
    assert len(run(ListFiles(url=f"{tree}/*/*.txt"))) == 4
    assert f"{tree}/cats/deep" not in scanned
    scanned.clear()
    assert f"{tree}/cats/deep/deeper/d.txt" in [r["path"] for r in run(ListFiles(url=f"{tree}/*/**"))]
    assert f"{tree}/cats/deep/deeper" in scanned


def test_list_files_under_a_folder_with_brackets_in_its_name(tmp_path: Path):
    root = tmp_path / "run[1]"
    for rel in ("cats [big]/a b.txt", "dogs/é?.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    with pytest.raises(SourceError, match=r"write '\[\[\]' for a '\['"):  # [1] is a set: said how to escape it
        ListFiles(url=f"{root}/*/**").reset()
    escaped = str(root).replace("[", "[[]")
    for url in (f"{escaped}/*/**", escaped):
        node = ListFiles(url=url, label="top_dir")
        assert [(r["path"], r["label"]) for r in run(node)] == [
            (f"{root}/cats [big]/a b.txt", 0), (f"{root}/dogs/é?.txt", 1)], url


def test_list_files_refuses_an_unknown_label():
    with pytest.raises(ValueError, match="label='folder'"):
        ListFiles(url="x/*", label="folder")


# ----- shard -------------------------------------------------------------------------------

# item counts below divide evenly among the slots, so no epoch-equalizing policy changes them
def test_shard_explicit_rank_and_world():
    assert run(Shard(IterableWrapper(range(12)), rank=1, world=3)) == [1, 4, 7, 10]
    assert run(Shard(IterableWrapper(range(12)), rank=1, world=2, worker=1, workers=2)) == [3, 7, 11]
    parts = [run(Shard(IterableWrapper(range(20)), rank=r, world=4)) for r in range(4)]
    assert sorted(sum(parts, [])) == list(range(20))  # disjoint and complete


def test_shard_reads_rank_and_world_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    node = Shard(IterableWrapper(range(8)))
    assert (node.rank, node.world) == (2, 4)
    assert run(node) == [2, 6]
    assert run(Shard(IterableWrapper(range(8)), rank=0)) == [0, 4]  # explicit wins
    with pytest.raises(ValueError, match=r"rank=2 must be in \[0, world=2\)"):
        Shard(IterableWrapper(range(8)), world=2)  # rank 2 from the environment, world 2 given
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert run(Shard(IterableWrapper(range(3)))) == [0, 1, 2]


@pytest.mark.parametrize("kw", [dict(rank=3, world=3), dict(rank=-1, world=2), dict(rank=0, world=0),
                                dict(rank=0, world=1, worker=2, workers=2)])
def test_shard_refuses_impossible_slots(kw):
    with pytest.raises(ValueError):
        Shard(IterableWrapper(range(3)), **kw)


def test_shard_resumes():
    resumes_from_every_step(lambda: Shard(IterableWrapper(range(12)), rank=1, world=3))


# ----- shuffle_buffer ----------------------------------------------------------------------

def make_shuffle(n: int = 30, size: int = 8, seed: int = 3, epoch: int = 0, rank: int = 0) -> ShuffleBuffer:
    node = ShuffleBuffer(IterableWrapper(range(n)), size=size, seed=seed, rank=rank)
    node.set_epoch(epoch)
    return node


def test_shuffle_buffer_permutes_within_windows():
    out = run(make_shuffle())
    assert sorted(out) == list(range(30)) and out != list(range(30))
    for w in range(0, 30, 8):  # a window never lets an item out of it
        assert sorted(out[w:w + 8]) == list(range(w, min(w + 8, 30)))


def test_shuffle_buffer_seed_epoch_and_rank():
    base = run(make_shuffle())
    assert run(make_shuffle()) == base
    assert run(make_shuffle(epoch=1)) != base
    assert run(make_shuffle(seed=4)) != base
    assert run(make_shuffle(rank=1)) != base
    node = make_shuffle()  # set_epoch on the same node between epochs
    epochs = []
    for e in range(3):
        node.set_epoch(e)
        epochs.append(run(node))
    assert epochs[0] == base and epochs[1] == run(make_shuffle(epoch=1)) and epochs[1] != epochs[2]


def test_shuffle_buffer_restore_mid_window_equals_uninterrupted():
    resumes_from_every_step(lambda: make_shuffle(epoch=2))
    node = make_shuffle()
    node.reset()
    take(node, 13)  # window 1, 5 items into it
    state = node.state_dict()
    assert state["window"] == 1 and state["pos"] == 5
    assert state["source"] == {"_num_yielded": 8}  # where window 1 starts, not the items


def test_shuffle_buffer_refuses_a_state_of_another_size():
    """Issue 13.9: other windows would repeat some items and lose others."""
    node = make_shuffle(size=8)
    node.reset()
    take(node, 13)
    with pytest.raises(StateError, match="taken with size=8, this node has size=5"):
        make_shuffle(size=5).reset(node.state_dict())


def test_shuffle_buffer_emits_while_the_next_window_fills():
    """One upstream read per item emitted: after the first window, never a whole-window fill."""
    reads = []

    class Counting(IterableWrapper):
        def next(self):
            item = super().next()
            reads.append(item)
            return item

    node = ShuffleBuffer(Counting(range(50)), size=10, seed=1)
    node.reset()
    lead = []
    for k in range(50):
        next(node)
        lead.append(len(reads) - (k + 1))
    # the first window is read before its first item comes out; from then on one read per
    # item emitted keeps exactly one window ahead (no whole-window fill), until the input ends
    assert lead == [10] * 40 + list(range(9, -1, -1))
    with pytest.raises(StopIteration):
        next(node)
    assert len(reads) == 50


def test_shuffle_buffer_state_is_small_and_a_restore_rereads_at_most_two_windows():
    import json

    class Counting(IterableWrapper):
        reads = 0

        def next(self):
            Counting.reads += 1
            return {"text": "x" * 100, "n": super().next()}

    node = ShuffleBuffer(Counting(range(9000)), size=2000, seed=1)
    node.reset()
    head = [next(node)["n"] for _ in range(3999)]  # the last item of window 1
    state = node.state_dict()
    assert len(json.dumps(state)) <= 4096 and state["window"] == 1 and state["pos"] == 1999
    Counting.reads = 0
    again = ShuffleBuffer(Counting(range(9000)), size=2000, seed=1)
    again.reset(state)
    rest = [next(again)["n"]]
    assert Counting.reads <= 2 * 2000  # window 1 and what had been read of window 2
    rest += [x["n"] for x in again]
    assert sorted(head + rest) == list(range(9000))


def test_shuffle_buffer_refuses_size_zero():
    with pytest.raises(ValueError, match="size=0"):
        ShuffleBuffer(IterableWrapper([]), size=0)


# ----- map ---------------------------------------------------------------------------------

def test_map_inline_and_threads_give_the_same_results(no_new_threads):
    records = [{"index": i, "v": i} for i in range(40)]
    results = []
    for workers in (0, 2):
        node = Map(IterableWrapper(records), fn=fns.noisy, workers=workers, seed=5)
        results.append(run(node))
        node.close()
    assert results[0] == results[1]
    assert [item["v"] for item, _ in results[0]] == list(range(40))


def test_map_rng_depends_on_seed_epoch_and_sample_not_position_or_workers(no_new_threads):
    def draws(records, *, workers=0, seed=5, epoch=0):
        node = Map(IterableWrapper(records), fn=fns.noisy, workers=workers, seed=seed)
        node.set_epoch(epoch)
        out = {item["index"]: r for item, r in run(node)}
        node.close()
        return out

    records = [{"index": i} for i in range(20)]
    base = draws(records)
    assert draws(list(reversed(records)), workers=2) == base  # per sample, whatever the order
    assert draws(records, epoch=1) != base
    assert draws(records, seed=6) != base
    assert len(set(base.values())) == 20
    # items without an "index" draw by position
    plain = Map(IterableWrapper(range(10)), fn=fns.noisy, workers=2)
    threaded = run(plain)
    plain.close()
    assert threaded == run(Map(IterableWrapper(range(10)), fn=fns.noisy))


def test_map_args_and_resume(no_new_threads):
    node = Map(IterableWrapper(range(5)), fn=fns.times, args={"k": 3})
    assert run(node) == [0, 3, 6, 9, 12]
    resumes_from_every_step(lambda: Map(IterableWrapper(range(9)), fn=fns.times, workers=2))


@pytest.mark.parametrize("workers", [0, 2])
def test_map_on_error_skip_counts(workers, caplog, no_new_threads):
    node = Map(IterableWrapper(range(10)), fn=fns.fail_on_three, on_error="skip", workers=workers,
               where="node 'parse' (map) from s.yaml:4")
    with caplog.at_level(logging.WARNING, logger="conveyor.nodes.map"):
        assert run(node) == [1, 2, 4, 5, 7, 8]
    node.close()
    assert node.stats() == {"skipped": 4}
    assert "node 'parse' (map) from s.yaml:4: skipped an item (KeyError: 'no key for 3')" in caplog.messages


@pytest.mark.parametrize("workers", [0, 2])
def test_map_on_error_raise_keeps_the_exception_and_names_the_node(workers, no_new_threads):
    node = Map(IterableWrapper(range(1, 10)), fn=fns.fail_on_three, workers=workers,
               where="node 'parse' (map) from s.yaml:4")
    node.reset()
    assert take(node, 2) == [1, 2]
    with pytest.raises(KeyError) as info:
        next(node)
    node.close()
    assert info.value.args == ("no key for 3",)
    assert info.value.__notes__ == ["in node 'parse' (map) from s.yaml:4"]


def test_map_refuses_bad_arguments():
    for kw, text in [(dict(workers=-1), "workers=-1"), (dict(method="fiber"), "method='fiber'"),
                     (dict(on_error="ignore"), "on_error='ignore'")]:
        with pytest.raises(ValueError, match=text):
            Map(IterableWrapper([]), fn=fns.ident, **kw)


# ----- filter, batch, collate, pin_memory, prefetch -----------------------------------------

def test_filter_counts_what_it_drops():
    node = Filter(IterableWrapper(range(10)), fn=fns.is_even)
    assert run(node) == [0, 2, 4, 6, 8]
    assert node.stats() == {"filtered": 5}
    node.reset()
    take(node, 2)
    state = node.state_dict()
    again = Filter(IterableWrapper(range(10)), fn=fns.is_even)
    assert run(again, state) == [4, 6, 8] and again.stats() == {"filtered": 5}


def test_filter_error_names_the_node():
    node = Filter(IterableWrapper([2, "x"]), fn=fns.is_even, where="node 'keep' (filter)")
    node.reset()
    assert next(node) == 2
    with pytest.raises(TypeError) as info:
        next(node)
    assert info.value.__notes__ == ["in node 'keep' (filter)"]


def test_batch_drop_last():
    assert run(Batch(IterableWrapper(range(5)), size=2)) == [[0, 1], [2, 3], [4]]
    assert run(Batch(IterableWrapper(range(5)), size=2, drop_last=True)) == [[0, 1], [2, 3]]
    assert run(Batch(IterableWrapper(range(4)), size=2, drop_last=True)) == [[0, 1], [2, 3]]
    assert run(Batch(IterableWrapper([]), size=3)) == []
    resumes_from_every_step(lambda: Batch(IterableWrapper(range(7)), size=3))
    with pytest.raises(ValueError, match="size=0"):
        Batch(IterableWrapper([]), size=0)


def test_collate_of_dicts():
    samples = [{"x": torch.tensor([1.0, 2.0]), "label": 0, "name": "a"},
               {"x": torch.tensor([3.0, 4.0]), "label": 1, "name": "b"}]
    (out,) = run(Collate(IterableWrapper([samples])))
    assert set(out) == {"x", "label", "name"}
    assert torch.equal(out["x"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert torch.equal(out["label"], torch.tensor([0, 1]))
    assert out["name"] == ["a", "b"]


@pytest.mark.parametrize("batch, named", [
    # the first lacks a field: torch's collate goes by the first's keys and dropped it silently
    ([{"x": 1, "index": 7}, {"x": 2, "index": 8, "label": 3}], r"sample 1 \(index 8\) of the batch has fields \['label'\]"),
    # another lacks one: a bare KeyError before
    ([{"x": 1, "label": 0}, {"x": 2, "file": "b.jsonl", "line": 4}], r"sample 1 \(b.jsonl:4\) of the batch lacks fields \['label'\]"),
    # as many fields, one of them another
    ([{"x": 1, "label": 0}, {"x": 2, "cls": 0}], r"sample 1 of the batch lacks fields \['label'\] and has fields \['cls'\]"),
])
def test_collate_names_a_sample_whose_fields_differ(batch, named):
    with pytest.raises(ValueError, match=named):
        run(Collate(IterableWrapper([batch])))


def test_collate_stacks_like_torch_without_intra_op_threads():
    import os

    import numpy as np
    from torch.utils.data import default_collate as torch_collate

    images = [torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8) for _ in range(32)]
    batches = [
        [{"image": t, "label": i, "arr": np.full(3, i, np.float32)} for i, t in enumerate(images)],
        [torch.randn(4, 5) for _ in range(3)],
        [torch.ones(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.bfloat16)],  # no numpy
        [torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)],
        [torch.arange(6).reshape(2, 3).t(), torch.arange(6).reshape(2, 3).t()],  # not contiguous
    ]
    for batch in batches:
        ours, theirs = run(Collate(IterableWrapper([batch])))[0], torch_collate(batch)
        flat = ours.items() if isinstance(ours, dict) else [("", ours)]
        for key, value in flat:
            ref = theirs[key] if key else theirs
            assert value.dtype == ref.dtype and torch.equal(value, ref) and value.is_contiguous()
            assert value.requires_grad == ref.requires_grad
    # a torch.stack of a batch of images from a loader thread starts an OpenMP team there
    big = [torch.zeros(3, 224, 224, dtype=torch.uint8) for _ in range(32)]
    new_tasks = []

    def collate_in_a_thread() -> None:
        before = set(os.listdir("/proc/self/task"))
        run(Collate(IterableWrapper([big] * 3)))
        new_tasks.append(set(os.listdir("/proc/self/task")) - before)

    t = threading.Thread(target=collate_in_a_thread)
    t.start()
    t.join(timeout=30)
    assert new_tasks == [set()]


def test_collate_reuses_a_batch_only_once_nothing_refers_to_it():
    def batch(i: int) -> list:
        return [{"x": torch.full((3, 4, 4), i * 10 + j, dtype=torch.uint8)} for j in range(4)]

    node = Collate(IterableWrapper([batch(i) for i in range(8)]))
    node.reset()
    b0 = next(node)
    ptr0 = b0["x"].data_ptr()
    view, b0 = b0["x"][1], None        # a view of batch 0 outlives its batch
    b1 = next(node)
    assert b1["x"].data_ptr() != ptr0 and int(view[0, 0, 0]) == 1
    arr, ptr1, b1 = b1["x"].numpy(), b1["x"].data_ptr(), None  # so does a numpy array of batch 1
    storage = next(node)["x"].untyped_storage()                # and batch 2's storage
    ptr2 = storage.data_ptr()
    b3 = next(node)
    assert b3["x"].data_ptr() not in (ptr0, ptr1, ptr2)
    assert int(view[0, 0, 0]) == 1 and int(arr[0, 0, 0, 0]) == 10 and storage.nbytes() == 4 * 48
    assert torch.equal(b3["x"], torch.stack([torch.full((3, 4, 4), 30 + j, dtype=torch.uint8) for j in range(4)]))
    view = arr = storage = None
    kept, b3_ptr = [b3], b3["x"].data_ptr()
    b3 = None
    for i in range(4, 8):                # let go of everything: later batches reuse old memory
        kept.append(next(node))
        assert int(kept[-1]["x"][2, 0, 0, 0]) == i * 10 + 2
        kept[-2] = None
    assert kept[-1]["x"].data_ptr() in (ptr0, ptr1, ptr2, b3_ptr)
    buffers = node._map[torch.Tensor].keywords["buffers"]
    assert len(buffers.arrays) <= 4      # the one in use and a few free ones


def test_collate_of_uneven_samples_explains():
    node = Collate(IterableWrapper([[torch.zeros(2), torch.zeros(3)]]), where="node 'c' (collate)")
    node.reset()
    with pytest.raises(RuntimeError) as info:
        next(node)
    assert info.value.__notes__[0].startswith("in node 'c' (collate): samples of one batch must have "
                                              "the same shapes")


def test_pin_memory_passes_through_on_cpu(monkeypatch):
    assert PinMemory(IterableWrapper([])).active == torch.cuda.is_available()
    assert not PinMemory(IterableWrapper([]), enabled=False).active
    monkeypatch.setattr(pin_memory, "cuda_available", lambda: False)  # a CPU-only machine
    items = [torch.arange(3), {"x": torch.ones(2)}]
    node = PinMemory(IterableWrapper(items))
    assert not node.active
    out = run(node)
    assert out[0] is items[0] and out[1] is items[1]
    assert not PinMemory(IterableWrapper([]), enabled=True).active  # asking cannot make CUDA appear
    resumes_from_every_step(lambda: PinMemory(IterableWrapper(range(4))))


def test_prefetch_yields_everything_in_order_and_resumes(no_new_threads):
    node = Prefetch(IterableWrapper(range(20)), depth=3)
    assert run(node) == list(range(20))
    node.close()
    resumes_from_every_step(lambda: Prefetch(IterableWrapper(range(9)), depth=2))
    for bad in (dict(depth=0), dict(snapshot_every=0)):
        with pytest.raises(ValueError):
            Prefetch(IterableWrapper([]), **bad)


def test_prefetch_close_stops_its_thread_at_once():
    before = set(threading.enumerate())
    node = Prefetch(IterableWrapper(range(100)), depth=2, adapt=False)
    node.reset()
    next(node)
    assert len(set(threading.enumerate()) - before) == 1
    node.close()
    node.close()
    assert _leftover(before) == []


# ----- mix ---------------------------------------------------------------------------------

def make_mix(stop: str, weights=(1, 1), seed: int = 1, sizes=(5, 20)) -> Mix:
    a, b = (IterableWrapper(range(k, k + n)) for k, n in zip((0, 100), sizes))
    return Mix([a, b], weights=list(weights), stop=stop, seed=seed)


def test_mix_stop_all_yields_every_item_once():
    out = run(make_mix("all"))
    assert sorted(out) == list(range(5)) + list(range(100, 120))
    assert [x for x in out if x < 100] == list(range(5))  # each input keeps its order


def test_mix_stop_first_ends_with_the_first_exhausted_input():
    node = make_mix("first")
    out = run(node)
    assert [x for x in out if x < 100] == list(range(5))
    assert 0 < len([x for x in out if x >= 100]) < 20
    assert node.stats() == {"drawn": [5, len(out) - 5]}


def test_mix_forever_restarts_inputs_and_holds_the_weights():
    node = make_mix("forever", weights=(3, 1), sizes=(5, 3))
    node.reset()
    out = take(node, 4000)
    assert len(out) == 4000  # never ends
    share = sum(1 for x in out if x < 100) / len(out)
    assert abs(share - 0.75) < 0.03
    assert out[:50] == run_first(make_mix("forever", weights=(3, 1), sizes=(5, 3)), 50)  # seeded
    assert out[:50] != run_first(make_mix("forever", weights=(3, 1), sizes=(5, 3), seed=2), 50)


def run_first(node: BaseNode, n: int) -> list:
    node.reset()
    return take(node, n)


def test_mix_weights_zero_never_draws_and_bad_arguments():
    assert run(Mix([IterableWrapper("ab"), IterableWrapper("xy")], weights=[0, 1])) == ["x", "y"]
    for kw in (dict(weights=[1]), dict(weights=[0, 0]), dict(weights=[-1, 2]), dict(weights=[1, 1], stop="never")):
        with pytest.raises(ValueError):
            Mix([IterableWrapper("ab"), IterableWrapper("xy")], **kw)


@pytest.mark.parametrize("weights", [[float("nan"), 1], [float("inf"), 1], [1e308, 1e308], [1, True]])
def test_mix_refuses_weights_that_are_not_finite(weights, write_spec):
    # [nan, 1] and [inf, 1] drew the last input still running every time: "ab" then "xy", unmixed
    with pytest.raises(ValueError, match="finite"):
        Mix([IterableWrapper("ab"), IterableWrapper("xy")], weights=weights)
    for w in (".nan", ".inf", "-.inf"):
        spec = write_spec(f"""
nodes:
  a: {{op: list_files, url: "x/*"}}
  b: {{op: list_files, url: "y/*"}}
  m: {{op: mix, input: [a, b], weights: [{w}, 1]}}
""")
        with pytest.raises(conveyor.SpecErrors) as info:
            conveyor.load_graph(spec)
        (err,) = [e for e in info.value.errors if e.node == "m"]
        assert err.param == "weights" and "weight 0 is" in err.message and "finite" in err.message


@pytest.mark.parametrize("stop", ["all", "first"])
def test_mix_resumes(stop):
    resumes_from_every_step(lambda: make_mix(stop, weights=(2, 1), sizes=(6, 9)))


@pytest.mark.parametrize("stop", ["all", "first"])
def test_mix_counts_what_each_input_gave_across_a_resume(stop):
    full = make_mix(stop, weights=(2, 1), sizes=(6, 9))
    run(full)
    for k in (0, 3, 7):
        node = make_mix(stop, weights=(2, 1), sizes=(6, 9))
        node.reset()
        take(node, k)
        again = make_mix(stop, weights=(2, 1), sizes=(6, 9))
        again.reset(json.loads(json.dumps(node.state_dict())))
        assert again.stats() == node.stats()  # were [0, 0] after the load: the counts of the
        list(again)                           # epoch's first k draws lost
        assert again.stats() == full.stats(), k


def test_mix_resumes_across_a_restart():
    make = lambda: make_mix("forever", weights=(1, 1), sizes=(3, 4))  # noqa: E731
    full = run_first(make(), 30)
    for k in (0, 4, 11, 29):
        node = make()
        node.reset()
        take(node, k)
        again = make()
        again.reset(node.state_dict())
        assert full[:k] + take(again, 30 - k) == full


# ----- Loader ------------------------------------------------------------------------------

LOADER_SPEC = f"""
params: {{root: "{NUMBERS}", batch_size: 8, seed: 0, workers: 2}}
nodes:
  files:   {{op: list_files, url: "${{root}}/*/*.txt", label: parent_dir, shuffle: true}}
  shuffle: {{op: shuffle_buffer, size: 16}}
  parse:   {{op: map, fn: "conveyor.files:read_numbers", workers: "${{workers}}"}}
  batch:   {{op: batch, size: "${{batch_size}}"}}
  collate: {{op: collate}}
  out:     {{op: prefetch, depth: 2}}
output: out
"""


def _leftover(before: set, wait: float = 5.0) -> list[str]:
    deadline = time.monotonic() + wait
    while True:
        alive = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not alive or time.monotonic() > deadline:
            return [t.name for t in alive]
        for t in alive:
            t.join(timeout=0.05)


def indices(loader) -> list[list[int]]:
    return [b["index"].tolist() for b in loader]


@pytest.fixture
def loader_spec(write_spec) -> Path:
    return write_spec(LOADER_SPEC)


def test_loader_with_closes_every_thread(loader_spec):
    before = set(threading.enumerate())
    with conveyor.load_graph(loader_spec) as loader:
        it = iter(loader)
        first = next(it)
        assert first["x"].shape == (8, 4)
        # the 2 map threads (prefetch makes batches inline for a consumer that comes straight
        # back, and the watchdog's thread is the process's: graphs/watchdog.py)
        assert len([t for t in set(threading.enumerate()) - before if t.name.startswith("conveyor-map")]) == 2
    assert _leftover(before) == []
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)
    loader.close()  # twice is fine


def test_loader_close_twice_mid_epoch_and_state_before_first_next(loader_spec):
    before = set(threading.enumerate())
    loader = conveyor.load_graph(loader_spec)
    state = loader.state_dict()  # before anything was taken
    own = rank_states(state)[0]
    assert own["epoch"] == 0 and own["yielded"] == 0 and own["format"] == 1 and state["format"] == 2
    epoch0 = indices(loader)
    assert len(epoch0) == 5 and sorted(sum(epoch0, [])) == list(range(40))
    loader.close()
    loader.close()
    assert _leftover(before) == []
    other = conveyor.load_graph(loader_spec)
    other.load_state_dict(state)
    assert indices(other) == epoch0
    assert indices(other) != epoch0  # the next epoch is reshuffled
    other.close()
    assert _leftover(before) == []


def test_loader_refuses_a_state_from_another_spec(loader_spec, write_spec):
    with conveyor.load_graph(loader_spec) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        expected = [b["index"].tolist() for b in take(it)]
    with conveyor.load_graph(loader_spec, batch_size=4) as other:
        with pytest.raises(StateError) as info:
            other.load_state_dict(state)
        assert "node 'batch' param 'size': saved 8, now 4" in str(info.value)
        assert "Pass strict=False" in str(info.value)
    renamed = write_spec(LOADER_SPEC.replace("collate:", "stack:"), "renamed.yaml")
    with conveyor.load_graph(renamed) as other:
        with pytest.raises(StateError, match="node 'collate' is in the saved spec but not in this one"):
            other.load_state_dict(state)
    with conveyor.load_graph(loader_spec, workers=1) as same_data:
        same_data.load_state_dict(state, strict=False)
        assert indices(same_data) == expected  # workers change speed, not data


def test_loader_strict_false_loads_and_logs(loader_spec, caplog):
    with conveyor.load_graph(loader_spec) as loader:
        state = loader.state_dict()
    with conveyor.load_graph(loader_spec, batch_size=4, workers=1) as other:
        with caplog.at_level(logging.INFO, logger="conveyor.graphs.state"):
            other.load_state_dict(state, strict=False)
        batches = indices(other)
    assert len(batches) == 10 and sorted(sum(batches, [])) == list(range(40))
    records = {(r.levelno, r.getMessage()) for r in caplog.records}
    assert (logging.WARNING, "loading a state across a spec change: node 'batch' param 'size': saved 8, "
            "now 4 (breaks exactness: the batches will differ)") in records
    assert (logging.INFO, "loading a state across a spec change: node 'parse' param 'workers': saved 2, "
            "now 1 (safe: the data stay the same)") in records


def test_loader_refuses_what_is_not_a_state(loader_spec):
    with conveyor.load_graph(loader_spec) as loader:
        for bad, text in [({}, "not a conveyor loader state"),
                          ({"format": 99, "graph": {}}, "state format 99 is not supported"),
                          ({**rank_states(loader.state_dict())[0], "world": 2}, "rank 0 of world 2")]:
            with pytest.raises(StateError, match=text):
                loader.load_state_dict(bad)
