"""Chat and instruction data: ``fastload.convert.text(chat=...)`` renders records by a
chat template, stores a per-token loss mask and packs examples into blocks;
``TokenDataset(labels="hf")`` serves what ``transformers`` expects. The labels are
checked against ``apply_chat_template(..., return_assistant_tokens_mask=True)``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from chat_helpers import (
    MARKED,
    UNMARKED,
    chat_tokenizer,
    hf_tokenizer,
    make_chats,
    reference_blocks,
    reference_examples,
    write_chat_jsonl,
)
from test_token_batches import assert_same_batches
from text_helpers import write_jsonl

import fastload
from fastload import World
from fastload.errors import ConfigError, SourceDataError
from fastload.text.chat import ChatConfig
from fastload.text.tokens import TokenDataset

L = 256
PAD = 2  # </s>: the default padding (the EOS id)


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return chat_tokenizer(str(tmp_path_factory.mktemp("chat-tok")))


@pytest.fixture(scope="module")
def chats() -> list[list[dict[str, str]]]:
    return make_chats(120, seed=3)


@pytest.fixture(scope="module")
def reference(
    tok_path: str, chats: list[list[dict[str, str]]]
) -> list[tuple[list[int], list[int]]]:
    return reference_examples(hf_tokenizer(tok_path), chats)


def _convert(src: Any, out: Path, tok_path: str, **kwargs: Any) -> fastload.text.TextConvertReport:
    return fastload.convert.text(
        str(src) if isinstance(src, Path) else src,
        str(out),
        tokenizer=tok_path,
        shard_size="2KB",
        **kwargs,
    )


def _items(url: str, seq_len: int = L, **kwargs: Any) -> list[dict[str, torch.Tensor]]:
    ds = TokenDataset(
        url, seq_len=seq_len, labels="hf", shuffle=False, world=World.single(), **kwargs
    )
    return [ds[k] for k in range(ds.num_windows)]


def _as_lists(items: list[dict[str, torch.Tensor]]) -> list[tuple[list[int], ...]]:
    return [
        (i["input_ids"].tolist(), i["labels"].tolist(), i["attention_mask"].tolist()) for i in items
    ]


def test_packed_labels_equal_apply_chat_template(
    tmp_path: Path, tok_path: str, chats: list[Any], reference: list[Any]
) -> None:
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    report = _convert(src, tmp_path / "out", tok_path, chat=ChatConfig(seq_len=L))
    want = reference_blocks(reference, L, PAD)
    items = _items(str(tmp_path / "out"), position_ids=True)
    assert _as_lists(items) == want
    # several examples per block, positions restarting at each example
    starts = [int(((i["position_ids"] == 0) & (i["attention_mask"] == 1)).sum()) for i in items]
    assert max(starts) >= 2
    assert min(starts) == 1
    cut = sum(max(0, len(ids) - L) for ids, _ in reference)
    c = report.chat
    assert (c["examples"], c["written"], c["dropped"]) == (len(chats), len(chats), 0)
    assert c["truncated"] == sum(len(ids) > L for ids, _ in reference)
    assert c["tokens_cut"] == cut
    assert c["blocks"] == len(want) == report.tokens // L
    assert c["trained_tokens"] == sum(sum(x != -100 for x in lab[:L]) for _, lab in reference)
    assert c["pad_tokens"] == sum(a.count(0) for _, _, a in want)
    assert "truncated" in report.summary()


def test_unmarked_template_masks_each_assistant_turn_the_same(
    tmp_path: Path, tok_path: str, chats: list[Any]
) -> None:
    """A template without ``{% generation %}`` marks: each assistant turn as it adds to
    the conversation, which for this template is what the marks cover."""
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    _convert(src, tmp_path / "marked", tok_path, chat=True, chat_template=MARKED)
    _convert(src, tmp_path / "plain", tok_path, chat=True, chat_template=UNMARKED)
    a, b = _items(str(tmp_path / "marked")), _items(str(tmp_path / "plain"))
    assert _as_lists(a) == _as_lists(b)
    assert len(a) > 10


def test_template_from_tokenizer_config_and_unpacked_stream(
    tmp_path: Path, tok_path: str, chats: list[Any], reference: list[Any]
) -> None:
    """No ``chat_template``: the tokenizer_config.json's; no ``seq_len``: examples follow
    each other unpadded, and windows are cut from the stream."""
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    report = _convert(src, tmp_path / "out", tok_path, chat=True)
    ids = [t for e, _ in reference for t in e]
    labels = [t for _, lab in reference for t in lab]
    assert report.tokens == len(ids)
    assert report.chat["pad_tokens"] == 0
    items = _items(str(tmp_path / "out"), seq_len=50)
    assert len(items) == len(ids) // 50
    for k, item in enumerate(items):
        assert item["input_ids"].tolist() == ids[k * 50 : (k + 1) * 50]
        want = labels[k * 50 : (k + 1) * 50]
        want[0] = -100  # a window's first token starts its part of an example
        assert item["labels"].tolist() == want
        assert item["attention_mask"].tolist() == [1] * 50


def test_today_labels_of_chat_data_are_shifted_and_masked(
    tmp_path: Path, tok_path: str, chats: list[Any], reference: list[Any]
) -> None:
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    _convert(src, tmp_path / "out", tok_path, chat=True)
    ids = [t for e, _ in reference for t in e]
    labels = [t for _, lab in reference for t in lab]
    ds = TokenDataset(str(tmp_path / "out"), seq_len=40, shuffle=False, world=World.single())
    for k in range(ds.num_windows):
        item = ds[k]
        assert item["input_ids"].tolist() == ids[k * 40 : k * 40 + 40]
        assert item["labels"].tolist() == labels[k * 40 + 1 : k * 40 + 41]


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("transport", ["cache", "pickle"])
def test_loader_batches_equal_the_dataset_items(
    tmp_path: Path,
    tok_path: str,
    chats: list[Any],
    reference: list[Any],
    greedy: bool,
    transport: str,
) -> None:
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    config = ChatConfig(seq_len=L, packing="greedy" if greedy else "none")
    report = _convert(src, tmp_path / "out", tok_path, chat=config)
    want = reference_blocks(reference, L, PAD, greedy=greedy)
    assert report.chat["blocks"] == len(want)
    ds = TokenDataset(
        str(tmp_path / "out"),
        seq_len=L,
        labels="hf",
        shuffle=False,
        world=World.single(),
        position_ids=True,
    )
    loader = fastload.DataLoader(ds, batch_size=4, transport=transport, world=World.single())
    got = list(loader)
    assert list(got[0]) == ["input_ids", "labels", "attention_mask", "position_ids"]
    rows = [
        (b["input_ids"][i].tolist(), b["labels"][i].tolist(), b["attention_mask"][i].tolist())
        for b in got
        for i in range(b["input_ids"].shape[0])
    ]
    assert rows == want
    if transport == "cache":
        slow = fastload.DataLoader(ds, batch_size=4, transport="pickle", world=World.single())
        assert_same_batches(got, list(slow))


def test_prompt_response_parquet_and_alpaca_json_array(tmp_path: Path, tok_path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = [
        (f"question {i} " + "ka " * (i % 7), f"answer {i} " + "ri " * (i % 5)) for i in range(40)
    ]
    pq.write_table(
        pa.table({"prompt": [p for p, _ in pairs], "response": [r for _, r in pairs]}),
        str(tmp_path / "pr.parquet"),
    )
    (tmp_path / "alpaca.json").write_text(
        json.dumps([{"instruction": p, "input": "", "output": r} for p, r in pairs], indent=1)
    )
    write_chat_jsonl(
        str(tmp_path / "m.jsonl"),
        [[{"role": "user", "content": p}, {"role": "assistant", "content": r}] for p, r in pairs],
    )
    config = ChatConfig(seq_len=64)
    for name in ("pr.parquet", "alpaca.json", "m.jsonl"):
        _convert(tmp_path / name, tmp_path / f"out-{name}", tok_path, chat=config)
    a, b, c = (
        _as_lists(_items(str(tmp_path / f"out-{n}"), seq_len=64))
        for n in ("pr.parquet", "alpaca.json", "m.jsonl")
    )
    assert a == b == c
    assert len(a) > 3


def test_a_json_array_file_converts_like_jsonl(tmp_path: Path, tokenizer_path: str) -> None:
    docs = [f"document {i} " + "word " * i for i in range(30)]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "docs.json").write_text(json.dumps([{"text": d} for d in docs]))
    write_jsonl(str(tmp_path / "b" / "docs.jsonl"), docs)
    ra = fastload.convert.text(str(tmp_path / "a"), str(tmp_path / "oa"), tokenizer=tokenizer_path)
    rb = fastload.convert.text(str(tmp_path / "b"), str(tmp_path / "ob"), tokenizer=tokenizer_path)
    assert (ra.tokens, ra.documents) == (rb.tokens, rb.documents)
    assert ra.documents == 30
    da = TokenDataset(str(tmp_path / "oa"), seq_len=16, shuffle=False, world=World.single())
    db = TokenDataset(str(tmp_path / "ob"), seq_len=16, shuffle=False, world=World.single())
    assert [da[k]["input_ids"].tolist() for k in range(da.num_windows)] == [
        db[k]["input_ids"].tolist() for k in range(db.num_windows)
    ]


@pytest.mark.parametrize("truncation", ["right", "drop"])
def test_truncation_is_counted(tmp_path: Path, tok_path: str, truncation: str) -> None:
    chats = make_chats(30, seed=5, max_turns=4)
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    ref = reference_examples(hf_tokenizer(tok_path), chats)
    long = [len(ids) > 300 for ids, _ in ref]
    assert 0 < sum(long) < len(ref)
    r = _convert(
        src, tmp_path / "out", tok_path, chat=ChatConfig(seq_len=300, truncation=truncation)
    )
    c = r.chat
    assert c["truncated"] == sum(long)
    if truncation == "drop":
        assert c["dropped"] == sum(long)
        assert c["written"] == len(ref) - sum(long)
        assert c["tokens_cut"] == sum(len(ids) for ids, _ in ref if len(ids) > 300)
        kept = [e for e, lg in zip(ref, long, strict=True) if not lg]
        assert _as_lists(_items(str(tmp_path / "out"), seq_len=300)) == reference_blocks(
            kept, 300, PAD
        )
    else:
        assert c["dropped"] == 0
        assert c["written"] == len(ref)
        assert c["tokens_cut"] == sum(len(ids) - 300 for ids, _ in ref if len(ids) > 300)


def test_train_on_all_and_add_eos(tmp_path: Path, tok_path: str, chats: list[Any]) -> None:
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats[:20])
    _convert(src, tmp_path / "out", tok_path, chat=ChatConfig(train_on="all", add_eos=True))
    items = _items(str(tmp_path / "out"), seq_len=64, position_ids=True)
    for item in items:
        ids, labels, pos = item["input_ids"], item["labels"], item["position_ids"]
        assert torch.equal(labels[pos != 0], ids[pos != 0])
        assert (labels[pos == 0] == -100).all()
    ds = TokenDataset(
        str(tmp_path / "out"),
        seq_len=64,
        labels="hf",
        shuffle=False,
        world=World.single(),
        cu_seqlens=True,
    )
    stream = np.concatenate([ds[k]["input_ids"].numpy() for k in range(ds.num_windows)])
    assert (stream == PAD).sum() >= 19  # an EOS after each example


def test_plain_token_shards_in_hf_mode(
    tmp_path: Path, tokenizer_path: str, corpus: list[str]
) -> None:
    """Old token shards (no mask) read with labels="hf": every token trained but each
    document's first, nothing padded, windows of seq_len tokens with no overlap."""
    write_jsonl(str(tmp_path / "src" / "a.jsonl"), corpus)
    fastload.convert.text(str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=tokenizer_path)
    base = TokenDataset(str(tmp_path / "out"), seq_len=32, shuffle=False, world=World.single())
    ds = TokenDataset(
        str(tmp_path / "out"),
        seq_len=32,
        labels="hf",
        shuffle=False,
        world=World.single(),
        position_ids=True,
    )
    assert ds.num_windows == base.num_tokens // 32
    stream = np.concatenate([base[k]["input_ids"].numpy() for k in range(base.num_windows)])
    for k in range(min(ds.num_windows, base.num_windows)):
        item = ds[k]
        assert item["input_ids"].tolist() == stream[k * 32 : k * 32 + 32].tolist()
        starts = item["position_ids"] == 0
        assert torch.equal(item["labels"][~starts], item["input_ids"][~starts])
        assert (item["labels"][starts] == -100).all()
        assert item["attention_mask"].all()
    fast = fastload.DataLoader(ds, batch_size=8, world=World.single())
    slow = fastload.DataLoader(ds, batch_size=8, transport="pickle", world=World.single())
    assert_same_batches(list(fast), list(slow))


def test_bad_settings_and_records_are_refused(
    tmp_path: Path, tok_path: str, tokenizer_path: str
) -> None:
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), make_chats(5))
    with pytest.raises(ConfigError, match="chat template"):  # no template anywhere
        fastload.convert.text(src, str(tmp_path / "o1"), tokenizer=tokenizer_path, chat=True)
    with pytest.raises(ConfigError, match="does not compile"):
        _convert(src, tmp_path / "o2", tok_path, chat=True, chat_template="{% for %}")
    with pytest.raises(ConfigError, match="chat=True"):
        _convert(src, tmp_path / "o3", tok_path, chat_template=MARKED)
    with pytest.raises(ConfigError, match="packing"):
        ChatConfig(packing="best")
    assert not (tmp_path / "o1").exists()
    assert not (tmp_path / "o2").exists()
    with open(src, "a") as f:
        f.write(json.dumps({"messages": [{"role": "user"}]}) + "\n")
        f.write(json.dumps({"other": 1}) + "\n")
    with pytest.raises(SourceDataError, match=r"chat.jsonl.*message 0"):
        _convert(src, tmp_path / "o4", tok_path, chat=True)
    r = _convert(src, tmp_path / "o5", tok_path, chat=True, on_error="skip")
    assert [s.item for s in r.skipped] == ["chat.jsonl:6", "chat.jsonl:7"]
    assert r.chat["written"] == 5
    r = _convert(src, tmp_path / "o6", tok_path, chat=ChatConfig(seq_len=64), on_error="skip")
    with pytest.raises(ConfigError, match="blocks of 64"):
        TokenDataset(str(tmp_path / "o6"), seq_len=32, labels="hf", shuffle=False)
    with pytest.raises(ConfigError, match="labels must be one of"):
        TokenDataset(str(tmp_path / "o6"), seq_len=64, labels="HF", shuffle=False)


def test_cli_chat_from_s3_through_the_cache(
    seaweed: Any,
    tmp_path: Path,
    tok_path: str,
    chats: list[Any],
    reference: list[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``fastload convert text --chat --seq-len`` over chat JSONL in SeaweedFS, written
    to SeaweedFS, read with labels="hf" through the node cache: the reference blocks."""
    from fastload.cli import main
    from fastload.storage import open_store

    opts = seaweed.storage_options
    root = seaweed.new_url("chat")
    src = write_chat_jsonl(str(tmp_path / "chat.jsonl"), chats)
    open_store(root, opts).write_bytes("raw/chat.jsonl", Path(src).read_bytes())
    (tmp_path / "template.jinja").write_text(MARKED)
    out = seaweed.new_url("chat-tokens")
    (tmp_path / "opts.json").write_text(json.dumps(dict(opts)))
    rc = main(
        [
            "convert",
            "text",
            root + "/raw",
            out,
            "--tokenizer",
            tok_path,
            "--chat",
            "--chat-template",
            str(tmp_path / "template.jinja"),
            "--seq-len",
            str(L),
            "--json",
            "--quiet",
            "--storage-options",
            f"@{tmp_path / 'opts.json'}",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chat"]["written"] == len(chats)
    ds = TokenDataset(
        out,
        seq_len=L,
        labels="hf",
        shuffle=False,
        world=World.single(),
        storage_options=opts,
        cache_dir=str(tmp_path / "cache"),
    )
    assert _as_lists([ds[k] for k in range(ds.num_windows)]) == reference_blocks(reference, L, PAD)


def test_read_documents_field_is_a_deprecated_spelling(tmp_path: Path) -> None:
    from fastload.text.sources import list_sources, read_documents

    src = write_jsonl(str(tmp_path / "a.jsonl"), ["one", "two"], field="body")
    with pytest.warns(DeprecationWarning, match="write text_field="):
        old = list(read_documents(list_sources(src), field="body"))
    assert old == list(read_documents(list_sources(src), text_field="body")) == ["one", "two"]
