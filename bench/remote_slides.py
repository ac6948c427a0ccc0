"""Slides converted from S3 against the same slides on the local disk (issue 66).

A real S3 server (moto's, authentication on: tests/s3.py) behind a proxy that adds
`--delay-ms` to every request (tests/s3.py's Proxy). For each slide (CMU-1-Small-Region,
1.9 MB, and a slide of `--size` px of real CMU-1 tissue made by bench/make_slide.py), and for
a cohort of `--cohort` copies of the small one converted at once: `tilestore convert` from
the local file and from its s3:// URL (a fresh cache each time), best of `--repeats`; the
ratio local/remote (1.0: as fast as local), the requests made and the bytes fetched against
the object's size, and the stores compared file by file (the source's time aside).

    python bench/remote_slides.py --size 20000 --delay-ms 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from make_slide import CMU, make_large_svs  # noqa: E402

from tests.conftest import store_tree  # noqa: E402
from tests.s3 import Proxy, start_s3  # noqa: E402


def convert(inputs: list[str], out: Path, env: dict[str, str]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tilestore.cli", "convert", *inputs, "-o", str(out)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--cohort", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/remote_slides"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "remote_slides.json")
    args = parser.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    large = work / f"large{args.size}.svs"
    if not large.exists():
        make_large_svs(large, args.size)
    s3 = start_s3()
    rows = []
    try:
        cases = {  # case -> (name, file) of each slide, each under a name of its own
            "small": [("s000.svs", CMU)],
            f"{args.size} px": [("large.svs", large)],
            f"{args.cohort} small at once": [(f"s{i:03d}.svs", CMU) for i in range(args.cohort)],
        }
        with Proxy(s3.port, delay_s=args.delay_ms / 1000) as proxy:
            print(
                f"| slides | bytes | local s | S3 s (+{args.delay_ms:g} ms a request) | "
                "local / S3 | requests | bytes fetched / object bytes | stores equal |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for case, files in cases.items():
                tag = case.replace(" ", "_")
                urls = [s3.put(f"{tag}/{name}", f.read_bytes()) for name, f in files]
                folder = work / "local" / tag
                folder.mkdir(parents=True, exist_ok=True)
                for name, f in files:
                    if not (folder / name).exists():
                        os.symlink(f.resolve(), folder / name)
                local_in = [str(folder / name) for name, _ in files]
                size = sum(f.stat().st_size for _, f in files)
                env = s3.env(work / "cache")
                env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
                local_s, remote_s, requests, fetched = [], [], 0, 0
                for _ in range(args.repeats):
                    local_s.append(convert(local_in, work / "out-local", {**os.environ}))
                    shutil.rmtree(work / "cache", ignore_errors=True)
                    before_r, before_b = proxy.requests, proxy.bytes_back
                    remote_s.append(convert(urls, work / "out-s3", env))
                    requests, fetched = proxy.requests - before_r, proxy.bytes_back - before_b
                a, b = (
                    store_tree(work / f"out-{side}", source_time=False) for side in ("local", "s3")
                )
                same = sum(a[k] == b.get(k) for k in a)
                row = {
                    "case": case, "slides": len(files), "bytes": size,
                    "local_s": round(min(local_s), 2), "s3_s": round(min(remote_s), 2),
                    "ratio": round(min(local_s) / min(remote_s), 3), "requests": requests,
                    "fetched_over_size": round(fetched / size, 3),
                    "files": len(a), "files_equal": same,
                }  # fmt: skip
                rows.append(row)
                print(f"| {case} | {size / 1e6:.1f} MB | {row['local_s']:.2f} | "
                      f"{row['s3_s']:.2f} | {row['ratio']:.2f} | {requests} | "
                      f"{row['fetched_over_size']:.3f} | {same} / {len(a)} |")  # fmt: skip
            # the link itself: the large object in one GET through the proxy, as boto3 reads it
            via = _client_via(s3, proxy.port)
            started = time.perf_counter()
            body = via.get_object(Bucket="slides", Key=f"{args.size}_px/large.svs")["Body"].read()
            link_s = time.perf_counter() - started
            link = {"bytes": len(body), "seconds": round(link_s, 2),
                    "mb_per_s": round(len(body) / link_s / 1e6, 1)}  # fmt: skip
            print(f"the link: {len(body) / 1e6:.1f} MB in one GET in {link_s:.2f} s "
                  f"({link['mb_per_s']} MB/s)")  # fmt: skip
    finally:
        s3.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"delay_ms": args.delay_ms, "rows": rows, "link": link}, indent=1)
    )


def _client_via(s3, port: int):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id=s3.key,
        aws_secret_access_key=s3.secret,
    )


if __name__ == "__main__":
    main()
