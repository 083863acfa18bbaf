"""Where a running `gpufed up` serves: the addresses it writes under its state dir, for clients.

Apart from `federation.runtime.embedded`, which starts the server and with it imports nearly all of
gpufed (the Kubernetes client, the history store, ...): every CLI command reads this file to find the
embedded default, and importing the server for that cost each command about 0.7 s of its 1.1 s start.
"""

from __future__ import annotations

import json
from pathlib import Path

ENDPOINT_FILE = "endpoint.json"


def read_endpoint(state_dir: Path) -> dict[str, str]:
    """The running embedded server's addresses, as `gpufed up` wrote them."""
    data: dict[str, str] = json.loads((state_dir / ENDPOINT_FILE).read_text())
    return data
