"""What a ported script expects: bundled specs by name (and `conveyor specs`/`init`), tuple
batches, normalize inside the graph, and a warning for a root one level too high."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from conveyor import SpecErrors, load_graph
from conveyor.errors import SampleError
from conveyor.graphs import bundled
from conveyor.graphs.api import read_spec
from conveyor.image import IMAGENET_MEAN, IMAGENET_STD, normalize
from conveyor.nodes import ListFiles
from conveyor.tools import cli

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "examples/data/imagenet-sample/train"


def _first(loader):
    try:
        return next(iter(loader))
    finally:
        loader.close()


def test_a_bundled_spec_loads_by_name_as_the_checkout_file():
    assert {"imagenet", "numbers", "text"} <= set(bundled.bundled_names())
    assert read_spec("numbers").path == str((REPO / "specs/numbers.yaml").resolve())
    by_name = _first(load_graph("numbers", batch_size=4))
    by_path = _first(load_graph(str(REPO / "specs/numbers.yaml"), batch_size=4))
    assert torch.equal(by_name["x"], by_path["x"]) and torch.equal(by_name["index"], by_path["index"])


def test_a_name_is_not_a_path():
    assert bundled.is_name("imagenet") and not bundled.is_name("specs/imagenet.yaml")
    assert not bundled.is_name("imagenet.yaml") and not bundled.is_name("./imagenet")


def test_an_unknown_name_lists_the_bundled_ones():
    with pytest.raises(SpecErrors) as info:
        load_graph("imagnet")
    text = str(info.value.errors[0])
    assert "(did you mean 'imagenet'?)" in text and "numbers" in text


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The bundled specs as an installed package has them: no examples/ beside them."""
    folder = tmp_path / "site-packages/conveyor/specs"
    folder.mkdir(parents=True)
    for spec in (REPO / "specs").glob("*.yaml"):
        shutil.copy(spec, folder)
    monkeypatch.setattr(bundled, "bundled_dir", lambda: folder)
    return folder


def test_an_installed_bundled_spec_requires_its_root(installed):
    with pytest.raises(SpecErrors) as info:
        load_graph("imagenet")
    (err,) = info.value.errors
    assert err.param == "root" and err.line == 14
    assert "the bundled spec 'imagenet' has no sample data beside it; pass root=..." in err.message
    batch = _first(load_graph("imagenet", root=str(SAMPLE), batch_size=2, image_size=32))
    assert batch["image"].shape == (2, 3, 32, 32)


def test_a_required_param_is_a_spec_error_until_given(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text((REPO / "specs/numbers.yaml").read_text().replace(
        '"${spec_dir}/../examples/data/numbers"', '"???"'))
    with pytest.raises(SpecErrors) as info:
        load_graph(str(spec))
    assert [e.param for e in info.value.errors] == ["root"]
    assert "required, and not given: pass root=..." in info.value.errors[0].message
    assert _first(load_graph(str(spec), root=str(REPO / "examples/data/numbers")))["x"].shape[0] == 8


def test_conveyor_specs_lists_names_and_lines(capsys):
    assert cli.main(["specs"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("imagenet ") and "ImageNet-style training input" in line
               for line in out.splitlines())


def test_conveyor_init_writes_an_editable_copy_with_root_required(tmp_path, capsys):
    dst = tmp_path / "my.yaml"
    assert cli.main(["init", "imagenet", str(dst)]) == 0
    text = dst.read_text()
    assert 'root: "???"' in text and "${spec_dir}" not in text and "# Normalisation" in text
    with pytest.raises(SpecErrors) as info:
        load_graph(str(dst))
    assert info.value.errors[0].param == "root"
    assert _first(load_graph(str(dst), root=str(SAMPLE), batch_size=2, image_size=32))["image"].shape[0] == 2
    assert cli.main(["init", "imagenet", str(dst)]) == 2  # no silent overwrite
    assert cli.main(["init", "imagenet", str(dst), "--force"]) == 0
    assert cli.main(["init", "imagnet", str(tmp_path)]) == 1
    assert "did you mean 'imagenet'" in capsys.readouterr().err


def test_collate_as_tuple_gives_images_target_and_resumes():
    kw = {"batch_size": 4, "collate.as_tuple": ["x", "label"]}
    loader = load_graph("specs/numbers.yaml", **kw)
    it = iter(loader)
    x, label = next(it)
    assert x.shape == (4, 4) and label.shape == (4,)
    state = loader.state_dict()
    rest = [b[0] for b in it]
    loader.close()
    again = load_graph("specs/numbers.yaml", **kw)
    again.load_state_dict(state)
    resumed = [b[0] for b in again]
    again.close()
    assert len(resumed) == len(rest) and all(torch.equal(a, b) for a, b in zip(rest, resumed))
    plain = load_graph("specs/numbers.yaml", batch_size=4)  # a dict state, the same positions
    next(iter(plain))
    tuple_graph = load_graph("specs/numbers.yaml", **kw)
    tuple_graph.load_state_dict(plain.state_dict(), strict=False)
    assert isinstance(next(iter(tuple_graph)), tuple)
    plain.close(), tuple_graph.close()


def test_collate_as_tuple_is_checked_with_the_spec():
    with pytest.raises(SpecErrors) as info:
        load_graph("specs/numbers.yaml", **{"collate.as_tuple": ["x", "x"]})
    assert "named twice" in info.value.errors[0].message
    loader = load_graph("specs/numbers.yaml", **{"collate.as_tuple": ["x", "target"]})
    with pytest.raises(SampleError, match="as_tuple names fields \\['target'\\]"):
        _first(loader)


def test_normalize_in_the_graph(tmp_path):
    spec = tmp_path / "cpu.yaml"
    spec.write_text(f"""
nodes:
  files:   {{op: list_files, url: "{SAMPLE}/*/**", label: top_dir}}
  fetch:   {{op: fetch}}
  decode:  {{op: map, fn: conveyor.image:eval_transform, args: {{size: 32, resize: 36}}}}
  batch:   {{op: batch, size: 4}}
  collate: {{op: collate, as_tuple: [image, label]}}
  norm:    {{op: map, fn: conveyor.image:normalize}}
output: norm
""")
    images, label = _first(load_graph(str(spec)))
    raw = _first(load_graph(str(spec), **{"norm.args": {"mean": [0, 0, 0], "std": [1, 1, 1]}}))[0]
    assert images.dtype == torch.float32 and label.shape == (4,)
    mean = torch.tensor(IMAGENET_MEAN).view(-1, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(-1, 1, 1)
    assert torch.allclose(images, (raw - mean) / std, atol=1e-5)
    with pytest.raises(SpecErrors) as info:
        load_graph(str(spec), **{"norm.args": {"std": [1, 0, 1], "dtype": "int8"}})
    text = " ".join(e.message for e in info.value.errors)
    assert "arg 'std'" in text and "arg 'dtype'" in text


def test_normalize_takes_a_record_and_keeps_the_tensor_path():
    img = torch.full((3, 2, 2), 255, dtype=torch.uint8)
    out = normalize({"image": img, "label": 3}, dtype="float16")
    assert out["label"] == 3 and out["image"].dtype == torch.float16
    assert torch.allclose(normalize(img), ((1 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD))
                          .view(-1, 1, 1).expand(3, 2, 2))


def test_split_names_as_classes_warn_that_the_root_is_too_high(tmp_path, caplog):
    for split in ("train", "val"):
        (tmp_path / split / "cat").mkdir(parents=True)
        (tmp_path / split / "cat" / "1.jpg").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="conveyor.nodes.list_files"):
        ListFiles(url=f"{tmp_path}/*/**", label="top_dir").count()
    assert "one level too high" in caplog.text and f"{tmp_path}/train" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="conveyor.nodes.list_files"):
        ListFiles(url=f"{tmp_path}/train/*/**", label="top_dir").count()
    assert "too high" not in caplog.text


def test_synthetic_records_are_deterministic_and_shaped_like_decoded_images():
    from conveyor.nodes import Synthetic

    a = list(Synthetic(count=6, shape=[3, 8, 8], classes=5, seed=1))
    b = list(Synthetic(count=6, shape=[3, 8, 8], classes=5, seed=1))
    assert [r["index"] for r in a] == list(range(6))
    assert all(torch.equal(x["image"], y["image"]) and x["label"] == y["label"] for x, y in zip(a, b))
    assert a[0]["image"].dtype == torch.uint8 and a[0]["image"].shape == (3, 8, 8)
    assert not torch.equal(a[0]["image"], a[1]["image"]) and all(0 <= r["label"] < 5 for r in a)
    other = list(Synthetic(count=6, shape=[3, 8, 8], classes=5, seed=2))
    assert not torch.equal(a[0]["image"], other[0]["image"])
    floats = next(iter(Synthetic(count=1, shape=[1, 4, 4], dtype="float32")))["image"]
    assert floats.dtype == torch.float32
    with pytest.raises(ValueError, match="shape="):
        Synthetic(count=1, shape=[3, 4])


def test_synthetic_spec_runs_resumes_exactly_and_shards():
    kw = {"count": 64, "image_size": 8, "batch_size": 4}
    loader = load_graph("synthetic", **kw)
    assert len(loader) == 16
    it = iter(loader)
    first = [next(it) for _ in range(5)]
    state = loader.state_dict()
    rest = list(it)
    loader.close()
    assert isinstance(first[0], tuple) and first[0][0].shape == (4, 3, 8, 8)
    again = load_graph("synthetic", **kw)
    again.load_state_dict(state)
    resumed = list(again)
    again.close()
    assert len(resumed) == len(rest) == 11
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(rest, resumed))
    with pytest.raises(SpecErrors) as info:
        load_graph("synthetic", **{"fake.shape": [3, 0, 8]})
    assert info.value.errors[0].param == "shape"


def test_synthetic_deals_by_rank(monkeypatch):
    spec = {"count": 12, "image_size": 4, "batch_size": 1, "collate.as_tuple": None}
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = load_graph("synthetic", **spec)
        seen.append([int(b["index"]) for b in loader])
        loader.close()
    assert sorted(seen[0] + seen[1]) == list(range(12)) and len(seen[0]) == 6
