"""A real DICOMweb server for the tests: Debian's Orthanc with its DICOMweb plugin, in a
folder of its own, authentication on (HTTP basic), started on free ports."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ORTHANC = shutil.which("Orthanc")
PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")
USER, PASSWORD = "reader", "orthanc-test-secret"


@dataclass
class Orthanc:
    process: subprocess.Popen
    port: int

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def upload(self, path: Path) -> tuple[str, str]:
        """POST a DICOM file; its (study, series) UIDs."""
        import requests

        auth = (USER, PASSWORD)
        made = requests.post(
            f"{self.root}/instances", data=path.read_bytes(), auth=auth, timeout=60
        )
        made.raise_for_status()
        tags = requests.get(f"{self.root}/instances/{made.json()['ID']}/simplified-tags",
                            auth=auth, timeout=60).json()  # fmt: skip
        return tags["StudyInstanceUID"], tags["SeriesInstanceUID"]

    def series_url(
        self, study: str, series: str, user: str = USER, password: str = PASSWORD
    ) -> str:
        return (f"dicomweb+http://{user}:{password}@127.0.0.1:{self.port}/dicom-web/studies/"
                f"{study}/series/{series}")  # fmt: skip

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_orthanc(folder: Path) -> Orthanc:
    if ORTHANC is None or not PLUGIN.is_file():
        pytest.skip(
            "Orthanc with its DICOMweb plugin is not installed "
            "(apt-get install orthanc orthanc-dicomweb)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    config = {
        "Name": "tilestore-tests",
        "StorageDirectory": str(folder / "db"),
        "IndexDirectory": str(folder / "db"),
        "HttpPort": port,
        "DicomPort": _free_port(),
        "RemoteAccessAllowed": False,
        "AuthenticationEnabled": True,
        "RegisteredUsers": {USER: PASSWORD},
        "Plugins": [str(PLUGIN)],
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/"},
    }
    (folder / "orthanc.json").write_text(json.dumps(config))
    log = open(folder / "orthanc.log", "w")  # noqa: SIM115 (the server's, while it runs)
    process = subprocess.Popen(
        [ORTHANC, str(folder / "orthanc.json")], stdout=log, stderr=log, cwd=folder
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return Orthanc(process, port)
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail(
                    f"Orthanc did not start: {(folder / 'orthanc.log').read_text()[-2000:]}"
                )
            time.sleep(0.1)
