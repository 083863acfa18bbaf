"""Runs inside `.venv-botocore`: reads signing cases as JSON on stdin, prints botocore's signatures.

Each case: method, url (exactly as gpufed sends it), headers (those gpufed signs, x-amz-date and
x-amz-content-sha256 among them), access key, secret, region. botocore's own S3 signer computes the
canonical request from that URL and those headers; nothing of gpufed's is imported here.
"""

import json
import sys
import types
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def sign(case: dict[str, Any]) -> dict[str, str]:
    request = AWSRequest(method=case["method"], url=case["url"], headers=dict(case["headers"]))
    request.context["timestamp"] = case["headers"]["x-amz-date"]
    # As our client does: the body is not hashed into the signature (UNSIGNED-PAYLOAD).
    request.context["client_config"] = types.SimpleNamespace(s3={"payload_signing_enabled": False})
    auth = S3SigV4Auth(Credentials(case["access_key"], case["secret"]), "s3", case["region"])
    canonical = auth.canonical_request(request)
    string_to_sign = auth.string_to_sign(request, canonical)
    return {"canonical": canonical, "signature": auth.signature(string_to_sign, request)}


print(json.dumps([sign(case) for case in json.load(sys.stdin)]))
