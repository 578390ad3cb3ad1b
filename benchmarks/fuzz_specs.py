"""Fuzz the ``conveyor`` command as a user would meet it (issue 32): every bundled spec in
``specs/``, mutated, is checked and (when it checks) run for a few batches, each in a process of
its own with a time limit; every case must end as a clean conveyor error or a run, never a
traceback, never a hang.

    nice python benchmarks/fuzz_specs.py --cases 10000 --jobs 2 --timeout 30 --out /tmp/fuzz.jsonl \
        --skip-specs imagenet-procs
    nice python benchmarks/fuzz_specs.py --cases 300 --jobs 2 --timeout 120 --specs imagenet-procs

10,000 cases take about 8 minutes on a busy 2-core host: most mutations are refused by the
check (milliseconds) and the rest run 3 batches in a forked child (a tenth of a second to a
few seconds). ``imagenet-procs`` is the exception: its process copies start by importing
torch in each child (``spawn``), 15-30 s a run that checks on a busy host, so it gets a run of
its own with a longer timeout (a case past the timeout is a hang, and a slow start is not one).

Mutation kinds (one or two a case): ``text`` (tokens inserted: aliases, tags, brackets, odd
unicode; spans deleted; lines doubled or dropped), ``structure`` (a key deleted, a value's type
swapped), ``set`` (``--set`` values that are recursive aliases, deep nests, infinities, huge
numbers, empty text), ``inf`` (``.inf``/``-.inf``/``.nan``/``1e999`` for a number in the spec),
``huge`` (sizes, depths, batch sizes, resizes, workers of 10**9 and more), ``url`` (empty and
root-only listing URLs: ``""``, ``/``, ``file:///``, ``s3://``, ``/*/**``), ``misplace`` (a node
moved earlier in the chain, as ``batch`` before a ``map``).

Each case is first checked in the worker itself, as ``conveyor run`` checks it (the spec read, its
``--set`` parsed, ``check_spec``: milliseconds, under a timer): a spec the check refuses is an
``error`` there and then. A spec that checks runs ``conveyor run SPEC --steps 3 -q [--set ...]``
through ``conveyor.tools.cli.main`` in a child forked from a worker that has already imported conveyor and torch (so a case costs its
own work, not an interpreter's start), in its own session, with an address-space limit so that
a huge allocation is a ``MemoryError`` here instead of a swap storm on a shared host. Classes:
``error`` (exit 1 or 2, no traceback on stderr), ``ran`` (exit 0), ``traceback`` (an exception
out of ``main``, a ``Traceback`` on stderr, or death by a signal), ``hang`` (past ``--timeout``;
the child's whole group is killed). The summary groups tracebacks by exception and the last
conveyor frame; ``--out`` writes every case (kind, spec text, argv, outcome) as JSON lines.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SPECS_DIR = REPO / "specs"
TOKENS = [
    "&a ", "*a", "&b [*a, *a, *a, *a] ", "<<: *a\n", "!!int ", "!!bool ", "!!float ", "!!str ", "!!null ",
    "!!binary ", "!!set ", "!custom ", "[", "]", "{", "}", ": ", "- ", ", ", "\n", "\n  ", "\t", "'", '"', "#",
    "?", "|", ">", "~", "null", "-5", "0", ".inf", "-.inf", ".nan", "1e999", "99999999999999999999", "${",
    "${seed}", "${nope}", "${env:HOME}", "${spec_dir}", "\x07", "\u2028", "\ufeff", "\U0001F600", "é", "\\",
    "---\n", "[" * 120, "{a: " * 60,
]
SET_VALUES = ["&a [*a]", "&a {k: *a}", "&a [*a, *a]", "[" * 200 + "]" * 200, "{a: " * 150 + "1" + "}" * 150,
              ".inf", "-.inf", ".nan", "1e999", "-1e999", str(10 ** 30), str(2 ** 63), "-1", "0", "", "~",
              "[]", "{}", "&x 5", "*x", "!!python/name:os.system", "'${nope}'", "${seed}", "a: b"]
HUGE = [10 ** 9, 2 ** 31, 2 ** 40, 2 ** 63, 10 ** 30, 99999999999]
INFS = [float("inf"), float("-inf"), float("nan"), 1e308, -1e308]
URLS = ["", " ", "/", "//", "file:///", "file://", "s3://", "s3:///", "gs://", "/*", "/**", "/*/**",
        "/**/*.txt", "*", "**", "./", ".", "file:///*/**", "s3://*", "memory://"]
SIZE_KEYS = ("size", "depth", "workers", "resize", "crop", "max_tokens", "max_length", "buffer",
             "batch", "pool", "max_in_flight", "boundaries", "seq_len", "pad_to_multiple_of", "every",
             "chunk", "batch_size", "rows", "length", "weights", "copies", "prefetch", "count")


# ----- mutations ---------------------------------------------------------------------------------
def _leaves(data, path=()):
    """Every (path, value) of a scalar in ``data``."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _leaves(v, path + (i,))
    else:
        yield path, data


def _set(data, path, value):
    node = data
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value


def _text(rng: random.Random, text: str) -> str:
    kind = rng.choice(["insert", "insert", "delete", "line"])
    if kind == "insert":
        at = rng.randint(0, len(text))
        return text[:at] + rng.choice(TOKENS) + text[at:]
    if kind == "delete":
        at = rng.randint(0, len(text))
        return text[:at] + text[at + rng.randint(1, 40):]
    lines = text.splitlines(keepends=True)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    if rng.random() < 0.5:
        lines.insert(j, lines[i])
    else:
        lines.pop(i)
    return "".join(lines)


def _structure(rng: random.Random, data):
    leaves = list(_leaves(data))
    if not leaves or not leaves[0][0]:
        return data
    path, value = rng.choice(leaves)
    if rng.random() < 0.3:
        node = data
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]
    else:
        _set(data, path, rng.choice([None, 5, -1, "x", [value], {"k": value}, True, 1.5, "${seed}", [], {}]))
    return data


def _numbers(rng: random.Random, data, choices, keys_only: bool):
    leaves = [(p, v) for p, v in _leaves(data) if p and isinstance(v, (int, float)) and not isinstance(v, bool)
              or p and isinstance(v, str) and v.startswith("${")]
    if keys_only:
        sized = [(p, v) for p, v in leaves if any(str(k) in SIZE_KEYS for k in p[-2:])]
        leaves = sized or leaves
    if leaves:
        path, _ = rng.choice(leaves)
        _set(data, path, rng.choice(choices))
    return data


def _url(rng: random.Random, data):
    nodes = data.get("nodes") if isinstance(data, dict) else None
    spots = [(("nodes", n, "url"), None) for n, spec in (nodes or {}).items()
             if isinstance(spec, dict) and "url" in spec]
    if isinstance(data.get("params"), dict) and "root" in data["params"]:
        spots.append((("params", "root"), None))
    if spots:
        path, _ = rng.choice(spots)
        _set(data, path, rng.choice(URLS))
    return data


def _misplace(rng: random.Random, data):
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict) or len(nodes) < 2:
        return data
    names = list(nodes)
    i = rng.randrange(1, len(names))
    j = rng.randrange(0, i)
    names.insert(j, names.pop(i))  # a node moved earlier: what relied on "the node above" changes
    data["nodes"] = {n: nodes[n] for n in names}
    return data


def make_case(seed: int, specs: dict[str, str]) -> dict:
    rng = random.Random(seed)
    name = rng.choice(sorted(specs))
    text = specs[name]
    argv_set: list[str] = []
    kinds = []
    for _ in range(rng.choice([1, 1, 2])):
        kind = rng.choice(["text", "text", "structure", "set", "inf", "huge", "huge", "url", "misplace"])
        kinds.append(kind)
        if kind == "text":
            text = _text(rng, text)
            continue
        if kind == "set":
            try:
                declared = list((yaml.safe_load(specs[name]) or {}).get("params") or {})
            except yaml.YAMLError:
                declared = []
            key = rng.choice(declared + ["nope", "shuffle.size", "batch.size"]) if declared else "x"
            argv_set += ["--set", f"{key}={rng.choice(SET_VALUES)}"]
            continue
        try:
            data = yaml.safe_load(text)
        except Exception:  # noqa: BLE001 - an earlier text mutation broke PyYAML itself: keep the text
            continue
        if not isinstance(data, dict):
            continue
        data = {"structure": lambda d: _structure(rng, d), "inf": lambda d: _numbers(rng, d, INFS, False),
                "huge": lambda d: _numbers(rng, d, HUGE, True), "url": lambda d: _url(rng, d),
                "misplace": lambda d: _misplace(rng, d)}[kind](data)
        try:
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        except Exception:  # noqa: BLE001
            continue
    return {"seed": seed, "spec": name, "kinds": kinds, "text": text, "set": argv_set}


# ----- running one case --------------------------------------------------------------------------
def _child(case: dict, folder: str, mem_bytes: int) -> None:
    """In the forked child: the command, as the console script runs it; the outcome to result.json."""
    os.setsid()
    mp.current_process()._config["daemon"] = False  # a pool's worker is daemonic; this child may start workers
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    spec = os.path.join(folder, "spec.yaml")
    with open(spec, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(case["text"])
    fd_out = os.open(os.path.join(folder, "stdout"), os.O_WRONLY | os.O_CREAT)
    fd_err = os.open(os.path.join(folder, "stderr"), os.O_WRONLY | os.O_CREAT)
    os.dup2(fd_out, 1)
    os.dup2(fd_err, 2)
    os.chdir(folder)
    result: dict = {}
    try:
        from conveyor.tools.cli import main
        rc = main(["run", spec, "--steps", "3", "-q", *case["set"]])
        result = {"rc": rc}
    except SystemExit as exc:
        result = {"rc": exc.code if isinstance(exc.code, int) else 1}
    except BaseException as exc:  # noqa: BLE001 - what the fuzz is looking for
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/conveyor/" in f.filename]
        where = f"{frames[-1].filename.split('/conveyor/')[-1]}:{frames[-1].lineno}" if frames else "?"
        result = {"exc": type(exc).__name__, "msg": str(exc)[:300], "where": where,
                  "tb": "".join(traceback.format_exception(exc))[-3000:]}
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_case(case: dict, timeout: float, mem_bytes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fuzz-") as folder:
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                _child(case, folder, mem_bytes)
            finally:
                os._exit(3)
        status = None
        while time.monotonic() - t0 < timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return {"class": "hang", "took": round(time.monotonic() - t0, 2)}
        took = round(time.monotonic() - t0, 2)
        try:  # the run's own processes (workers) left behind: end the group
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        err = Path(folder, "stderr").read_text(errors="replace") if Path(folder, "stderr").exists() else ""
        try:
            result = json.loads(Path(folder, "result.json").read_text())
        except (OSError, ValueError):
            return {"class": "traceback", "exc": f"died (status {status})", "where": "?", "stderr": err[-2000:],
                    "took": took}
    if "exc" in result:
        return {"class": "traceback", **result, "took": took}
    if "Traceback (most recent call last)" in err:
        last = [line for line in err.splitlines() if line and not line.startswith(" ")][-1:]
        return {"class": "traceback", "exc": (last or ["?"])[0][:200], "where": "stderr", "stderr": err[-3000:],
                "rc": result["rc"], "took": took}
    return {"class": "ran" if result["rc"] == 0 else "error", "rc": result["rc"], "took": took,
            "last": err.strip().splitlines()[-1][:200] if err.strip() else ""}


class _CheckTimeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _CheckTimeout()


def check_case(case: dict, timeout: float) -> dict | None:
    """The spec read, its ``--set`` parsed and the whole spec checked, here in the worker, as
    ``conveyor run`` does before building anything (milliseconds): the outcome when the check
    refuses the spec (``error``), raises something else (``traceback``) or passes its time
    (``hang``); None when the spec checks and has to be run in a child of its own."""
    from conveyor.errors import ConveyorError, SpecErrors
    from conveyor.tools._args import UsageError, checked_plan
    from conveyor.tools.cli import build_parser

    t0 = time.monotonic()
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="fuzz-check-") as folder:
        spec = os.path.join(folder, "spec.yaml")
        with open(spec, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(case["text"])
        old = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            os.chdir(folder)
            args = build_parser().parse_args(["run", spec, "--steps", "3", "-q", *case["set"]])
            checked_plan(args)
        except _CheckTimeout:
            return {"class": "hang", "where": "check", "took": round(time.monotonic() - t0, 2)}
        except (SystemExit, UsageError, SpecErrors, FileNotFoundError, ConveyorError) as exc:
            last = str(exc).strip().splitlines()[-1:] if str(exc).strip() else [type(exc).__name__]
            return {"class": "error", "rc": 1, "took": round(time.monotonic() - t0, 3), "last": last[0][:200],
                    "at": "check"}
        except BaseException as exc:  # noqa: BLE001 - what the fuzz is looking for
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/conveyor/" in f.filename]
            where = f"{frames[-1].filename.split('/conveyor/')[-1]}:{frames[-1].lineno}" if frames else "?"
            return {"class": "traceback", "exc": type(exc).__name__, "msg": str(exc)[:300], "where": where,
                    "tb": "".join(traceback.format_exception(exc))[-3000:], "at": "check",
                    "took": round(time.monotonic() - t0, 2)}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            os.chdir(here)
    return None


def _limit_memory(mem_bytes: int) -> None:
    """A worker's own checks under the cases' address-space limit: a huge allocation while
    checking is a MemoryError (a traceback case), not a worker killed and its cases lost."""
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))


def _worker(args) -> list[dict]:
    seeds, specs, timeout, mem_bytes = args
    out = []
    for seed in seeds:
        case = make_case(seed, specs)
        outcome = check_case(case, timeout) or run_case(case, timeout, mem_bytes)
        out.append({**case, **outcome})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--first", type=int, default=0, help="seed of the first case")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="a case past this is a hang")
    ap.add_argument("--mem-gb", type=float, default=6.0, help="address-space limit of each case")
    ap.add_argument("--out", help="write every case as a JSON line here")
    ap.add_argument("--specs", help="comma-separated bundled spec names to mutate (default: all)")
    ap.add_argument("--skip-specs", default="", help="comma-separated bundled spec names to leave out")
    args = ap.parse_args(argv)
    import torch  # noqa: F401 - imported once, before the forks
    import conveyor.tools.cli  # noqa: F401
    specs = {p.name: p.read_text(encoding="utf-8").replace("${spec_dir}", str(SPECS_DIR))
             for p in sorted(SPECS_DIR.glob("*.yaml"))}
    if args.specs:
        specs = {k: v for k, v in specs.items() if k in args.specs.split(",") or k[:-5] in args.specs.split(",")}
    skip = set(filter(None, args.skip_specs.split(",")))
    specs = {k: v for k, v in specs.items() if k not in skip and k[:-5] not in skip}
    chunk = 10
    seeds = list(range(args.first, args.first + args.cases))
    tasks = [(seeds[i:i + chunk], specs, args.timeout, int(args.mem_gb * (1 << 30)))
             for i in range(0, len(seeds), chunk)]
    counts: collections.Counter = collections.Counter()
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    t0 = time.monotonic()
    out = open(args.out, "w", encoding="utf-8", errors="surrogatepass") if args.out else None
    mem_bytes = int(args.mem_gb * (1 << 30))
    with mp.get_context("fork").Pool(args.jobs, initializer=_limit_memory, initargs=(mem_bytes,),
                                     maxtasksperchild=20) as pool:
        for results in pool.imap_unordered(_worker, tasks):
            for r in results:
                counts[r["class"]] += 1
                if r["class"] in ("traceback", "hang"):
                    groups[(r["class"], r.get("exc", ""), r.get("where", ""))].append(r)
                if out:
                    out.write(json.dumps(r, ensure_ascii=True) + "\n")
            if out:
                out.flush()
            done = sum(counts.values())
            if done % 500 < chunk:
                print(f"{done} cases, {time.monotonic() - t0:.0f} s: {dict(counts)}", file=sys.stderr, flush=True)
    if out:
        out.close()
    print(f"{sum(counts.values())} specs: {counts['error']} clean errors, {counts['ran']} ran, "
          f"{counts['traceback']} tracebacks, {counts['hang']} hangs ({time.monotonic() - t0:.0f} s)")
    for (cls, exc, where), rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(rs):5d} {cls} {exc} at {where}  e.g. seed {rs[0]['seed']} ({rs[0]['spec']}, "
              f"{'+'.join(rs[0]['kinds'])}) {rs[0].get('msg', '')[:120]!r}")
    return 1 if counts["traceback"] or counts["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
