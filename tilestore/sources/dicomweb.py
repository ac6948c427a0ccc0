"""A DICOM WSI series on a DICOMweb server, named
``dicomweb+https://[user:password@]host[:port]/<root>/studies/<study>/series/<series>``:
its instances listed by QIDO-RS, each fetched whole by WADO-RS (the stored Part 10 file, as
the server keeps it), staged to the cache as a folder of the series, then read as a local
DICOM folder (`tilestore.sources.dicom`).

A staged series is written into a temporary folder and renamed whole, with the instances it
holds recorded beside it: a killed fetch leaves nothing that reads as a series, and a series
staged before is used again while the server lists the same instances. Authentication: the
URL's user and password (HTTP basic), or a bearer token in DICOMWEB_TOKEN; neither is ever
shown (`tilestore.urls.shown`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tilestore.errors import SlideError
from tilestore.urls import DICOMWEB, redacted, shown

STAGED = ".staged.json"  # in a staged series' folder: its instances, as the server listed them
_SERIES = re.compile(r"^(?P<base>.+)/studies/(?P<study>[^/]+)/series/(?P<series>[^/]+)/?$")
TIMEOUT_S = 60  # a request's connect and read timeout


@dataclass(frozen=True)
class DicomWebSeries:
    """A series on a DICOMweb server, and where it is staged under the cache folder."""

    url: str
    cache: Path

    @property
    def _parts(self) -> tuple[str, str, str]:
        """(the service's base URL, without user or password; study UID; series UID)."""
        plain = self.url[len(DICOMWEB) :]
        parts = urlsplit(plain)
        host = parts.netloc.rpartition("@")[2]
        found = _SERIES.match(f"{parts.scheme}://{host}{parts.path}")
        if found is None:
            raise SlideError(
                f"{shown(self.url)}: a DICOMweb series is named "
                "dicomweb+https://host/<root>/studies/<study UID>/series/<series UID>"
            )
        return found["base"], found["study"], found["series"]

    @property
    def local(self) -> Path:
        """cache/slides/dicomweb/<host>[_<port>]/<study>/<series>: a folder named by its
        series, as a local DICOM folder's store is named by the folder."""
        base, study, series = self._parts
        host = urlsplit(base).netloc.replace(":", "_")
        return self.cache / "slides" / "dicomweb" / host / study / series

    def _session(self):
        import requests

        session = requests.Session()
        parts = urlsplit(self.url[len(DICOMWEB) :])
        if parts.username is not None:
            session.auth = (unquote(parts.username), unquote(parts.password or ""))
        elif os.environ.get("DICOMWEB_TOKEN"):
            session.headers["Authorization"] = f"Bearer {os.environ['DICOMWEB_TOKEN']}"
        return session

    def _get(self, session, url: str, accept: str):
        """One request; SlideError in one line for what the server or the link says."""
        import requests

        try:
            response = session.get(url, headers={"Accept": accept}, timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            raise SlideError(
                f"{shown(self.url)}: cannot reach the DICOMweb server: {type(exc).__name__}: "
                f"{redacted(' '.join(str(exc).split()))}"
            ) from None
        if response.status_code in (401, 403):
            raise SlideError(
                f"{shown(self.url)}: access refused ({response.status_code}): check the user "
                "and password in the URL, or DICOMWEB_TOKEN"
            )
        if response.status_code == 404:
            raise SlideError(f"{shown(self.url)}: not found (404): no such study or series")
        if response.status_code != 200:
            raise SlideError(
                f"{shown(self.url)}: the DICOMweb server answered {response.status_code} "
                f"{response.reason}"
            )
        return response

    def instances(self, session=None) -> list[str]:
        """The series' SOP Instance UIDs, as QIDO-RS lists them (one request)."""
        base, study, series = self._parts
        session = session or self._session()
        url = f"{base}/studies/{study}/series/{series}/instances"
        listed = self._get(session, url, "application/dicom+json")
        try:
            uids = [item["00080018"]["Value"][0] for item in listed.json()]
        except (ValueError, KeyError, IndexError, TypeError):
            raise SlideError(
                f"{shown(self.url)}: the DICOMweb server's instance list is not DICOM JSON"
            ) from None
        if not uids:
            raise SlideError(
                f"{shown(self.url)}: not found: the server lists no instances of this series"
            )
        return sorted(uids)

    def stage(self, progress: Callable[[int, int], None] | None = None) -> Path:
        """The series' folder of DICOM files, fetched unless staged with the same instances.
        progress: called as progress(instances_landed_now, instances_total)."""
        session = self._session()
        uids = self.instances(session)
        local = self.local
        if _staged_as(local, uids):
            if progress is not None:
                progress(len(uids), len(uids))
            return local
        base, study, series = self._parts
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix=f".{series}.", suffix=".part", dir=local.parent))
        except OSError as exc:
            raise SlideError(
                f"{local.parent}: cannot make the slide cache: {exc.strerror}"
            ) from None
        try:
            for uid in uids:
                url = f"{base}/studies/{study}/series/{series}/instances/{uid}"
                # transfer-syntax=*: the file as stored (without it DICOMweb's default is
                # uncompressed, and JPEG tiles would come decoded: another store)
                accept = 'multipart/related; type="application/dicom"; transfer-syntax=*'
                got = self._get(session, url, accept)
                (folder / f"{uid}.dcm").write_bytes(self._part_10(got, uid))
                if progress is not None:
                    progress(1, len(uids))
            (folder / STAGED).write_text(json.dumps({"url": shown(self.url), "instances": uids}))
            if _staged_as(local, uids):  # another process staged it meanwhile (and may be
                return local  # reading it): its copy stands, ours goes
            if local.exists():  # a copy of other instances: replaced
                shutil.rmtree(local)
            os.replace(folder, local)
        except OSError as exc:
            raise SlideError(f"{shown(self.url)}: cannot stage to {local}: {exc}") from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return local

    def _part_10(self, response, uid: str) -> bytes:
        """The one DICOM file a WADO-RS instance reply carries (multipart/related)."""
        kind = response.headers.get("Content-Type", "")
        found = re.search(r'boundary="?([^";]+)"?', kind)
        if not kind.startswith("multipart/related") or found is None:
            raise SlideError(f"{shown(self.url)}: instance {uid} came back as {kind!r}, not DICOM")
        parts = [
            p for p in response.content.split(b"--" + found[1].encode()) if p not in (b"", b"--")
        ]
        bodies = [p.split(b"\r\n\r\n", 1)[1] for p in parts if b"\r\n\r\n" in p]
        bodies = [b[:-2] if b.endswith(b"\r\n") else b for b in bodies]
        if len(bodies) != 1 or bodies[0][128:132] != b"DICM":
            raise SlideError(f"{shown(self.url)}: instance {uid} is not one DICOM file")
        return bodies[0]


def _staged_as(local: Path, uids: list[str]) -> bool:
    """Whether the folder holds a staged copy of exactly these instances."""
    try:
        return json.loads((local / STAGED).read_text()).get("instances") == uids
    except (OSError, ValueError):
        return False
