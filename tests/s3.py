"""A real S3 server for the tests: moto's server mode in a process of its own (as
zarr-python's tests use it), with authentication on: a user made through its IAM, whose
key signs every request, so a wrong secret is refused as S3 refuses it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
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
    read_only: dict[str, str] | None = None  # another user's key: reads and lists only

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

    def put(self, key: str, data: bytes, acl: str | None = None) -> str:
        """Put an object (acl "public-read": anyone may read it, unsigned)."""
        self.client().put_object(Bucket=BUCKET, Key=key, Body=data, **({"ACL": acl} if acl else {}))
        return f"s3://{BUCKET}/{key}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def start_s3(port: int | None = None, auth: bool = True) -> S3:
    """A moto server on `port` (a free one if None) with an empty bucket and a user who
    may do anything with S3 (its secret: to be grepped for in every output). auth=False:
    requests need no signature, and an object put public-read is read unsigned too (a
    public bucket's, as moto serves one; with auth on, moto fails those)."""
    if port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "INITIAL_NO_AUTH_ACTION_COUNT"}
    if auth:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "6"  # the two users' making, then auth
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

    def user(name: str, actions: list[str]) -> dict[str, str]:
        iam.create_user(UserName=name)
        allow = {"Effect": "Allow", "Action": actions, "Resource": "*"}
        policy = {"Version": "2012-10-17", "Statement": [allow]}
        iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=json.dumps(policy))
        return iam.create_access_key(UserName=name)["AccessKey"]

    made = user("reader", ["s3:*"])
    # may read and list, never write: a bucket that refuses this user's writes
    looks = user("looker", ["s3:GetObject", "s3:ListBucket", "s3:HeadObject"])
    server = S3(process, port, made["AccessKeyId"], made["SecretAccessKey"])
    server.read_only = {
        "AWS_ACCESS_KEY_ID": looks["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": looks["SecretAccessKey"],
    }
    server.client().create_bucket(Bucket=BUCKET)
    return server


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)


class Proxy:
    """A TCP proxy in front of a server, as a link between: each chunk a client sends waits
    `delay_s` (a request is one chunk, so each costs a round trip more), and the first request
    of each of the first `throttle` connections is answered 503 SlowDown, as S3 throttles, and
    the connection closed; replies come back at once. Counts requests and bytes sent back.

        with Proxy(server.port, delay_s=0.020) as proxy:  # 127.0.0.1:proxy.port
    """

    def __init__(
        self,
        target_port: int,
        delay_s: float = 0.0,
        throttle: int = 0,
        gone_after: int | None = None,
    ) -> None:
        """gone_after: once this many bytes have gone up, the server is gone (every
        connection ended, new ones refused) until `mend`."""
        self.target = ("127.0.0.1", target_port)
        self.delay_s, self.throttle, self.gone_after = delay_s, throttle, gone_after
        self.requests = self.bytes_back = self.bytes_up = self.throttled = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="proxy")

    def __enter__(self) -> Proxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        def stop() -> None:  # the connections still open ended too, then the loop
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_soon(self._loop.stop)

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    @property
    def gone(self) -> bool:
        return self.gone_after is not None and self.bytes_up >= self.gone_after

    def mend(self) -> None:
        """The server back: requests go through again."""
        self.gone_after = None

    async def _serve(self, reader, writer) -> None:
        first = await reader.read(65536)
        if not first or self.gone:
            writer.close()
            return
        if self.throttled < self.throttle:
            self.throttled += 1
            head = (
                "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(SLOW_DOWN)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + SLOW_DOWN)
            await writer.drain()
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return

        async def up(data: bytes) -> None:
            while data:
                if self.gone:  # the server stopped: this connection ends with it
                    writer.close()
                    break
                self.requests += 1
                self.bytes_up += len(data)
                await asyncio.sleep(self.delay_s)
                up_writer.write(data)
                await up_writer.drain()
                data = await reader.read(65536)
            up_writer.close()

        async def down() -> None:
            while data := await up_reader.read(1 << 20):
                self.bytes_back += len(data)
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(up(first), down(), return_exceptions=True)
