"""Every fact about an op lives in its OpSpec: no op name is tested anywhere else in
conveyor/graphs/, and each built-in op declares the facts the compiler and loader ask."""

from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

from conveyor.graphs.opspec import OpSpec
from conveyor.graphs.registry import builtin_op_names, get_op

ROOT = Path(__file__).resolve().parent.parent
GRAPHS = ROOT / "conveyor" / "graphs"
# the params whose change leaves the data the same, as the loader's SAFE_PARAMS had them
# before each op declared its own
SAFE_BEFORE = frozenset({"workers", "method", "mp_context", "depth", "snapshot_every", "enabled",
                         "concurrency", "attempts", "timeout", "backoff", "backoff_max", "cache",
                         "cache_size", "block_size", "read_ahead", "device", "non_blocking",
                         "share", "share_timeout",  # list_files's: who lists, not what (issue 31.4)
                         "adapt"})  # prefetch's: which thread makes the items, not which items


def op_name_literals(source: str, names: set[str], *, table: str | None = None) -> list[tuple[int, str]]:
    """``(line, name)`` for each string literal in ``source`` that is one of ``names``; with
    ``table``, the literals inside the assignment to that name are left out."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if table is not None and any(isinstance(t, ast.Name) and t.id == table for t in targets):
                skip |= {id(n) for n in ast.walk(node)}
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in names and id(node) not in skip)


def test_no_op_name_is_a_string_in_the_compiler_outside_the_op_definitions():
    names = set(builtin_op_names())
    found = []
    for path in sorted(GRAPHS.glob("*.py")):
        if path.name.startswith("ops"):  # the op definitions: ops.py, ops_map.py, ops_text.py ...
            continue
        table = "_BUILTIN" if path.name == "registry.py" else None
        found += [f"{path.relative_to(ROOT)}:{line}: {name!r}"
                  for line, name in op_name_literals(path.read_text(encoding="utf-8"), names, table=table)]
    assert not found, ("an op's name is tested outside its OpSpec; declare the fact as an OpSpec field "
                       "and ask the spec (conveyor/graphs/opspec.py):\n" + "\n".join(found))


def test_the_check_sees_a_name_in_code_and_not_in_a_docstring_or_the_table():
    source = ('"""shard: a docstring is not a test."""\n'
              '_BUILTIN = {"shard": "conveyor.graphs.ops:SHARD"}\n'
              'if op.name == "shard" or op.name in ("map", "x"):\n'
              '    pass\n')
    assert op_name_literals(source, {"shard", "map"}, table="_BUILTIN") == [(3, "map"), (3, "shard")]
    assert len(op_name_literals(source, {"shard"})) == 2


@pytest.mark.parametrize("name", builtin_op_names())
def test_every_builtin_op_declares_what_the_compiler_asks(name):
    op = get_op(name)
    assert isinstance(op, OpSpec)
    params = {f.name for f in dataclasses.fields(op.params)}
    assert op.safe_params <= params, f"{name}: safe_params names params it does not have"
    assert op.safe_params == SAFE_BEFORE & params, f"{name}: safe_params differ from the loader's old rule"
    assert op.length is not None or op.unknown_length, f"{name}: no length rule and no reason for none"
    assert op.keeps_count in ("always", "unless_skipping", "never")
    assert op.inputs != "none" or op.keeps_count == "never"
    assert pickle.loads(pickle.dumps(op)) == op, f"{name}: its OpSpec must pickle (plans go to processes)"


def test_the_facts_that_replaced_the_tables_of_op_names():
    """Which built-in ops answer yes, as the tables keyed by op name had it."""
    def having(fact):
        return sorted(n for n in builtin_op_names() if fact(get_op(n)))

    assert having(lambda op: op.listing) == ["list_files", "list_litdata", "list_lmdb", "list_mds"]
    assert having(lambda op: op.reads_from is not None) == ["list_files", "list_litdata", "list_lmdb", "list_mds"]
    assert having(lambda op: op.batches) == ["batch", "bucket_batch"]
    assert having(lambda op: op.collates) == ["collate", "pad_collate"]
    assert having(lambda op: op.pass_through) == ["pin_memory", "prefetch", "to_device"]
    assert having(lambda op: op.deal is not None) == ["shard"]
    assert having(lambda op: op.shards_itself) == ["iterable"]
    assert having(lambda op: op.not_global) == ["iterable", "mix", "shard", "shuffle_buffer"]
    assert having(lambda op: op.keeps_count == "always") == [
        "batch", "collate", "pad_collate", "pin_memory", "prefetch", "shuffle_buffer", "to_device"]
    assert having(lambda op: op.keeps_count == "unless_skipping") == ["fetch", "map", "read_samples"]
    assert having(lambda op: op.per_record is not False) == [
        "fetch", "filter", "list_files", "list_litdata", "list_lmdb", "list_mds", "map", "mix", "pack_tokens",
        "pin_memory", "prefetch", "read_jsonl", "read_lmdb", "read_parquet", "read_samples", "read_tar", "shard", "shuffle_buffer", "synthetic",
        "to_device"]
    assert having(lambda op: op.writes_rows) == ["map"]
    assert having(lambda op: op.batch_rows is not None) == ["batch"]
    assert having(lambda op: op.stacks_rows) == ["collate"]


def test_conveyors_own_fns_declare_their_rules_as_attributes():
    from conveyor import files, image, text
    from conveyor.graphs.fn_args import check_args, per_sample

    for fn in (image.decode, image.train_transform, image.eval_transform, text.byte_tokenize,
               text.vocab_tokenize, text.hf_tokenize, files.read_bytes, files.read_text, files.read_numbers):
        assert per_sample(fn), fn.__name__
    for fn in (image.decode, image.train_transform, image.eval_transform, text.byte_tokenize,
               text.vocab_tokenize, text.hf_tokenize):
        assert callable(fn.check_args), fn.__name__
    assert check_args("conveyor.image:eval_transform", image.eval_transform, {"size": 224, "resize": 200}) == [
        ("resize", "resize=200 must be an int >= the larger side of size=224")]
    assert check_args("conveyor.text:byte_tokenize", text.byte_tokenize, {"dtype": "uint8", "add_eos": True}) == [
        ("dtype", "dtype='uint8' cannot hold id 257 (eos_id); use a wider one")]

    def mine(item):  # a user's fn with no attributes: no rules, and not known to be per-sample
        return item

    assert check_args("m:mine", mine, {"x": 1}) == [] and not per_sample(mine)
