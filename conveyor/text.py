"""Built-in map functions for text: byte-level, whitespace/vocabulary and Hugging Face tokenizers.

Each takes a record (a dict such as ``read_jsonl`` yields, or a bare string) and returns
``{"input_ids": 1-D int64 tensor (or ``dtype``'s), ...}`` carrying the record's ``index``, ``label``,
``file`` and ``line`` (or ``row``, read_parquet's) when it has them, ready for ``bucket_batch`` (``length: input_ids``)
and ``pad_collate``. Any user function that returns ids as a list, a 1-D tensor or a 1-D numpy
array in a field works the same way.

- ``byte_tokenize``: the UTF-8 bytes of the text are the ids (0..255); no vocabulary file.
  ``add_bos``/``add_eos`` add ids 256/257 by default.
- ``vocab_tokenize``: whitespace split, ids from a vocabulary file (one token per line, the
  id is the line number), unknown tokens map to ``unk``. The file is read once per path and
  kept (per process), so a map over millions of records reads it once.
- ``hf_tokenize``: a Hugging Face ``tokenizers`` tokenizer from a ``tokenizer.json`` file
  (``pip install conveyor[text]``), read once per path and process; ``train_tokenizer`` makes
  a small one from JSONL files (tests, examples).

All three also take a *list* of records and return a list of outputs, which is how ``map``
with ``batch: N`` calls them: one call tokenizes N records (``encode_batch``, in Rust and in
parallel, for ``hf_tokenize``; one buffer for ``byte_tokenize``; a loop for
``vocab_tokenize``). The ids of a list from the first two are 1-D numpy arrays, views of one
buffer per call (a tensor each would cost more than tokenizing a short text); ``pad_collate``
and ``collate`` turn them into tensors per batch.

``dtype`` (default ``int64``, what embedding layers take) may name a narrower integer type
that holds every id: ``uint8`` for bytes, ``int32`` for a vocabulary. The ids then take an
eighth or half the memory while they wait in a shuffle or in length buckets (measured on
the text graph: ~1.4 us per record less, most of it memory traffic), and ``pad_collate``
with ``dtype: int64`` widens them in the copy that pads them.

``max_length`` truncates to at most that many ids, specials included (an ``eos`` stays last).
A record without the field, whose field is not a string or is not valid Unicode (a lone
surrogate such as ``"\\ud800"``), raises ``SampleError`` naming the record's file and line when
it has them.
"""

from __future__ import annotations

import functools
import glob as _glob
import itertools
from typing import Any, Iterable

import fsspec
import numpy as np
import torch

from conveyor.errors import SampleError

BOS_ID = 256
EOS_ID = 257
CARRIED = ("index", "label", "file", "line")
ROW = "row"  # read_parquet's provenance in place of read_jsonl's line: carried where there is no line
ID_DTYPES = ("int64", "int32", "int16", "uint8")
# each dtype with its largest id, made once: np.iinfo on every call was a third of byte_tokenize's time
_ID_TYPES = {name: (np.dtype(name), int(np.iinfo(name).max)) for name in ID_DTYPES}


def _where(item: Any) -> str:
    if isinstance(item, dict):
        if "file" in item and "line" in item:
            return f"{item['file']}:{item['line']}"
        if "file" in item and "row" in item:  # read_parquet's provenance
            return f"{item['file']} row {item['row']}"
        if "path" in item:
            return str(item["path"])
        if "index" in item:
            return f"item {item['index']}"
    return "item"


def _text(item: Any, field: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, list):
        raise SampleError(f"expected a record (a dict with {field!r}) or a string, got a list of {len(item)}")
    if not isinstance(item, dict) or field not in item:
        raise SampleError(f"{_where(item)}: no field {field!r} to tokenize"
                          + (f" (fields: {', '.join(map(str, item))})" if isinstance(item, dict) else ""))
    text = item[field]
    if not isinstance(text, str):
        raise SampleError(f"{_where(item)}: field {field!r} is "
                          f"{'null' if text is None else type(text).__name__}, expected a string")
    return text


def _utf8(item: Any, text: str, field: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SampleError(f"{_where(item)}: field {field!r} is not valid Unicode ({exc.reason} at "
                          f"character {exc.start}); no tokenizer can encode it") from None


def _check_unicode(item: Any, text: str, field: str) -> None:
    if not text.isascii():
        _utf8(item, text, field)


def _out(item: Any, ids: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"input_ids": ids}
    if isinstance(item, dict):
        for key in CARRIED:
            if key in item:
                out[key] = item[key]
        if ROW in item and "line" not in item:
            out[ROW] = item[ROW]
    return out


def _outs(items: list, ids: list) -> list[dict[str, Any]]:
    """``_out`` of each item and its ids, for a list (the carried keys looked up once per key)."""
    if items and type(items[0]) is dict and "index" in items[0] and "file" in items[0] and "line" in items[0]:
        try:  # what read_jsonl gives, in dict displays (half the time of filling dicts key by key)
            if "label" in items[0]:
                return [{"input_ids": x, "index": item["index"], "label": item["label"], "file": item["file"],
                         "line": item["line"]} for item, x in zip(items, ids)]
            return [{"input_ids": x, "index": item["index"], "file": item["file"], "line": item["line"]}
                    if "label" not in item else _out(item, x) for item, x in zip(items, ids)]
        except (KeyError, TypeError):  # an item without one of them, or not a dict
            pass
    outs: list[dict[str, Any]] = [{"input_ids": x} for x in ids]
    if items and type(items[0]) is dict:
        for key in CARRIED:
            for item, out in zip(items, outs):
                if type(item) is dict and key in item:
                    out[key] = item[key]
        for item, out in zip(items, outs):
            if type(item) is dict and ROW in item and "line" not in item:
                out[ROW] = item[ROW]
    elif items:
        return [_out(item, x) for item, x in zip(items, ids)]
    return outs


def _views(buf: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """``buf`` cut into consecutive views of ``lengths``."""
    ends = list(itertools.accumulate(lengths))
    return [buf[e - n:e] for n, e in zip(lengths, ends)]


def ids_dtype(dtype: str, top: int, what: str) -> np.dtype:
    """The numpy dtype named ``dtype`` (one of ``ID_DTYPES``), checked to hold ids up to
    ``top`` (``what`` says where that id comes from)."""
    if dtype not in ID_DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {', '.join(ID_DTYPES)}")
    dt, most = _ID_TYPES[dtype]
    if top > most:
        raise ValueError(f"dtype={dtype!r} cannot hold id {top} ({what}); use a wider one")
    return dt


def _check_max_length(max_length: int | None, specials: int) -> None:
    if max_length is not None and (not isinstance(max_length, int) or max_length <= specials):
        raise ValueError(f"{max_length=} must be an int > {specials} (the special tokens it keeps)")


def _assemble(body: torch.Tensor, bos: int | None, eos: int | None, max_length: int | None) -> torch.Tensor:
    n_special = (bos is not None) + (eos is not None)
    if max_length is not None and body.numel() > max_length - n_special:
        body = body[: max_length - n_special]
    if not n_special:
        return body
    parts = ([torch.tensor([bos], dtype=body.dtype)] if bos is not None else []) + [body] + (
        [torch.tensor([eos], dtype=body.dtype)] if eos is not None else [])
    return torch.cat(parts)


def byte_tokenize(item: Any, *, field: str = "text", max_length: int | None = None, add_bos: bool = False,
                  add_eos: bool = False, bos_id: int = BOS_ID, eos_id: int = EOS_ID, dtype: str = "int64") -> Any:
    """UTF-8 bytes as token ids.

    Args:
        item: a record with a text field, or a string; or a list of them (a batch: see the
            module docstring).
        field: the record's text field.
        max_length: keep at most this many ids (specials included); ``None`` keeps all.
        add_bos: start with ``bos_id``.
        add_eos: end with ``eos_id`` (kept last when truncating).
        bos_id: id of the start token (default 256, just past the byte range).
        eos_id: id of the end token (default 257).
        dtype: the ids' integer type (see the module docstring): ``uint8`` holds bytes but
            not the default ``bos_id``/``eos_id``.

    Returns:
        ``{"input_ids": Tensor[n] of dtype, "index", "label", "file", "line", "row"}`` (those the
        item has); for a list, a list of such dicts whose ids are numpy arrays of dtype.

    Example:
        >>> byte_tokenize({"text": "hé", "index": 7})["input_ids"].tolist()
        [104, 195, 169]
        >>> byte_tokenize("abc", max_length=3, add_eos=True)["input_ids"].tolist()
        [97, 98, 257]
        >>> [o["input_ids"].tolist() for o in byte_tokenize(["ab", "c"])]
        [[97, 98], [99]]
    """
    _check_max_length(max_length, add_bos + add_eos)
    dt = _byte_dtype(dtype, add_bos, add_eos, bos_id, eos_id)
    if isinstance(item, list):
        return _byte_batch(item, field, max_length, bos_id if add_bos else None, eos_id if add_eos else None, dt)
    data = _utf8(item, _text(item, field), field)
    body = torch.from_numpy(np.frombuffer(data, np.uint8).astype(dt))
    ids = _assemble(body, bos_id if add_bos else None, eos_id if add_eos else None, max_length)
    return _out(item, ids)


def _byte_dtype(dtype: str, add_bos: bool, add_eos: bool, bos_id: int, eos_id: int) -> np.dtype:
    specials = [(i, n) for i, n, on in ((bos_id, "bos_id", add_bos), (eos_id, "eos_id", add_eos)) if on]
    top, what = max(specials + [(255, "a byte")])
    return ids_dtype(dtype, top, what)


def _item_bytes(item: Any, field: str) -> bytes:
    """One record's text as UTF-8, or an error naming the record."""
    text = item.get(field) if type(item) is dict else item
    if type(text) is not str:
        text = _text(item, field)  # raises, naming the record
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _utf8(item, text, field)  # raises, naming the record


def _byte_batch(items: list, field: str, max_length: int | None, bos: int | None,
                eos: int | None, dtype: np.dtype) -> list[dict[str, Any]]:
    """``byte_tokenize`` of a list: every text's bytes in one buffer of ``dtype``, a view each."""
    keep = None if max_length is None else max_length - (bos is not None) - (eos is not None)
    try:  # the common case at C speed: dicts whose field is a str (str.encode refuses anything else)
        datas = list(map(str.encode, [item[field] for item in items]))
    except (KeyError, TypeError, AttributeError, UnicodeEncodeError):
        datas = [_item_bytes(item, field) for item in items]  # raises, naming the record
    if keep is not None:
        datas = [d[:keep] for d in datas]  # a bytes no longer than keep is itself
    body = np.frombuffer(bytearray().join(datas), np.uint8)  # (writable, unlike a bytes' buffer)
    if bos is None and eos is None:
        lengths = [len(d) for d in datas]
        buf = body if dtype == np.uint8 else body.astype(dtype)
    else:
        extra = (bos is not None) + (eos is not None)
        lengths = [len(d) + extra for d in datas]
        ends = np.cumsum(lengths, dtype=np.int64)
        starts = ends - np.asarray(lengths, dtype=np.int64)
        buf = np.empty(int(ends[-1]) if lengths else 0, dtype)
        is_body = np.ones(buf.shape[0], bool)
        if bos is not None:
            is_body[starts] = False
            buf[starts] = bos
        if eos is not None:
            is_body[ends - 1] = False
            buf[ends - 1] = eos
        buf[is_body] = body
    return _outs(items, _views(buf, lengths))


@functools.lru_cache(maxsize=16)
def load_vocab(path: str) -> dict[str, int]:
    """The vocabulary at ``path`` (local or any fsspec URL) as token -> id, read once per path.

    One token per line; the id is the 0-based line number. A token given twice keeps its first id.
    CRLF line ends and a leading UTF-8 byte order mark, as Windows tools write them, are not part
    of any token.
    """
    with fsspec.open(path, "r", encoding="utf-8") as f:
        text = f.read().removeprefix("\ufeff")  # a byte order mark (Windows tools) is not part of token 0
        lines = [ln.rstrip("\r") for ln in text.split("\n")]  # not splitlines: \x85, \u2028 are tokens
    vocab: dict[str, int] = {}
    for i, tok in enumerate(lines):
        if tok and tok not in vocab:
            vocab[tok] = i
    if not vocab:
        raise ValueError(f"vocabulary file {path!r} is empty")
    return vocab


def vocab_tokenize(item: Any, *, vocab: str, field: str = "text", max_length: int | None = None,
                   unk: str = "<unk>", bos: str | None = None, eos: str | None = None,
                   lowercase: bool = False) -> Any:
    """Whitespace tokens mapped to ids through a vocabulary file.

    Args:
        item: a record with a text field, or a string; or a list of them (``map`` with
            ``batch: N``), which gives a list of outputs.
        vocab: path or URL of the vocabulary (one token per line, id = line number).
        field: the record's text field.
        max_length: keep at most this many ids (specials included).
        unk: the token that unknown words map to; it must be in the vocabulary.
        bos: a start token (e.g. ``"<bos>"``) to add, or ``None``.
        eos: an end token to add (kept last when truncating), or ``None``.
        lowercase: lowercase the text before the lookup.

    Example:
        >>> vocab_tokenize("the cat", vocab="examples/data/text-sample/vocab.txt")["input_ids"].shape
        torch.Size([2])
    """
    table = load_vocab(str(vocab))
    specials = []
    for name, tok in (("unk", unk), ("bos", bos), ("eos", eos)):
        if tok is not None and tok not in table:
            raise ValueError(f"{name}={tok!r} is not in the vocabulary {vocab!r}")
        specials.append(None if tok is None else table[tok])
    unk_id, bos_id, eos_id = specials
    _check_max_length(max_length, (bos is not None) + (eos is not None))
    if isinstance(item, list):
        return [_vocab_ids(x, table, field, max_length, unk_id, bos_id, eos_id, lowercase) for x in item]
    return _vocab_ids(item, table, field, max_length, unk_id, bos_id, eos_id, lowercase)


def _vocab_ids(item: Any, table: dict[str, int], field: str, max_length: int | None, unk_id: int,
               bos_id: int | None, eos_id: int | None, lowercase: bool) -> dict[str, Any]:
    text = _text(item, field)
    _check_unicode(item, text, field)
    if lowercase:
        text = text.lower()
    get = table.get
    body = torch.tensor([get(tok, unk_id) for tok in text.split()], dtype=torch.long)
    return _out(item, _assemble(body, bos_id, eos_id, max_length))


# ----- Hugging Face tokenizers ----------------------------------------------------------------

def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ImportError("conveyor.text:hf_tokenize needs Hugging Face tokenizers: "
                          "pip install 'conveyor[text]' (or pip install tokenizers)") from None
    return tokenizers


@functools.lru_cache(maxsize=16)
def load_tokenizer(path: str, max_length: int | None = None) -> Any:
    """The ``tokenizers.Tokenizer`` saved at ``path`` (local or any fsspec URL), read once per
    path and process; truncating to ``max_length`` ids (specials included) when given and
    never otherwise, whatever truncation the file was saved with (as transformers' fast
    tokenizers do unless asked to truncate), and never padding (``pad_collate`` pads).

    Raises:
        ValueError: the file cannot be read or is not a tokenizer ``tokenizers`` can load;
            the message names the path.
    """
    tokenizers = _tokenizers()
    try:
        with fsspec.open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ValueError(f"cannot read the tokenizer file {path!r}: {why}") from None
    try:
        tok = tokenizers.Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises its own Exception for a bad file
        raise ValueError(f"{path!r} is not a tokenizer.json that Hugging Face tokenizers can load: {exc}") from None
    tok.no_padding()
    if max_length is not None:
        tok.enable_truncation(max_length)
    else:  # a file saved with truncation on would cut every longer text, unasked and uncounted
        tok.no_truncation()
    return tok


def _hf_check_args(args: dict[str, Any]) -> list[tuple[str, str]]:
    """``hf_tokenize``'s rules, checked with the spec (conveyor/graphs/fn_args.py): the
    tokenizer file loads, ``max_length`` is valid."""
    path = args.get("tokenizer")
    if not isinstance(path, str) or not path:
        return [("tokenizer", f"hf_tokenize needs the path of a tokenizer.json, got {path!r}")]
    max_length = args.get("max_length")
    try:
        _check_max_length(max_length, 0)
    except ValueError as exc:
        return [("max_length", str(exc))]
    try:
        tok = load_tokenizer(path, max_length)
    except (ValueError, ImportError) as exc:
        return [("tokenizer", str(exc))]
    try:
        _hf_specials(tok, max_length, args.get("add_special_tokens", True))
    except ValueError as exc:
        return [("max_length", str(exc))]
    try:
        _hf_dtype(tok, args.get("dtype", "int64"))
    except ValueError as exc:
        return [("dtype", str(exc))]
    return []


def _hf_specials(tok: Any, max_length: int | None, add_special_tokens: Any) -> None:
    """``max_length`` must leave room past the special tokens the tokenizer adds: where it does
    not, tokenizers does not truncate at all (max_length 1 with [CLS] and [SEP] kept every id)."""
    if max_length is not None and add_special_tokens:
        _check_max_length(max_length, tok.num_special_tokens_to_add(False))


def hf_tokenize(item: Any, *, tokenizer: str, field: str = "text", max_length: int | None = None,
                add_special_tokens: bool = True, dtype: str = "int64") -> Any:
    """Token ids from a Hugging Face ``tokenizers`` tokenizer (a ``tokenizer.json`` file).

    Give it a list (``map`` with ``batch: N``) and it runs ``encode_batch`` once for the list:
    in Rust, on all cores, without the per-record Python that dominates a short text.

    Args:
        item: a record with a text field, or a string; or a list of them.
        tokenizer: path or URL of the ``tokenizer.json``; checked when the spec is checked.
        field: the record's text field.
        max_length: keep at most this many ids, specials included (the tokenizer truncates);
            ``None`` keeps all, even where the tokenizer.json was saved with truncation on.
        add_special_tokens: add the tokenizer's special tokens (its post-processor's).
        dtype: the ids' integer type (see the module docstring); it must hold the
            vocabulary's largest id (``int32`` holds any real one).

    Returns:
        ``{"input_ids": Tensor[n] of dtype, "index", "label", "file", "line", "row"}`` (those the
        item has); for a list, a list of such dicts whose ids are numpy arrays of dtype.

    Example:
        >>> hf_tokenize({"text": "the cat"}, tokenizer="tokenizer.json")["input_ids"]  # doctest: +SKIP
        tensor([262, 3012])
    """
    _check_max_length(max_length, 0)
    tok = load_tokenizer(str(tokenizer), max_length)
    _hf_specials(tok, max_length, add_special_tokens)
    dt = _hf_dtype(tok, dtype)
    if not isinstance(item, list):
        text = _text(item, field)
        try:
            ids = tok.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as exc:  # tokenizers' own errors: name the record
            _check_unicode(item, text, field)
            raise SampleError(f"{_where(item)}: the tokenizer failed: {type(exc).__name__}: {exc}") from exc
        return _out(item, torch.from_numpy(np.array(ids, dtype=dt)))
    texts = [_text(x, field) for x in item]
    try:
        encodings = tok.encode_batch(texts, add_special_tokens=add_special_tokens)
    except Exception as exc:  # find the record it failed on
        for x, text in zip(item, texts):
            _check_unicode(x, text, field)
        raise SampleError(f"the tokenizer failed on a list of {len(item)} records "
                          f"({_where(item[0])} ...): {type(exc).__name__}: {exc}") from exc
    all_ids = [e.ids for e in encodings]
    lengths = [len(ids) for ids in all_ids]
    buf = np.fromiter(itertools.chain.from_iterable(all_ids), dt, sum(lengths))
    return _outs(item, _views(buf, lengths))


def _hf_dtype(tok: Any, dtype: str) -> np.dtype:
    return ids_dtype(dtype, tok.get_vocab_size(with_added_tokens=True) - 1, "the tokenizer's largest id")


hf_tokenize.check_args = _hf_check_args  # type: ignore[attr-defined]


def train_tokenizer(files: str | Iterable[str], path: str, *, vocab_size: int = 1000, field: str = "text",
                    special_tokens: tuple[str, ...] = ("<pad>", "<unk>", "<bos>", "<eos>")) -> str:
    """Train a small byte-level BPE tokenizer on JSONL files and save it as ``path``.

    For tests, examples and trying ``hf_tokenize`` on the bundled sample (about a second);
    a real job uses the tokenizer.json of its model.

    Args:
        files: a glob (``"examples/data/text-sample/*.jsonl"``) or a list of local paths, read
            as ``read_jsonl`` reads them (compressed ones too); records without a string
            ``field`` are passed over.
        path: where to write the tokenizer.json.
        vocab_size: the vocabulary's size (the 256 byte symbols and the specials included).
        field: the records' text field.
        special_tokens: added first, with ids 0, 1, ...

    Returns:
        ``path``.

    Example:
        >>> train_tokenizer("examples/data/text-sample/*.jsonl", "/tmp/tok.json")  # doctest: +SKIP
        '/tmp/tok.json'
    """
    from torchdata.nodes import IterableWrapper

    from conveyor.nodes.read_jsonl import ReadJsonl

    tokenizers = _tokenizers()
    paths = sorted(_glob.glob(files)) if isinstance(files, str) else list(files)
    if not paths:
        raise ValueError(f"no files to train a tokenizer on: {files!r}")

    def texts() -> Iterable[str]:
        # read as the graph reads them (a byte order mark, blank lines, .gz; a bad line named
        # file:line): json.loads per line failed on what read_jsonl takes, naming no file
        records = ReadJsonl(IterableWrapper([{"path": p, "index": i} for i, p in enumerate(paths)]), field=None)
        try:
            for record in records:
                text = record.get(field)
                if isinstance(text, str):
                    yield text
        finally:  # also when the trainer stops reading early or fails: the open file
            records.close()

    byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = byte_level
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
                                             show_progress=False)
    tok.train_from_iterator(texts(), trainer)
    tok.save(path)
    return path
