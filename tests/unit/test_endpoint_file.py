"""The files `gpufed up` writes for clients (endpoint.json, stores.json) are replaced whole: a client
polling for them while `gpufed up` starts never reads a part (a fresh-clone run once read an empty
endpoint.json and failed eleven tests at setup)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from clusters.files import write_atomically


def test_a_reader_sees_the_old_file_or_the_new_one_never_a_part(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.json"
    write_atomically(path, json.dumps({"n": -1}))
    documents = [json.dumps({"n": n, "pad": "x" * 65536}) for n in range(200)]
    done = threading.Event()
    seen: list[int] = []
    broken: list[str] = []

    def read() -> None:
        while not done.is_set():
            text = path.read_text()
            try:
                seen.append(json.loads(text)["n"])
            except ValueError:
                broken.append(text[:40])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for document in documents:
            write_atomically(path, document)
    finally:
        done.set()
        reader.join()
    assert broken == [], f"{len(broken)} partial reads"
    assert json.loads(path.read_text())["n"] == 199
    assert seen == sorted(seen), "reads went back in time"
    assert [p.name for p in tmp_path.iterdir()] == ["endpoint.json"], "a partial file was left behind"
