"""The loader's whole-batch path for ``TokenDataset(labels="hf")`` (and the shifted
labels of chat data), built with numpy over each batch (``fastload.loader.token_batches``),
equals the per-item reference: the dataset's own items (``TokenDataset.window``, one at
a time) batched by torch's path (``transport="pickle"``), field by field and byte for
byte, with the same bytes counted as served; over chat data packed into blocks
(padding, masks), chat data streamed unpadded (examples split across windows) and plain
text (no mask), shards small enough that windows cross them, several shuffle seeds,
a short last batch, and resumed mid-epoch."""

from __future__ import annotations

from typing import Any

import pytest
from chat_helpers import chat_tokenizer, make_chats, write_chat_jsonl
from test_token_batches import assert_same_batches
from text_helpers import make_corpus, write_jsonl

import fastload
from fastload import World
from fastload.text import collate_packed
from fastload.text.chat import ChatConfig
from fastload.text.tokens import TokenDataset

BATCH = 5


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Token datasets in shards of 1 KB: ``packed`` (chat examples packed into
    64-token blocks, padding), ``stream`` (chat examples unpadded) and ``plain`` (text,
    no mask)."""
    tmp = tmp_path_factory.mktemp("hfbatches")
    tok = chat_tokenizer(str(tmp / "tok"))
    src = write_chat_jsonl(str(tmp / "chat.jsonl"), make_chats(60, seed=4))
    out = {}
    for name, chat in (("packed", ChatConfig(seq_len=64)), ("stream", ChatConfig())):
        out[name] = str(tmp / name)
        fastload.convert.text(src, out[name], tokenizer=tok, chat=chat, shard_size="1KB")
    text = write_jsonl(str(tmp / "text" / "a.jsonl"), make_corpus(120, seed=3))
    out["plain"] = str(tmp / "plain")
    fastload.convert.text(text, out["plain"], tokenizer=tok, shard_size="1KB")
    return out


def _pair(url: str, seq_len: int, labels: str, seed: int | None, extras: bool) -> Any:
    """The loader's batch path and the per-item reference over the same dataset."""
    ds = TokenDataset(url, seq_len=seq_len, labels=labels, shuffle=seed is not None,
                      seed=seed or 0, world=World.single(), position_ids=extras,
                      cu_seqlens=extras)  # fmt: skip
    fast = fastload.DataLoader(ds, batch_size=BATCH, world=World.single())
    slow = fastload.DataLoader(ds, batch_size=BATCH, world=World.single(), transport="pickle",
                               collate_fn=collate_packed if extras else None)  # fmt: skip
    assert fast.transport == "cache"
    return ds, fast, slow


@pytest.mark.parametrize("extras", [False, True])
@pytest.mark.parametrize("seed", [None, 0, 1, 2])
@pytest.mark.parametrize("labels", ["hf", "shifted"])
@pytest.mark.parametrize(("data", "seq_len"), [("packed", 64), ("stream", 37), ("stream", 300),
                                               ("plain", 45), ("plain", 700)])  # fmt: skip
def test_batches_equal_the_per_item_reference(
    sources: dict[str, str], data: str, seq_len: int, labels: str, seed: int | None,
    extras: bool,
) -> None:  # fmt: skip
    ds, fast, slow = _pair(sources[data], seq_len, labels, seed, extras)
    got = list(fast)
    want = list(slow)
    assert_same_batches(got, want)
    n = ds.num_windows
    assert len(got) == -(-n // BATCH)
    assert got[-1]["input_ids"].shape[0] == (n % BATCH or BATCH)  # the short last batch
    assert fast.io_stats()["ram_bytes"] + fast.io_stats()["disk_bytes"] == (
        slow.io_stats()["ram_bytes"] + slow.io_stats()["disk_bytes"]
    )
    if seed is None:  # in order: the dataset's last window closes the last batch
        assert got[-1]["input_ids"][-1].tolist() == ds[n - 1]["input_ids"].tolist()
    assert fast._tokens is not None
    if seq_len >= 300:
        assert fast._tokens.crossing > 0  # windows assembled across shards
    if labels == "hf":
        for b in got:
            lab, ids = b["labels"], b["input_ids"]
            assert ((lab == -100) | (lab == ids)).all()  # unshifted
            assert (lab[:, 0] == -100).all()  # a window's first token has no context
        masks = [b["attention_mask"] for b in got]
        untrained = sum(int(((b["labels"] == -100) & (b["attention_mask"] > 0)).sum()) for b in got)
        if data == "packed":
            assert any((m == 0).any() for m in masks)  # padding
        else:
            assert all(m.all() for m in masks)
        if data != "plain":
            assert untrained > len(got) * BATCH  # prompts are not trained


@pytest.mark.parametrize("labels", ["hf", "shifted"])
@pytest.mark.parametrize("offset", [1, 3, 6])
def test_a_resumed_epoch_equals_the_reference_from_the_same_point(
    sources: dict[str, str], labels: str, offset: int
) -> None:
    ds, fast, slow = _pair(sources["stream"], 37, labels, 5, True)
    want = list(slow)
    it = iter(fast)
    for _ in range(offset):
        next(it)
    state = fast.state_dict()
    fast.close()
    resumed = fastload.DataLoader(ds, batch_size=BATCH, world=World.single())
    resumed.load_state_dict(state)
    assert_same_batches(list(resumed), want[offset:])
