"""Worker copies as Ray actors (``workers: {method: ray}``) on a real two-node cluster on
127.0.0.1 (tests/ray_cluster.py, one for the module): the batches of process copies, states
that resume either way, big tensors through shared memory from actors on the driver's node
and through the object store from elsewhere, exactly-once across an actor SIGKILLed mid-epoch
and across a node removed, clear errors (an unreachable cluster, a full object store)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import textwrap
from pathlib import Path

import pytest
import torch

from conveyor import load_graph
from ray_cluster import RAY_ENV, free_port, start_cluster

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray._private import ray_constants

    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)  # this process connects to the cluster as its nodes expect
    one_machine = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # (read at ray's import: this process, too, keeps 127.0.0.1)
    c = start_cluster()
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()
        ray_constants.ENABLE_RAY_CLUSTER = one_machine
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _spec(tmp_path: Path, workers: str, fn: str = "conveyor.files:read_numbers", on_error: str = "raise") -> Path:
    path = tmp_path / "ray.yaml"
    path.write_text(textwrap.dedent(f"""\
        params: {{batch_size: 4}}
        workers: {workers}
        nodes:
          files:   {{op: list_files, url: "{ROOT}/examples/data/numbers/*/*.txt", shuffle: true}}
          shard:   {{op: shard}}
          shuf:    {{op: shuffle_buffer, size: 1}}
          parse:   {{op: map, fn: "{fn}", on_error: {on_error}}}
          batch:   {{op: batch, size: "${{batch_size}}"}}
          collate: {{op: collate}}
        """))
    return path


def _ray(cluster, copies: int = 2) -> str:
    return f'{{copies: {copies}, method: ray, address: "{cluster.address}"}}'


def _off_loopback(cluster) -> list[str]:
    """The TCP connections of this process and of every process of the cluster's nodes whose
    either end is not a loopback address."""
    import ipaddress

    import psutil

    procs = [psutil.Process()]
    for node in cluster.procs:
        try:
            procs += [psutil.Process(node.pid)] + psutil.Process(node.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    off = []
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") else proc.connections("tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for conn in conns:
            for end in (conn.laddr, conn.raddr):
                if not end:
                    continue
                ip = ipaddress.ip_address(end.ip)
                ip = getattr(ip, "ipv4_mapped", None) or ip
                if not (ip.is_loopback or (ip.is_unspecified and conn.status == psutil.CONN_LISTEN)):
                    off.append(f"{proc.name()} (pid {proc.pid}): {conn.laddr} -> {conn.raddr} {conn.status}")
    return off


def _take(loader, n: int) -> list[int]:
    it = iter(loader)
    return [i for _ in range(n) for i in next(it)["index"].tolist()]


def test_ray_copies_give_the_batches_of_process_copies_and_resume_them(cluster, tmp_path: Path) -> None:
    with load_graph(_spec(tmp_path, "{copies: 2, method: process}")) as procs:
        want = [[i for b in procs for i in b["index"].tolist()] for _ in range(3)]
    with load_graph(_spec(tmp_path, _ray(cluster))) as actors:
        got = [[i for b in actors for i in b["index"].tolist()] for _ in range(2)]
        assert actors.stats()["nodes"]["parse"]["copies"] == 2
        head = _take(actors, 3)
        state = json.loads(json.dumps(actors.state_dict()))
        assert _off_loopback(cluster) == []  # the actors, the nodes and this driver talk on 127.0.0.1 only
    assert got == want[:2]
    with load_graph(_spec(tmp_path, "{copies: 2, method: process}")) as procs:  # ray -> process
        procs.load_state_dict(state)
        rest = [i for b in procs for i in b["index"].tolist()]
    assert head + rest == want[2]  # taken in the third epoch
    with load_graph(_spec(tmp_path, "{copies: 2, method: thread}")) as threads:  # thread -> ray, 2 -> 3
        head = _take(threads, 2)
        state = json.loads(json.dumps(threads.state_dict()))
    with load_graph(_spec(tmp_path, _ray(cluster, 3))) as actors:
        actors.load_state_dict(state)
        rest = [i for b in actors for i in b["index"].tolist()]
    assert sorted(head + rest) == sorted(want[0]) and len(head + rest) == 40


BIG = "helpers_fns:numbers_and_a_big_row"  # 1 MiB a sample: batches through shared memory


def _ask(copy, method: str):
    from conveyor.nodes._workers.ray_actors import CONTROL
    import ray

    return ray.get(getattr(copy.actor, method).options(concurrency_group=CONTROL).remote())


def _indexes(batches) -> list[int]:
    return [i for b in batches for i in b["index"].tolist()]


def _check_big(batches) -> None:
    for b in batches:  # each row its sample's index: no slot was written again under a held batch
        assert torch.equal(b["big"], b["index"].float()[:, None].expand(-1, 1 << 18))


def test_an_actor_killed_mid_epoch_resumes_exactly_once(cluster, tmp_path: Path) -> None:
    with load_graph(_spec(tmp_path, "{copies: 2, method: process}", fn=BIG)) as loader:
        want = [i for _ in range(3) for b in loader for i in b["index"].tolist()]
    with load_graph(_spec(tmp_path, _ray(cluster), fn=BIG)) as loader:
        it = iter(loader)
        held = [next(it) for _ in range(3)]
        copies = loader._epochs.run.copies()._workers
        victim = next((c for c in copies if _ask(c, "shares")), copies[0])  # one with slots, if any
        os.kill(_ask(victim, "pid"), signal.SIGKILL)
        held += list(it)
        # two epochs more: the actor had sent this epoch's and the next one's chunks before it
        # was killed (8 calls in flight hold 40 items), the third it sends after its restart
        held += [b for _ in range(2) for b in loader]
        assert loader.stats()["nodes"]["parse"]["actor_restarts"] == 1  # one death, counted once
    assert _indexes(held) == want  # three epochs: nothing lost, nothing repeated, in the same order
    _check_big(held)  # batches of the dead actor's slots and of its new life's, all held


def test_actors_on_the_drivers_node_hand_big_tensors_over_in_shared_memory(cluster, tmp_path: Path,
                                                                             monkeypatch) -> None:
    from conveyor.nodes._workers import ray_actors
    import ray

    with load_graph(_spec(tmp_path, "{copies: 2, method: process}", fn=BIG)) as procs:
        want = [_indexes(procs) for _ in range(2)]
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = f"/dev/shm/conveyor-ray-{gone.pid}-0badf00d-w0-l1-s0"  # a slot a killed driver left
    with open(orphan, "wb") as f:
        f.write(b"x")
    os.utime(orphan, (time.time() - 7200, time.time() - 7200))
    monkeypatch.setattr(ray_actors, "_swept", False)  # this process's first Ray loader
    with load_graph(_spec(tmp_path, _ray(cluster), fn=BIG)) as actors:
        held = [list(actors) for _ in range(2)]  # every batch kept while the actors go on
        assert not os.path.exists(orphan)  # swept before the first slots were made
        copies = actors._epochs.run.copies()._workers
        here = ray_actors._driver_node(ray)
        where = [(_ask(c, "node") == here, _ask(c, "shares"), c.shared_bytes) for c in copies]
        prefix = copies[0].prefix.rsplit("-w", 1)[0]
    assert [_indexes(b) for b in held] == want
    _check_big(held[0] + held[1])
    # an actor on this node shares memory, one on the other node uses the object store
    assert [(local, local, local) for local, _, _ in where] == [(a, b, c > 0) for a, b, c in where]
    assert any(local for local, _, _ in where), where  # Ray places the first actor on the caller's node
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]  # closed: no names left behind
    monkeypatch.setattr(ray_actors, "_driver_node", lambda ray: "another-node")  # as if all were remote
    with load_graph(_spec(tmp_path, _ray(cluster), fn=BIG)) as actors:
        held = list(actors)
        stats = actors.stats()["nodes"]["parse"]
    assert _indexes(held) == want[0] and stats["shared_memory_bytes"] == 0
    assert stats["object_store_bytes"] >= 40 << 20  # 40 samples of 1 MiB, through the object store
    _check_big(held)


def test_an_unreachable_cluster_is_named_fast(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=address.replace(".", r"\.")):
        with load_graph(_spec(tmp_path, f'{{copies: 2, method: ray, address: "{address}"}}')) as loader:
            next(iter(loader))
    assert time.monotonic() - t0 < 60  # not Ray's own minutes of retrying


def test_a_failing_fn_in_an_actor_follows_on_error(cluster, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sample 7 is bad"):  # the fn's own error, as from process copies
        with load_graph(_spec(tmp_path, _ray(cluster), fn="helpers_fns:fail_on_seven")) as loader:
            list(loader)
    with load_graph(_spec(tmp_path, _ray(cluster), fn="helpers_fns:fail_on_seven", on_error="skip")) as loader:
        got = [i for b in loader for i in b["index"].tolist()]
    assert len(got) == 39 and len(set(got)) == 39


def test_a_full_object_store_is_an_error_naming_it_not_a_hang(cluster, tmp_path: Path, monkeypatch) -> None:
    """Each node's object store holds 200 MB and may not spill (tests/ray_cluster.py); one
    sample of 300 MiB goes through it, as from an actor on another node."""
    from conveyor import WorkerError
    from conveyor.nodes._workers import ray_actors

    monkeypatch.setattr(ray_actors, "_driver_node", lambda ray: "another-node")  # no shared memory
    spec = _spec(tmp_path, _ray(cluster), fn="helpers_fns:numbers_one_huge")
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker copy \d \(ray actor\): Ray's object store is full, and so is "
                                          r"the disk it spills to: a chunk could not be stored \(OutOfDiskError"):
        with load_graph(spec, batch_size=1) as loader:
            for _ in loader:
                pass
    assert time.monotonic() - t0 < 120  # at once, not after a wait for room that never comes


def test_a_node_removed_mid_epoch_moves_its_actors_and_nothing_is_lost(cluster, tmp_path: Path) -> None:
    """The last test of the module: it takes one of the cluster's two nodes away (the one the
    driver is not attached to: Ray picks either, both being on 127.0.0.1)."""
    from conveyor.nodes._workers import ray_actors
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    import ray

    with load_graph(_spec(tmp_path, "{copies: 2, method: process}")) as loader:
        want = [_indexes(loader) for _ in range(3)]
    ray_actors.connect(cluster.address)
    here = ray_actors._driver_node(ray)
    # the driver's node held full for a moment: both actors start on the second node
    hold = ray.remote(num_cpus=2)(_Hold).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
    ray.get(hold.ready.remote())
    with load_graph(_spec(tmp_path, _ray(cluster))) as loader:
        it = iter(loader)
        got = [i for _ in range(3) for i in next(it)["index"].tolist()]
        copies = loader._epochs.run.copies()._workers
        assert all(_ask(c, "node") != here for c in copies)
        nodes = {cluster.node_of(_ask(c, "pid")) for c in copies}
        assert len(nodes) == 1, nodes
        ray.kill(hold)  # room on the driver's node for the actors Ray restarts
        cluster.remove_node(nodes.pop())  # the other node is gone, with both actors
        got += [i for b in it for i in b["index"].tolist()]
        got += [i for _ in range(2) for b in loader for i in b["index"].tolist()]
        assert all(_ask(c, "node") == here for c in copies)  # restarted on the node that is left
        assert loader.stats()["nodes"]["parse"]["actor_restarts"] == 2  # one death each
    assert got == [i for epoch in want for i in epoch]  # nothing lost, nothing repeated, in order


class _Hold:
    def ready(self) -> bool:
        return True


def test_named_slots_hand_a_tensor_over_by_name_and_take_its_slot_back_once_let_go(tmp_path: Path, caplog) -> None:
    """The shared memory of an actor on the driver's node, in one process (no Ray needed)."""
    import logging
    import uuid

    from conveyor.nodes._workers.chunk_packing import pack, unpack
    from conveyor.nodes._workers.named_slots import FileBorrower, FileFlags, FileLender, remove_slots
    from conveyor.nodes._workers.ray_actors import _ActorPacker

    prefix = f"conveyor-test-{uuid.uuid4().hex[:8]}"
    flags = FileFlags(f"/dev/shm/{prefix}-flags", create=True)
    lender, borrower = FileLender(FileFlags(flags.path), prefix, first=2), FileBorrower(flags)
    flags.remove()
    try:
        big = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB: lent, not packed
        first = pack([{"big": big, "i": 0}], lender=lender)
        assert len(first[2].raw()) == 0 and os.path.exists(f"/dev/shm/{prefix}-s0")  # only the name travels
        got = unpack(first, borrower)
        assert torch.equal(got[0]["big"], big) and not os.path.exists(f"/dev/shm/{prefix}-s0")  # mapped, unnamed
        assert flags[0] == 1 and borrower.release() == 1  # held by the batch: still lent
        again = unpack(pack([{"big": big + 1, "i": 1}], lender=lender), borrower)  # into the other slot
        assert torch.equal(got[0]["big"], big) and torch.equal(again[0]["big"], big + 1)
        del got
        assert borrower.release() == 1 and flags[0] == 0  # let go: slot 0 may be written again
        third = pack([{"big": big + 2, "i": 2}], lender=lender)
        assert third[1] == [] and unpack(third, borrower)[0]["big"][0] == 2  # slot 0 again, by number
        assert borrower.nbytes == 3 << 20
    finally:
        remove_slots(prefix)
    # /dev/shm failing in an actor: its chunks go by value (the object store), said once
    packer = _ActorPacker(0)
    packer.lender = FileLender(FileFlags(str(tmp_path / "flags"), create=True), "no-such-folder/x")
    with caplog.at_level(logging.WARNING, logger="conveyor.nodes._workers.ray_actors"):
        payload = packer([{"big": big}])
    assert packer.lender is None and len(payload[2].raw()) == 1 << 20
    assert torch.equal(unpack(payload)[0]["big"], big)
    assert any("shared memory with the driver failed" in r.getMessage() for r in caplog.records)


def test_names_left_by_a_killed_driver_are_removed_once_old_and_no_others(tmp_path: Path) -> None:
    import subprocess
    import sys
    import uuid

    from conveyor.nodes._workers import named_slots

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid whose process is gone
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, not reaped: its mappings are gone
    deadline = time.monotonic() + 30
    while named_slots._alive(zombie.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not named_slots._alive(zombie.pid) and zombie.returncode is None  # (poll() would reap it)
    assert named_slots._alive(os.getpid())
    tag = uuid.uuid4().hex[:8]
    old, fresh, live = (f"/dev/shm/conveyor-ray-{pid}-{tag}-w0-l1-{kind}"
                        for pid, kind in ((dead.pid, "s0"), (dead.pid, "flags"), (os.getpid(), "s0")))
    other = f"/dev/shm/conveyor-test-{dead.pid}-{tag}"  # not conveyor-ray-: never looked at
    for path in (old, fresh, live, other):
        with open(path, "wb") as f:
            f.write(b"x")
    hour_ago = time.time() - 2 * named_slots.ORPHAN_AGE
    for path in (old, live, other):
        os.utime(path, (hour_ago, hour_ago))
    zombie_name = f"/dev/shm/conveyor-ray-{zombie.pid}-{tag}-w0-l1-s0"
    try:
        with open(zombie_name, "wb") as f:
            f.write(b"x")
        os.utime(zombie_name, (hour_ago, hour_ago))
        assert {dead.pid, zombie.pid} <= set(named_slots.remove_orphans())
        assert not os.path.exists(zombie_name)
        assert not os.path.exists(old)  # its driver is gone and it is old: removed
        assert os.path.exists(fresh)  # too young: a driver in another pid namespace may be mapping it
        assert os.path.exists(live) and os.path.exists(other)
    finally:
        for path in (old, fresh, live, other, zombie_name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        zombie.wait()
