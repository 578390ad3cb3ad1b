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

Each tokenizer declares its rules as attributes (conveyor/graphs/fn_args.py): ``check_args``
(``max_length``, ``dtype``, the tokenizer file, checked when the spec is) and ``per_sample``.
The helpers they share (the text field, provenance, dtypes, truncation) are in
``conveyor/_text_ids.py``.
"""

from __future__ import annotations

import functools
import glob as _glob
import itertools
from typing import Any, Iterable, Mapping

import fsspec
import numpy as np
import torch

from conveyor._id_blocks import IdsBlock
from conveyor._text_ids import (CARRIED, ID_DTYPES, ROW, _assemble, _byte_batch, _byte_buffer, _byte_dtype,  # noqa: F401
                                _block_records, _check_max_length, carried, _check_unicode, _hf_dtype, _hf_specials, _out,
                                _outs, _text, _tokenizers, _utf8, _views, _vocab_ids, _where, ids_dtype)
from conveyor.errors import SampleError, check_message

BOS_ID = 256
EOS_ID = 257


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
    flags = _flag_problems({"add_bos": add_bos, "add_eos": add_eos})
    if flags:
        raise ValueError(flags[0][1])
    _check_max_length(max_length, add_bos + add_eos)
    dt = _byte_dtype(dtype, add_bos, add_eos, bos_id, eos_id)
    if isinstance(item, list):
        return _byte_batch(item, field, max_length, bos_id if add_bos else None, eos_id if add_eos else None, dt)
    data = _utf8(item, _text(item, field), field)
    body = torch.from_numpy(np.frombuffer(data, np.uint8).astype(dt))
    ids = _assemble(body, bos_id if add_bos else None, eos_id if add_eos else None, max_length)
    return _out(item, ids)


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


# ----- Hugging Face tokenizers ----------------------------------------------------------------

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


def _hf_check_args(args: Mapping[str, Any]) -> list[tuple[str, str]]:
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
    buf, lengths = _hf_buffer(item, field, tok, add_special_tokens, dt)
    return _outs(item, _views(buf, lengths))


def _hf_buffer(items: list, field: str, tok: Any, add_special_tokens: bool, dt: np.dtype) -> tuple[np.ndarray, list[int]]:
    """The ids of a list's texts, one ``encode_batch``, in one buffer of ``dt``; each text's count."""
    texts = [_text(x, field) for x in items]
    try:
        encodings = tok.encode_batch(texts, add_special_tokens=add_special_tokens)
    except Exception as exc:  # find the record it failed on
        for x, text in zip(items, texts):
            _check_unicode(x, text, field)
        raise SampleError(f"the tokenizer failed on a list of {len(items)} records "
                          f"({_where(items[0])} ...): {type(exc).__name__}: {exc}") from exc
    all_ids = [e.ids for e in encodings]
    lengths = [len(ids) for ids in all_ids]
    return np.fromiter(itertools.chain.from_iterable(all_ids), dt, sum(lengths)), lengths


def _hf_columns(items: list, *, tokenizer: str, field: str = "text", max_length: int | None = None,
                add_special_tokens: bool = True, dtype: str = "int64") -> IdsBlock:
    """``hf_tokenize`` of a list as one ``IdsBlock`` (see ``_byte_columns``)."""
    _check_max_length(max_length, 0)
    tok = load_tokenizer(str(tokenizer), max_length)
    _hf_specials(tok, max_length, add_special_tokens)
    dt = _hf_dtype(tok, dtype)
    if type(items) is not list:
        raise TypeError(f"hf_tokenize's columns take a list, got {type(items).__name__}")
    buf, lengths = _hf_buffer(items, field, tok, add_special_tokens, dt)
    return IdsBlock(buf, np.array(lengths, dtype=np.int64), items, _block_records, carried=carried)




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
    from conveyor._line_files import iter_records

    tokenizers = _tokenizers()
    paths = sorted(_glob.glob(files)) if isinstance(files, str) else list(files)
    if not paths:
        raise ValueError(f"no files to train a tokenizer on: {files!r}")

    def texts() -> Iterable[str]:
        # read as the graph's read_jsonl reads them (a byte order mark, blank lines, .gz; a bad line
        # named file:line): json.loads per line failed on what read_jsonl takes, naming no file
        records = iter_records(paths)
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


# ----- what each fn declares (conveyor/graphs/fn_args.py): its args' rules, checked with the spec


def _max_length_rule(args: Mapping[str, Any], specials: int) -> list[tuple[str, str]]:
    if "max_length" not in args:
        return []
    message = check_message(lambda: _check_max_length(args["max_length"], specials))
    return [("max_length", message)] if message else []


def _flag_problems(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``add_bos``/``add_eos`` are true or false (``add_eos: x`` was a TypeError in the first call)."""
    return [(name, f"{name}={args[name]!r} must be true or false") for name in ("add_bos", "add_eos")
            if name in args and not isinstance(args[name], bool)]


def _byte_rules(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``add_bos``/``add_eos`` are booleans; ``max_length`` leaves room for the specials;
    ``dtype`` holds every id."""
    problems = _flag_problems(args)
    if problems:
        return problems
    problems = _max_length_rule(args, bool(args.get("add_bos")) + bool(args.get("add_eos")))
    if "dtype" in args:
        message = check_message(lambda: _byte_dtype(
            args["dtype"], bool(args.get("add_bos")), bool(args.get("add_eos")),
            args.get("bos_id", BOS_ID), args.get("eos_id", EOS_ID)))
        if message:
            problems.append(("dtype", message))
    return problems


def _vocab_rules(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``max_length`` leaves room for the specials."""
    return _max_length_rule(args, (args.get("bos") is not None) + (args.get("eos") is not None))


def _byte_columns(items: list, *, field: str = "text", max_length: int | None = None, add_bos: bool = False,
                  add_eos: bool = False, bos_id: int = BOS_ID, eos_id: int = EOS_ID, dtype: str = "int64") -> IdsBlock:
    """``byte_tokenize`` of a list as one ``IdsBlock``: the same ids, in one buffer, the
    records made only if asked (``map`` gives it to a node that takes ids in bulk: pack_tokens)."""
    flags = _flag_problems({"add_bos": add_bos, "add_eos": add_eos})
    if flags:
        raise ValueError(flags[0][1])
    _check_max_length(max_length, add_bos + add_eos)
    dt = _byte_dtype(dtype, add_bos, add_eos, bos_id, eos_id)
    if type(items) is not list:
        raise TypeError(f"byte_tokenize's columns take a list, got {type(items).__name__}")
    buf, lengths = _byte_buffer(items, field, max_length, bos_id if add_bos else None, eos_id if add_eos else None,
                                dt)
    return IdsBlock(buf, np.array(lengths, dtype=np.int64), items, _block_records, carried=carried)


byte_tokenize.columns = _byte_columns  # type: ignore[attr-defined]  # (_id_blocks.py)
hf_tokenize.columns = _hf_columns  # type: ignore[attr-defined]
byte_tokenize.check_args = _byte_rules  # type: ignore[attr-defined]
vocab_tokenize.check_args = _vocab_rules  # type: ignore[attr-defined]
hf_tokenize.check_args = _hf_check_args  # type: ignore[attr-defined]
for _fn in (byte_tokenize, vocab_tokenize, hf_tokenize):
    _fn.per_sample = True  # type: ignore[attr-defined]  # one record in, one sample out (a list: a list)
    _fn.batch_invariant = True  # type: ignore[attr-defined]  # each id list is its record's alone (no padding)
del _fn


def varlen_cu_seqlens(cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A batch of ``pack_tokens`` rows' ``cu_seqlens`` ([B, W], each row ``0, ..., seq_len``
    then ``seq_len`` repeated) as flash-attention's varlen form over the flattened batch
    ([B * seq_len] tokens): one int32 vector of boundaries with the rows' offsets added, and
    the longest segment (``max_seqlen``), what ``flash_attn_varlen_func`` takes.

    Example:
        >>> cu = torch.tensor([[0, 3, 4, 4], [0, 2, 4, 4]], dtype=torch.int32)
        >>> flat, longest = varlen_cu_seqlens(cu)
        >>> flat.tolist(), longest
        ([0, 3, 4, 6, 8], 3)
    """
    rows, _ = cu_seqlens.shape
    seq_len = int(cu_seqlens[0, -1])
    offsets = torch.arange(rows, dtype=torch.int32).unsqueeze(1) * seq_len
    flat = torch.unique_consecutive((cu_seqlens.to(torch.int32) + offsets).reshape(-1))
    return flat, int((flat[1:] - flat[:-1]).max()) if len(flat) > 1 else 0
