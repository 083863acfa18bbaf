"""The object stores `gpufed up` runs itself (`federation.runtime.seaweed.EmbeddedStores`), in this
process on real SeaweedFS: the embedded default's two `seaweed:` servers start side by side, each
record then points at its server with keys that the bucket accepts (an S3 request signed with them,
answered by SeaweedFS), `stores.json` says where each store is without a secret, and the stop takes
every server and the index away."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from datasync.credentials import AwsCredentials, Secret
from datasync.seaweed_process import request_status
from datasync.store_config import S3StoreConfig
from federation.runtime.config import load_config
from federation.runtime.embedded import default_config_path
from federation.runtime.seaweed import STORES_FILE, EmbeddedStores, key_env

pytestmark = pytest.mark.integration


async def test_the_default_stores_start_serve_signed_requests_and_stop(tmp_path: Path) -> None:
    records = load_config(default_config_path()).object_stores
    stores = EmbeddedStores(tmp_path, records)
    assert stores.needed
    started = await stores.start()
    try:
        servers = {r.seaweed for r in records if r.seaweed is not None}
        assert len(servers) == 2, "the embedded default runs two SeaweedFS servers"
        index = json.loads((tmp_path / STORES_FILE).read_text())
        for record in started:
            if record.seaweed is None:
                continue
            config = record.config
            assert isinstance(config, S3StoreConfig)
            assert config.endpoint is not None
            assert config.endpoint.startswith("http://127.0.0.1:")
            key_var, secret_var = key_env(record.seaweed)
            assert (config.access_key_id_env, config.secret_access_key_env) == (key_var, secret_var)
            # The keys are the server's own: a request signed with them lists the bucket, one signed
            # with another secret is refused.
            key_id, secret = os.environ[key_var], os.environ[secret_var]
            bucket_url = f"{config.endpoint}/{config.bucket}"
            assert (
                request_status("GET", bucket_url, AwsCredentials(key_id, Secret(secret)), timeout_s=30) == 200
            )
            assert (
                request_status("GET", bucket_url, AwsCredentials(key_id, Secret(secret + "x")), timeout_s=30)
                == 403
            )
            entry = index[record.name]
            assert entry["endpoint"] == config.endpoint
            assert entry["bucket"] == config.bucket
            assert os.environ[secret_var] not in json.dumps(index), "stores.json holds no secret"
    finally:
        stores.stop()
        for record in records:  # the keys went into this process's environment, as in `gpufed up`'s
            for name in key_env(record.seaweed or ""):
                os.environ.pop(name, None)
    assert not (tmp_path / STORES_FILE).exists()
    stores.stop()  # a second stop finds nothing left to stop
