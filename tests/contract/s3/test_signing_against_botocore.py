"""Our SigV4 signatures for S3, judged by botocore's S3 signer in a virtualenv of its own.

SeaweedFS, the only S3 server here, accepted a canonical URI encoded twice (a key with a space signed
as `sp%2520ace`), so the datasync tests against it could not show that AWS S3 would refuse every
request for such a key. botocore is what the AWS SDK for Python signs with; it cannot share the
project's virtualenv (it needs python-dateutil < 3, the kubernetes client >= 3), so it runs in
`.venv-botocore/`, built on first use, and is given the exact URL and headers our client sends.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from datasync.credentials import AwsCredentials, Secret
from datasync.s3_requests import S3Requests, sign_v4, url_with_query
from tests.side_venv import ensure_side_venv

REPO = Path(__file__).resolve().parents[3]
REQUIREMENT = "botocore==1.44.8"
VENV = REPO / ".venv-botocore"
RUNNER = Path(__file__).with_name("botocore_runner.py")

KEYS = [
    "plain/key.bin",
    "sp ace",
    "plus+and%percent",
    "url&xml<specials>=?#",
    "ctl\x01char",
    "new\nline",
    "tab\there",
    "del\x7fete",
    "folder/",
    "ünïcødé/日本.txt",
    "tilde~dash-under_dot.",
    "a//double/./dot/../segments",
]


@pytest.fixture(scope="module")
def botocore_python() -> Path:
    return ensure_side_venv(VENV.name, REQUIREMENT)


def _botocore(python: Path, cases: list[dict[str, object]]) -> list[dict[str, str]]:
    done = subprocess.run(
        [str(python), str(RUNNER)], input=json.dumps(cases), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: list[dict[str, str]] = json.loads(done.stdout)
    return result


def _case(method: str, key: str, query: dict[str, str], headers: dict[str, str]) -> dict[str, object]:
    credentials = AwsCredentials("AKIDEXAMPLE", Secret("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"))
    client = S3Requests("https://s3.example.internal:8333", "datasets", "eu-west-3", credentials)
    url = client.object_url(key)
    signed = sign_v4(
        method,
        url,
        query,
        headers,
        credentials,
        "eu-west-3",
        dt.datetime(2026, 11, 27, 6, 30, 5, tzinfo=dt.UTC),
    )
    # SigV4 lets a client choose which headers it signs (host and x-amz-* at least); botocore signs
    # every header it is given, so it is given those our signature names (a range header is sent
    # but not signed by us).
    names = signed["authorization"].split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    sent = {k: v for k, v in signed.items() if k in names}
    return {
        "method": method,
        "url": url_with_query(url, query),
        "headers": sent,
        "access_key": credentials.access_key_id,
        "secret": credentials.secret_access_key.reveal(),
        "region": "eu-west-3",
        "ours": signed["authorization"].rsplit("Signature=", 1)[1],
    }


def test_our_signatures_are_botocores_for_every_kind_of_key_and_request(botocore_python: Path) -> None:
    cases = [_case("GET", key, {}, {}) for key in KEYS]
    cases += [_case("PUT", key, {}, {}) for key in KEYS]
    cases += [
        _case("PUT", "sp ace/part", {"partNumber": "3", "uploadId": "a/b+c=="}, {}),
        _case("GET", "", {"list-type": "2", "prefix": "sp ace/ü\n", "encoding-type": "url"}, {}),
        _case("PUT", "copy dst", {}, {"x-amz-copy-source": "/datasets/sp%20ace"}),
        _case("GET", "range me", {}, {"range": "bytes=0-9"}),
    ]
    theirs = _botocore(botocore_python, cases)
    wrong = [
        (case["method"], case["url"], mine["canonical"])
        for case, mine in zip(cases, theirs, strict=True)
        if case["ours"] != mine["signature"]
    ]
    assert not wrong, wrong
