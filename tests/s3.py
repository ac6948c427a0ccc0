"""A real S3 server for the tests: moto's server mode in a process of its own (as
zarr-python's tests use it), with authentication on: a user made through its IAM, whose
key signs every request, so a wrong secret is refused as S3 refuses it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3", reason="moto[server] (with boto3) is not installed")
pytest.importorskip("moto.server", reason="moto[server] is not installed")
pytest.importorskip("s3fs", reason="s3fs (tilestore[remote]) is not installed")

BUCKET = "slides"


@dataclass
class S3:
    """A running server, its endpoint and a user's key (the env a command runs with)."""

    process: subprocess.Popen
    port: int
    key: str
    secret: str

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, cache: Path, **changed: str) -> dict[str, str]:
        """The environment of a command that reads from this server, caching in `cache`."""
        out = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        out.update(
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_ACCESS_KEY_ID=self.key,
            AWS_SECRET_ACCESS_KEY=self.secret,
            AWS_DEFAULT_REGION="us-east-1",
            AWS_MAX_ATTEMPTS="2",  # a server that is gone is said soon
            TILESTORE_CACHE=str(cache),
        )
        out.update(changed)
        return out

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
        )

    def put(self, key: str, data: bytes) -> str:
        self.client().put_object(Bucket=BUCKET, Key=key, Body=data)
        return f"s3://{BUCKET}/{key}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def start_s3(port: int | None = None) -> S3:
    """A moto server on `port` (a free one if None) with an empty bucket and a user who
    may do anything with S3 (its secret: to be grepped for in every output)."""
    if port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}  # the user's making, then auth
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail("moto's server did not start")
            time.sleep(0.1)
    iam = boto3.client(
        "iam",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam.create_user(UserName="reader")
    allow = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
    policy = {"Version": "2012-10-17", "Statement": [allow]}
    iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(policy))
    made = iam.create_access_key(UserName="reader")["AccessKey"]
    server = S3(process, port, made["AccessKeyId"], made["SecretAccessKey"])
    server.client().create_bucket(Bucket=BUCKET)
    return server
