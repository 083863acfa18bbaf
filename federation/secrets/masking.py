"""Secret values masked out of what a job's programs print: its logs, its describe view.

A secret reaches a job's pods as env or files; a program that prints it (a debug line, a stack trace
with its arguments, `env` in a start-up script) puts the value into its log, from which the log
would carry it to `gpufed logs`, the console and the copy kept in etcd and SQL. As GitHub Actions
and GitLab CI do for their masked variables, every occurrence of a value is replaced by `***`
before it leaves the server or is kept.

What is masked, for each value of each secret the job references:
- the value as written, and each of its lines on its own (a PEM key is printed a line at a time);
- its standard base64 form (the form a Kubernetes Secret's `data` holds, and `kubectl get -o yaml`
  prints).

What is not: values and lines shorter than `MIN_MASKED_CHARS` (masking `1` or `no` everywhere would
garble the log and protect nothing, since so short a value is guessed at once), and any other
transformation a program may apply (hex, URL encoding, one character per line): masking is a guard
against accidents, not against a program that sets out to print its secrets.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

MASK = "***"
MIN_MASKED_CHARS = 4


def _forms(value: bytes) -> set[bytes]:
    if len(value) < MIN_MASKED_CHARS:
        return set()  # its base64 would be long enough, but the value is guessed as easily
    forms = {value, base64.b64encode(value)}
    forms.update(line.strip() for line in value.splitlines())
    return {f for f in forms if len(f) >= MIN_MASKED_CHARS}


class SecretMask:
    """Replaces every form of the given values by `MASK`. Empty (and `bool()` false) when no value
    is long enough to mask, so that a job without secrets pays nothing.

    `missing` names the referenced secrets whose values could not be read (deleted since the job
    ran): what they held cannot be masked, and readers say so."""

    def __init__(self, values: Iterable[bytes], *, missing: tuple[str, ...] = ()) -> None:
        forms: set[bytes] = set()
        for value in values:
            forms.update(_forms(value))
        self.missing = missing
        # Longest first: a value that contains another is masked whole, not around the shorter one.
        ordered = sorted(forms, key=lambda f: (-len(f), f))
        self._bytes = re.compile(b"|".join(re.escape(f) for f in ordered)) if ordered else None
        texts = sorted(
            {f.decode("utf-8", "replace") for f in ordered if _decodes(f)}, key=lambda t: (-len(t), t)
        )
        self._text = re.compile("|".join(re.escape(t) for t in texts)) if texts else None

    def __bool__(self) -> bool:
        return self._bytes is not None

    def data(self, raw: bytes) -> bytes:
        return raw if self._bytes is None else self._bytes.sub(MASK.encode(), raw)

    def text(self, line: str) -> str:
        return line if self._text is None else self._text.sub(MASK, line)

    def message(self, msg: Message) -> None:
        """Every string in a protobuf message (and the messages it holds), masked in place."""
        if self._text is None:
            return
        for field, value in msg.ListFields():
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                if field.message_type.GetOptions().map_entry:
                    self._map(msg, field.name)
                elif _repeated(field):
                    for item in value:
                        self.message(item)
                else:
                    self.message(value)
            elif field.type == FieldDescriptor.TYPE_STRING:
                if _repeated(field):
                    masked = [self.text(v) for v in value]
                    del value[:]
                    value.extend(masked)
                else:
                    setattr(msg, field.name, self.text(value))

    def _map(self, msg: Message, name: str) -> None:
        entries = getattr(msg, name)
        for key in list(entries):
            item = entries[key]
            if isinstance(item, Message):
                self.message(item)
            elif isinstance(item, str):
                entries[key] = self.text(item)


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _decodes(form: bytes) -> bool:
    try:
        form.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
