"""Regression cases for the classes the command-line fuzz (benchmarks/fuzz_specs.py, issue 32
items 6 and 7) found: each is a clear SpecError at check time, never a traceback or a walk of
the whole filesystem."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conveyor import SpecErrors
from conveyor.graphs.api import check_spec
from conveyor.graphs.ops import root_only
from conveyor.graphs.params import parse_set

REPO = Path(__file__).resolve().parent.parent


def _errors(spec, overrides=None):
    with pytest.raises(SpecErrors) as info:
        check_spec(spec, overrides)
    return info.value.errors


@pytest.mark.parametrize("value", ["&a [*a]", "&a [{k: *a}]", "[" * 300 + "]" * 300])
def test_a_recursive_or_deep_set_value_is_a_spec_error(value):
    try:
        overrides = parse_set([f"weights={value}"])
    except ValueError as exc:  # too deep for PyYAML itself: refused while reading --set
        assert "deeper than" in str(exc)
        return
    (err,) = _errors(str(REPO / "specs/balanced.yaml"), overrides)
    assert err.param == "weights" and ("contains itself" in err.message or "deeper than" in err.message)


def test_an_infinite_pad_value_is_a_spec_error():
    text = (REPO / "specs/text.yaml").read_text().replace("pad_value: 0,", "pad_value: .inf,")
    spec = REPO / "specs" / "_fuzz_inf.yaml"
    doc = text.replace("${spec_dir}", str(REPO / "specs"))
    from conveyor.graphs.yaml_loader import load_yaml
    errs = _errors(load_yaml(doc, str(spec)))
    assert any("pad value inf does not fit" in e.message for e in errs)


@pytest.mark.parametrize("url", ["", " ", "/", "file:///", "s3://", "s3://*", "/*/**", "/**/*.txt", "memory://"])
def test_an_empty_or_root_only_url_is_a_spec_error(url):
    from conveyor.graphs.yaml_loader import load_yaml
    spec = {"nodes": {"files": {"op": "list_files", "url": url}}, "output": "files"}
    (err,) = _errors(load_yaml(yaml.safe_dump(spec), "root.yaml"))
    assert err.node == "files" and err.param == "url" and "root-only" in err.message
    assert root_only(url)


@pytest.mark.parametrize("url", ["*.txt", "**", "x/*.txt", "/data/*.txt", "s3://b", "s3://b/*", "file:///tmp/x/*"])
def test_a_url_below_the_root_is_not_root_only(url):
    assert not root_only(url)


@pytest.mark.parametrize("key, value, param", [("workers", 2 ** 31, "workers"), ("out.depth", 99999999999, "depth")])
def test_huge_workers_and_prefetch_depth_are_spec_errors_naming_the_limit(key, value, param):
    (err,) = _errors(str(REPO / "specs/numbers.yaml"), {key: value})
    assert err.param == param and "expected at most" in err.message


def _moved(spec: str, order: list[str]) -> dict:
    from conveyor.graphs.yaml_loader import load_yaml
    doc = yaml.safe_load((REPO / "specs" / spec).read_text().replace("${spec_dir}", str(REPO / "specs")))
    doc["nodes"] = {k: doc["nodes"][k] for k in order}
    return load_yaml(yaml.safe_dump(doc, sort_keys=False), str(REPO / "specs" / spec))


@pytest.mark.parametrize("spec, order, node", [
    ("numbers.yaml", ["files", "shard", "shuffle", "batch", "parse", "collate", "out"], "parse"),
    ("imagenet.yaml", ["files", "shard", "shuffle", "batch", "fetch", "decode", "collate", "pin", "out"], "decode"),
])
def test_a_record_fn_after_a_batch_is_a_spec_error_naming_the_batch(spec, order, node):
    errs = _errors(_moved(spec, order))
    (err,) = [e for e in errs if e.node == node]
    assert err.param == "fn" and "node 'batch' (batch)" in err.message and "put this map before" in err.message


def test_a_record_fn_before_the_batch_checks():
    check_spec(str(REPO / "specs/numbers.yaml"))


@pytest.mark.parametrize("spec, key, value, param, words", [
    ("numbers.yaml", "batch_size", 2 ** 40, "size", "expected at most 1000000"),
    ("imagenet-eval.yaml", "image_size", 10 ** 9, "args", "larger than 16384 pixels"),
    ("synthetic.yaml", "count", 2 ** 63, "count", "expected at most"),
    ("synthetic.yaml", "image_size", 10 ** 6, "shape", "values an image"),
])
def test_huge_batch_image_and_synthetic_sizes_are_spec_errors_naming_the_limit(spec, key, value, param, words):
    errs = _errors(str(REPO / "specs" / spec), {key: value})
    assert any(e.param == param and words in e.message for e in errs), [str(e) for e in errs]


def test_a_huge_resize_is_a_spec_error_naming_the_limit():
    from conveyor import image
    assert any("larger than 16384" in m for _, m in image.eval_transform.check_args({"size": 224, "resize": 2 ** 63}))
    with pytest.raises(ValueError, match="16384"):
        image.eval_transform({"bytes": b""}, size=224, resize=10 ** 9)


def test_a_protocol_whose_package_is_missing_names_the_install(monkeypatch):
    import fsspec

    from conveyor.errors import SourceError
    from conveyor.graphs.yaml_loader import load_yaml
    from conveyor.storage import filesystem

    def missing(protocol):
        raise ImportError("Please install gcsfs to access Google Storage")

    monkeypatch.setattr(fsspec, "get_filesystem_class", missing)
    spec = {"nodes": {"files": {"op": "list_files", "url": "gs://bucket/train/*.jpg"}}, "output": "files"}
    (err,) = _errors(load_yaml(yaml.safe_dump(spec), "gs.yaml"))
    assert err.node == "files" and err.param == "url" and "pip install gcsfs" in err.message
    monkeypatch.setattr(fsspec.core, "url_to_fs", lambda url, **kw: missing("gs"))
    with pytest.raises(SourceError, match="pip install gcsfs"):
        filesystem("gs://bucket/x")


def test_out_of_memory_in_a_run_is_a_clear_error(monkeypatch, capsys):
    from conveyor.tools import cli, run

    def oom(args):
        exc = MemoryError("Unable to allocate 147. TiB")
        exc.add_note("in node 'batch' (batch)")
        raise exc

    monkeypatch.setattr(run, "cmd_run", oom)
    monkeypatch.setattr(cli.run, "cmd_run", oom)
    rc = cli.main(["run", str(REPO / "specs/numbers.yaml")])
    err = capsys.readouterr().err
    assert rc == 1 and "out of memory" in err and "in node 'batch'" in err and "Traceback" not in err


@pytest.mark.parametrize("spec, key, value, words", [
    ("pretrain.yaml", "seq_len", 10 ** 30, "expected at most 16777216"),
    ("imagenet-procs.yaml", "workers", 2 ** 40, "copies must be at most 1024"),
])
def test_huge_token_rows_and_worker_copies_are_spec_errors_naming_the_limit(spec, key, value, words):
    errs = _errors(str(REPO / "specs" / spec), {key: value})
    assert any(words in e.message for e in errs), [str(e) for e in errs]


def test_a_recursive_node_param_override_is_a_spec_error():
    (err,) = _errors(str(REPO / "specs/numbers.yaml"), parse_set(["batch.size=&a [*a]"]))
    assert err.node == "batch" and err.param == "size" and "contains itself" in err.message


def test_a_collate_before_the_batch_of_synthetic_records_is_a_spec_error():
    errs = _errors(_moved("synthetic.yaml", ["fake", "collate", "shard", "batch", "out"]))
    assert any(e.node == "collate" and "nothing before it makes batches" in e.message for e in errs)


def test_collate_and_pad_collate_name_what_they_got_as_sample_errors():
    from torchdata.nodes import IterableWrapper

    from conveyor.errors import SampleError
    from conveyor.nodes import Collate, PadCollate

    with pytest.raises(SampleError, match="collate takes a batch .* got one sample .*image"):
        next(iter(Collate(IterableWrapper([{"image": 1, "label": 2}]))))
    with pytest.raises(SampleError, match=r"fields \[5\] are not in the samples"):
        next(iter(PadCollate(IterableWrapper([[{"ids": [1, 2]}]]), fields=[5])))


def test_a_record_fn_after_a_collate_is_a_spec_error_naming_the_collate():
    errs = _errors(_moved("numbers.yaml", ["files", "batch", "shard", "collate", "shuffle", "parse", "out"]))
    (err,) = [e for e in errs if e.node == "parse"]
    assert "node 'collate' (collate)" in err.message and "hands on batches" in err.message


def test_read_bytes_names_what_it_got_instead_of_a_file_record():
    from conveyor.errors import SampleError
    from conveyor.files import read_numbers

    with pytest.raises(SampleError, match="expected a file record with a 'path' string .* got a list"):
        read_numbers([{"path": "a.txt"}])
    with pytest.raises(SampleError, match=r"got 'path' \['a.txt', 'b.txt'\]"):
        read_numbers({"path": ["a.txt", "b.txt"], "label": [0, 1]})


@pytest.mark.parametrize("flag", ["add_bos", "add_eos"])
def test_a_tokenizer_flag_that_is_not_a_boolean_is_a_spec_error(flag):
    (err,) = _errors(str(REPO / "specs/pretrain.yaml"), parse_set([f"tokenize.args={{{flag}: x, dtype: int16}}"]))
    assert err.node == "tokenize" and f"{flag}='x' must be true or false" in err.message


def test_an_image_fn_names_a_batch_it_got_instead_of_a_record():
    from conveyor import image
    from conveyor.errors import SampleError

    with pytest.raises(SampleError, match="expected an image record .* got a list"):
        image.decode([{"path": "a.jpg"}])
    with pytest.raises(SampleError, match=r"expected a path, got list \['a.jpg'\]"):
        image.decode({"path": ["a.jpg"], "index": 0})


def test_a_null_set_for_a_float_param_is_no_float_call():
    from conveyor.graphs.params import apply_overrides
    merged, errors = apply_overrides({"rate": 0.5}, {"rate": None}, where=("spec.yaml", 1, 1))
    assert errors or merged["rate"] is None


def test_a_url_that_is_no_glob_pattern_is_a_source_error(tmp_path):
    from conveyor.errors import SourceError
    from conveyor.nodes import ListFiles

    with pytest.raises(SourceError, match="not a glob pattern"):
        list(ListFiles(url=str(tmp_path) + "/*/|**"))
