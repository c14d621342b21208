"""Instruction and chat records rendered by a chat template, with the characters to
train on.

A record (a JSON object or a parquet row) is one example, in one of three shapes,
tried in this order:

* a list of ``{"role", "content"}`` messages under ``ChatConfig.messages_field``;
* a prompt and a response (``prompt_field``/``response_field``; Alpaca's
  ``instruction``/``input``/``output`` too), made the messages
  ``[{"role": "user", ...}, {"role": "assistant", ...}]``;
* a plain text under ``text_field``, trained in full and not templated.

Messages are rendered by a Jinja chat template with the conventions of
``transformers``' ``apply_chat_template`` (a sandboxed environment with
``trim_blocks``/``lstrip_blocks``, ``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, ``raise_exception``, ``tojson``). The characters trained
on are those a template marks with ``{% generation %}...{% endgeneration %}`` (as
``return_assistant_tokens_mask=True`` reads them), or, in a template without those
marks, each assistant turn as it adds to the rendered conversation: from the
end of the conversation before it with ``add_generation_prompt=True`` to the end of
the conversation with it (its content and the end-of-turn text the template puts after
it). :mod:`fastload.text.packing` turns them into per-token masks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastload.errors import ConfigError, MissingDependencyError, SourceDataError
from fastload.shards.report import ErrorPolicy

__all__ = [
    "ChatConfig",
    "ChatTemplate",
    "load_template",
    "record_messages",
    "render_records",
    "tokenizer_config",
]

TRAIN_ON = ("assistant", "all")
PACKING = ("greedy", "none")
TRUNCATION = ("right", "drop")


@dataclass(frozen=True)
class ChatConfig:
    """How :func:`fastload.convert.text` reads, formats, masks and packs chat data.

    - ``template``: a Jinja chat template; None takes the ``chat_template`` of the
      ``tokenizer_config.json`` beside the ``tokenizer.json`` (the ``chat_template=``
      argument of :func:`~fastload.convert.text` sets it too).
    - ``messages_field``, ``prompt_field``, ``response_field``: where a record keeps
      its messages, or its prompt and response (see the module).
    - ``train_on``: ``"assistant"`` trains the assistant turns only (every other
      token's label is -100); ``"all"`` trains every token but padding.
    - BOS/EOS: the template's own, nothing added: special tokens written by the
      template (``{{ bos_token }}``, ``<|im_end|>``) become their ids; ``add_eos``
      appends the EOS id (trained) after each example.
    - ``seq_len``: pack into blocks of this many tokens (the ``seq_len`` of the
      ``TokenDataset(labels="hf")`` that reads them), an example never split between
      blocks: ``packing="greedy"`` fills a block with whole examples in order and pads
      the rest, ``"none"`` puts one example in each block; an example longer than
      ``seq_len`` is cut to its first ``seq_len`` tokens (``truncation="right"``) or
      left out (``"drop"``), and the report counts both. None: examples follow each
      other with no padding, and windows may split them.
    - ``pad_id``: the padding token (default: the EOS id); padding is never trained
      and has ``attention_mask`` 0.
    """

    template: str | None = None
    messages_field: str = "messages"
    prompt_field: str = "prompt"
    response_field: str = "response"
    train_on: str = "assistant"
    add_eos: bool = False
    seq_len: int | None = None
    packing: str = "greedy"
    truncation: str = "right"
    pad_id: int | None = None

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("train_on", self.train_on, TRAIN_ON),
            ("packing", self.packing, PACKING),
            ("truncation", self.truncation, TRUNCATION),
        ):
            if value not in allowed:
                raise ConfigError(f"ChatConfig: {name} must be one of {allowed}, got {value!r}")
        if self.seq_len is not None and (
            not isinstance(self.seq_len, int) or isinstance(self.seq_len, bool) or self.seq_len < 2
        ):
            raise ConfigError(
                f"ChatConfig: seq_len must be an int >= 2 or None, got {self.seq_len!r}"
            )


def tokenizer_config(path: str | None) -> dict[str, Any]:
    """The ``tokenizer_config.json`` beside a ``tokenizer.json`` path ({} if none)."""
    if path is None:
        return {}
    config = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
    if not os.path.isfile(config):
        return {}
    try:
        with open(config, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config}: not readable JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _environment() -> Any:
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ModuleNotFoundError as exc:
        raise MissingDependencyError("jinja2", "text", "chat templates") from exc

    class GenerationMarks(Extension):
        """``{% generation %}``: records the span of what the block renders."""

        tags = {"generation"}  # noqa: RUF012 (jinja2's Extension API)

        def __init__(self, environment: Any) -> None:
            super().__init__(environment)
            self.spans: list[tuple[int, int]] = []
            self.offset = 0  # characters rendered before the block being evaluated

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_mark")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _mark(self, caller: Any) -> str:
            rendered = caller()
            self.spans.append((self.offset, self.offset + len(rendered)))
            return str(rendered)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None,
               separators: Any = None, sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)  # fmt: skip

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationMarks, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    marks = next(e for e in env.extensions.values() if isinstance(e, GenerationMarks))
    return env, marks, jinja2.exceptions.TemplateError


class ChatTemplate:
    """A compiled chat template: :meth:`render` gives the text of a conversation and
    the character spans to train on.

    ``bos_token``/``eos_token`` are the strings the template sees. Raises
    :class:`ConfigError` for a template that does not compile and
    :class:`MissingDependencyError` without jinja2.
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env, self._marks, self._error = _environment()
        try:
            self._template = env.from_string(source)
        except Exception as exc:  # jinja2.TemplateSyntaxError and friends
            raise ConfigError(f"the chat template does not compile ({exc})") from None
        self.source = source
        self.marked = "generation" in source and self._has_marks(source)
        self.bos_token = bos_token
        self.eos_token = eos_token

    @staticmethod
    def _has_marks(source: str) -> bool:
        import re

        return re.search(r"\{%-?\s*generation\s*-?%\}", source) is not None

    def _render(self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool) -> str:
        marks = self._marks
        marks.spans, marks.offset = [], 0
        parts: list[str] = []
        for block in self._template.generate(
            messages=messages,
            add_generation_prompt=generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        ):
            parts.append(block)
            marks.offset += len(block)
        return "".join(parts)

    def render(
        self, messages: Sequence[Mapping[str, Any]], where: str = "<record>"
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the ``[start, stop)`` character spans of its
        assistant parts (see the module). Raises :class:`SourceDataError` naming
        ``where`` when the template refuses the messages or does not render them
        incrementally (a template without ``{% generation %}`` marks must)."""
        try:
            text = self._render(messages, False)
            if self.marked:
                return text, list(self._marks.spans)
            spans = []
            for i, message in enumerate(messages):
                if message.get("role") != "assistant":
                    continue
                before = self._render(messages[:i], True)
                upto = self._render(messages[: i + 1], False)
                if not text.startswith(upto):
                    raise SourceDataError(
                        "the chat template does not render this conversation incrementally "
                        "(a turn's text changes with the turns after it); mark the assistant "
                        "parts with {% generation %}...{% endgeneration %}",
                        where,
                    )
                start = 0
                limit = min(len(before), len(upto))
                while start < limit and before[start] == upto[start]:
                    start += 1
                spans.append((start, len(upto)))
            return text, spans
        except self._error as exc:
            raise SourceDataError(f"the chat template refused it: {exc}", where) from None


def load_template(
    config: ChatConfig,
    chat_template: str | None,
    tokenizer: Any,
    tokenizer_path: str | None,
    eos_id: int,
) -> ChatTemplate:
    """The :class:`ChatTemplate` to use: ``chat_template``, else ``config.template``,
    else the ``chat_template`` of the ``tokenizer_config.json`` beside the tokenizer
    (BOS and EOS strings from there too, else from the vocabulary). Raises
    :class:`ConfigError` when there is none."""
    meta = tokenizer_config(tokenizer_path)
    source = chat_template or config.template or meta.get("chat_template")
    if isinstance(source, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source:
        raise ConfigError(
            "chat=True needs a chat template: pass chat_template= (Jinja text), or put "
            "chat_template in the tokenizer_config.json beside tokenizer.json"
        )
    bos = _token_text(meta.get("bos_token"))
    if bos is None:
        for candidate in ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>"):
            if tokenizer.token_to_id(candidate) is not None:
                bos = candidate
                break
    eos = _token_text(meta.get("eos_token")) or tokenizer.id_to_token(eos_id) or ""
    return ChatTemplate(source, bos_token=bos or "", eos_token=eos)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def record_messages(
    record: Any, config: ChatConfig, text_field: str, where: str
) -> list[dict[str, str]] | str:
    """The messages of a record, or its plain text (see the module). Raises
    :class:`SourceDataError` naming ``where`` for a record of none of the shapes or
    with malformed messages."""
    if not isinstance(record, dict):
        raise SourceDataError(f"a record is a {type(record).__name__}, not an object", where)
    messages = record.get(config.messages_field)
    if messages is not None:
        if not isinstance(messages, (list, tuple)) or not messages:
            raise SourceDataError(
                f"field {config.messages_field!r} is not a non-empty list of messages", where
            )
        out = []
        for i, m in enumerate(messages):
            ok = isinstance(m, dict) and _is_str(m.get("role")) and _is_str(m.get("content"))
            if not ok:
                raise SourceDataError(
                    f"message {i} is not an object with string 'role' and 'content'", where
                )
            out.append(m)
        return out
    prompt, response = record.get(config.prompt_field), record.get(config.response_field)
    if prompt is None and response is None and "instruction" in record and "output" in record:
        extra = record.get("input")
        prompt, response = record["instruction"], record["output"]
        if _is_str(prompt) and _is_str(extra) and extra:
            prompt = f"{prompt}\n\n{extra}"
    if prompt is not None or response is not None:
        if not isinstance(prompt, str) or not isinstance(response, str):
            raise SourceDataError(
                f"fields {config.prompt_field!r} and {config.response_field!r} (or Alpaca's "
                "instruction and output) must both be strings",
                where,
            )
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    text = record.get(text_field)
    if _is_str(text):
        return str(text)
    raise SourceDataError(
        f"no {config.messages_field!r} list, no {config.prompt_field!r}/"
        f"{config.response_field!r} pair and no {text_field!r} text",
        where,
    )


def render_records(
    records: Iterable[tuple[str, Any]],
    template: ChatTemplate,
    config: ChatConfig,
    text_field: str,
    policy: ErrorPolicy,
) -> Iterator[tuple[str, list[tuple[int, int]]]]:
    """``(text, spans to train on)`` of each ``(item, record)``; a record that is not
    an example, or that the template refuses, goes to ``policy`` (naming ``item``)."""
    train_all = config.train_on == "all"
    for item, record in records:
        try:
            messages = record_messages(record, config, text_field, item)
            if isinstance(messages, str):
                text, spans = messages, [(0, len(messages))]
            else:
                text, spans = template.render(messages, item)
        except SourceDataError as exc:
            policy.bad(item, exc)
            continue
        yield text, ([(0, len(text))] if train_all else spans)
