"""The ``accelerate``, mixture and ``torchrun`` snippets of ``docs/howto-lora.md`` run as
written, with local paths for the bucket URLs, short blocks, batches of 2 and a tiny
random LoRA LLaMA for the model (the chat snippet: ``test_howto_chat.py``); the
``torchrun`` script under ``torchrun --nproc_per_node 2`` (gloo, CPU), stopped after
some steps and resumed in new processes."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_helpers import chat_tokenizer, hf_tokenizer, make_chats, write_chat_jsonl
from text_helpers import make_corpus, write_jsonl

import fastload
from fastload.text.chat import ChatConfig
from support.tiny_llama import tiny_lora

pytestmark = pytest.mark.slow

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "howto-lora.md"


def snippet(tag: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", HOWTO.read_text(), re.S)
    found = [b for b in blocks if b.startswith(f"# howto-lora: {tag}")]
    assert len(found) == 1, f"docs/howto-lora.md lost its {tag} snippet"
    return found[0]


def _adapt(code: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        assert old in code, f"the snippet no longer says {old}"
        code = code.replace(old, new)
    return code


def _chat_tokens(tmp: Path, name: str, seed: int) -> tuple[str, int]:
    tok = chat_tokenizer(str(tmp / "tok"))
    src = write_chat_jsonl(str(tmp / f"{name}.jsonl"), make_chats(30, seed=seed, max_turns=1))
    out = str(tmp / name)
    fastload.convert.text(src, out, tokenizer=tok, chat=ChatConfig(seq_len=128))
    return out, len(hf_tokenizer(tok))


def _tiny_lora(vocab: int) -> Any:
    return tiny_lora(vocab, seq_len=128, heads=2)


def test_accelerate_snippet(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("peft")
    url, vocab = _chat_tokens(tmp_path, "chat", 4)
    ckpt = str(tmp_path / "acc")
    code = _adapt(
        snippet("accelerate"),
        [
            ('"s3://corpus/chat-tokens-2048"', repr(url)),
            ("seq_len=2048", "seq_len=128"),
            ('"/nvme/fastload"', repr(str(tmp_path / "cache"))),
            ("batch_size=8", "batch_size=2"),
            ("Accelerator()", "Accelerator(cpu=True)"),
            ('"ckpt/acc"', repr(ckpt)),
            ("step % 200 == 199", "step % 3 == 2"),
        ],
    )
    seen: list[list[int]] = []
    for resume in (False, True):
        model = _tiny_lora(vocab)
        model.get_base_model().register_forward_pre_hook(
            lambda _m, _a, kw: seen.extend(kw["labels"].tolist()), with_kwargs=True
        )
        scope: dict[str, Any] = {"model": model, "resume": resume}
        exec(compile(code, str(HOWTO), "exec"), scope)
        if not resume:
            full = list(seen)
            assert os.path.exists(os.path.join(ckpt, "custom_checkpoint_0.pkl"))
            state = scope["loader"].state_dict()
            seen.clear()
    # the resumed run started where the last save_state left the loader
    per_epoch = len(scope["loader"])
    assert per_epoch >= 3
    last = max(k for k in range(per_epoch) if k % 3 == 2)  # the second epoch's last save
    assert state["epoch"] == 2
    assert len(full) == 2 * per_epoch * 2
    assert seen == full[(per_epoch + last + 1) * 2 :]
    assert seen  # the resumed run had batches left to train


def test_parquet_stream_snippet(tmp_path: Path, tokenizer_path: str) -> None:
    from text_helpers import write_parquet

    corpus = make_corpus(400, seed=9)
    for k in range(2):
        write_parquet(str(tmp_path / "pq" / f"part-{k}.parquet"), corpus[k * 200 : (k + 1) * 200],
                      row_group_size=20)  # fmt: skip
    code = _adapt(
        snippet("parquet-stream"),
        [
            ('"s3://corpus/raw-parquet/"', repr(str(tmp_path / "pq"))),
            ('"llama2/tokenizer.json"', repr(tokenizer_path)),
            ("seq_len=2048", "seq_len=16"),
            ('"/nvme/fastload"', repr(str(tmp_path / "cache"))),
            ("batch_size=8", "batch_size=4"),
            ("    ...  #", "    seen.append(batch)  #"),
            ("step == 99", "step == 9"),
        ],
    )
    scope: dict[str, Any] = {"seen": []}
    exec(compile(code, str(HOWTO), "exec"), scope)
    finished = fastload.ParquetTokenDataset(
        str(tmp_path / "pq"), tokenizer=tokenizer_path, seq_len=16,
        cache_dir=tmp_path / "cache", labels="hf", shuffle=False,
    )  # fmt: skip
    want = list(fastload.DataLoader(finished, batch_size=4))
    resumed = fastload.DataLoader(finished, batch_size=4)
    resumed.load_state_dict(scope["state"])
    got = scope["seen"] + list(resumed)
    assert len(scope["seen"]) == 10
    assert len(got) == len(want) > 10
    for a, b in zip(got, want, strict=True):
        assert list(a) == list(b) == ["input_ids", "labels", "attention_mask"]
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_mix_snippet(tmp_path: Path) -> None:
    a, _ = _chat_tokens(tmp_path, "a", 5)
    b, _ = _chat_tokens(tmp_path, "b", 6)
    code = _adapt(
        snippet("mix"),
        [
            ('"s3://corpus/chat-tokens-2048"', repr(a)),
            ('"s3://corpus/more-chat-tokens-2048"', repr(b)),
            ("seq_len=2048", "seq_len=128"),
            ('"/nvme/fastload"', repr(str(tmp_path / "cache"))),
            ("batch_size=8", "batch_size=2"),
        ],
    )
    code = code.replace("seq_len=2048", "seq_len=128")
    scope: dict[str, Any] = {}
    exec(compile(code, str(HOWTO), "exec"), scope)
    whole = [b["labels"] for b in fastload.DataLoader(scope["mix"], batch_size=2, drop_last=True)]
    rest = [b["labels"] for b in scope["resumed"]]
    assert len(whole) > 5
    assert len(rest) == len(whole) - 4
    assert all(torch.equal(x, y) for x, y in zip(rest, whole[4:], strict=True))


def _torchrun(script: Path, ckpt: Path, steps: int, tmp: Path) -> tuple[dict[Any, float], Any]:
    """``torchrun --standalone --nproc_per_node 2 script`` (torch's own launcher, as the
    ``torchrun`` command runs it) with ``CKPT``/``STEPS`` set, offline; the losses it
    printed by (rank, step) and the last line of each rank."""
    tests = str(Path(__file__).resolve().parents[1])  # support.tiny_llama for the model
    env = {**os.environ, "CKPT": str(ckpt), "STEPS": str(steps), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), tests])}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", str(script)]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    losses: dict[Any, float] = {}
    ends: dict[int, tuple[int, int]] = {}
    # the ranks share one stdout: a line's end may come after the other rank's line
    for m in re.finditer(r"rank (\d) step (\d+) loss ([^\sr]+)", done.stdout):
        losses[int(m[1]), int(m[2])] = float(m[3])
    for m in re.finditer(r"rank (\d) trained (\d+) tokens, (\d+) steps", done.stdout):
        ends[int(m[1])] = (int(m[2]), int(m[3]))
    return losses, ends


def test_torchrun_snippet_on_two_ranks_stops_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    tok = chat_tokenizer(str(tmp_path / "tok"))
    write_jsonl(str(tmp_path / "text" / "a.jsonl"), make_corpus(16, seed=5))
    tokens = str(tmp_path / "tokens")
    fastload.convert.text(str(tmp_path / "text"), tokens, tokenizer=tok)
    vocab, L, B = len(hf_tokenizer(tok)), 64, 2
    code = _adapt(
        snippet("torchrun"),
        [
            ('"s3://corpus/tokens-llama2"', repr(tokens)),
            ("seq_len=2048", f"seq_len={L}"),
            ('"/nvme/fastload"', repr(str(tmp_path / "cache"))),
            ('cache_limit="400GB"', 'cache_limit="1GB"'),
            ("batch_size=8", f"batch_size={B}"),
            (
                'AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-13b-hf", '
                "dtype=torch.bfloat16)",
                f"tiny_llama({vocab}, seq_len={L})",
            ),
            ("lr=2e-4", "lr=1e-2"),
            # the random model's lm_head is tiny and frozen: its logits stay near
            # uniform unless it trains beside the adapter
            (
                'target_modules=["q_proj", "v_proj"]',
                'target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]',
            ),
            ("step % 100 == 0", "True"),  # every step's loss
            ("step % 500 == 0", "False"),  # saved only at STEPS
        ],
    )
    script = tmp_path / "train.py"
    script.write_text("from support.tiny_llama import tiny_llama\n" + code)
    single = fastload.World.single()
    windows = fastload.TokenDataset(tokens, seq_len=L, shuffle=False, world=single).num_windows
    per_epoch = windows // (2 * B)  # drop_last: full batches, the same on both ranks
    assert per_epoch >= 4
    total = 3 * per_epoch  # the script's 3 epochs

    full, ends = _torchrun(script, tmp_path / "full", 10_000, tmp_path)
    assert ends == {r: (total * B * L, total) for r in (0, 1)}  # each rank's tokens
    assert sorted(full) == [(r, s) for r in (0, 1) for s in range(1, total + 1)]
    assert all(math.isfinite(x) for x in full.values())
    for r in (0, 1):  # the loss falls
        first = sum(full[r, s] for s in range(1, 4)) / 3
        last = sum(full[r, s] for s in range(total - 2, total + 1)) / 3
        assert last < first - 0.5, (r, first, last)
    assert full[0, 1] != full[1, 1]  # each rank its own windows

    stop = per_epoch + 2  # mid-way through the second epoch
    (tmp_path / "ckpt").mkdir()
    part, ends = _torchrun(script, tmp_path / "ckpt", stop, tmp_path)
    assert ends == {r: (stop * B * L, stop) for r in (0, 1)}
    assert (tmp_path / "ckpt" / "train.pt").exists()
    assert part == pytest.approx({k: v for k, v in full.items() if k[1] <= stop}, rel=1e-5)
    rest, ends = _torchrun(script, tmp_path / "ckpt", 10_000, tmp_path)
    # the resumed job trains only the steps after the stop, on the same batches with
    # the same adapter: the uninterrupted run's losses
    assert ends == {r: ((total - stop) * B * L, total) for r in (0, 1)}
    assert rest == pytest.approx({k: v for k, v in full.items() if k[1] > stop}, rel=1e-4)


def test_record_shapes_snippet_converts(tmp_path: Path) -> None:
    """The three record shapes of section 1, as written (with their "..." texts), each
    make one chat example."""
    block = re.findall(r"```json\n(.*?)```", HOWTO.read_text(), re.S)
    assert len(block) == 1, "docs/howto-lora.md lost its record shapes"
    records, at, text = [], 0, block[0]
    decoder = json.JSONDecoder()
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        record, at = decoder.raw_decode(text, at)
        records.append(record)
    assert [sorted(r) for r in records] == [
        ["messages"], ["prompt", "response"], ["input", "instruction", "output"]]  # fmt: skip
    src = tmp_path / "records.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    tok = chat_tokenizer(str(tmp_path / "tok"))
    report = fastload.convert.text(str(src), str(tmp_path / "out"), tokenizer=tok, chat=True)
    assert report.chat["written"] == 3


def test_convert_cli_snippet_runs(tmp_path: Path) -> None:
    """Section 6's ``fastload convert text`` command, with local paths, makes the token
    shards the Python API makes."""
    blocks = re.findall(r"```sh\n(.*?)```", HOWTO.read_text(), re.S)
    found = [b for b in blocks if b.startswith("fastload convert text")]
    assert len(found) == 1, "docs/howto-lora.md lost its convert command"
    tok = chat_tokenizer(str(tmp_path / "tok"))
    write_jsonl(str(tmp_path / "raw" / "a.jsonl"), make_corpus(40, seed=2))
    argv = _adapt(
        found[0],
        [
            ("s3://corpus/raw/", str(tmp_path / "raw")),
            ("s3://corpus/tokens-llama2", str(tmp_path / "cli")),
            ("llama2/tokenizer.json", tok),
        ],
    )
    args = shlex.split(argv.replace("\\\n", " "))
    assert args[0] == "fastload"
    done = subprocess.run([sys.executable, "-m", "fastload", *args[1:]], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    fastload.convert.text(str(tmp_path / "raw"), str(tmp_path / "api"), tokenizer=tok)
    single = fastload.World.single()
    cli, api = (fastload.TokenDataset(str(tmp_path / d), seq_len=16, shuffle=False, world=single)
                for d in ("cli", "api"))  # fmt: skip
    assert cli.num_tokens == api.num_tokens > 0
    assert all(torch.equal(cli[k]["input_ids"], api[k]["input_ids"]) for k in range(len(cli)))
