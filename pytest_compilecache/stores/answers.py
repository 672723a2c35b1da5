"""A cap on the answers a store's client reads whole into memory: listings, metadata, error bodies.

Every backend's SDK reads such an answer whole before the store sees it (botocore's ``AWSResponse.content``,
requests' ``Response.content`` under google-cloud-storage and azure-core), whatever its length: a server that
states a length of 100 GiB, or sends without end, costs as much memory as it sends, and goes on in the
background after the store's timeout gave up waiting. So such answers go through :class:`CappedAnswer`:
past :data:`MAX_ANSWER` bytes (or a stated length over it) the read ends with a :class:`StoreError`, and the
connection is closed. Streamed answers (downloads) are the caller's to bound (``BoundedFile``, the size
checks of each backend's ``get``), and pass as they are.

Both clients read such an answer through the urllib3 response's ``stream()``: botocore's ``content`` joins it,
requests' ``iter_content`` (which ``content`` uses) iterates it. Nothing else of the response changes.

Loaded only by the backends that use it (with their SDK).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Iterator

from ..errors import StoreError

# A page of 1,000 keys in S3's XML is ~300 KiB; GCS's and Azure's pages are alike: far below this.
MAX_ANSWER = 16 << 20


class CappedAnswer:
    """A urllib3 response whose :meth:`stream` ends with a StoreError past ``limit`` bytes; everything else is the
    response's own (``read``, headers, the connection)."""

    def __init__(self, raw: Any, location: str, limit: int = MAX_ANSWER) -> None:
        self._raw, self._location, self._limit = raw, location, limit

    def stream(self, amt: int | None = 2**16, decode_content: bool | None = None) -> Iterator[bytes]:
        stated = self._stated_length()
        if stated is not None and stated > self._limit:
            self._refuse(f"it states {stated} bytes")
        total = 0
        for chunk in self._raw.stream(amt, decode_content=decode_content):
            total += len(chunk)
            if total > self._limit:
                self._refuse("it sent more")
            yield chunk

    def _stated_length(self) -> int | None:
        try:
            return int(self._raw.headers.get("Content-Length", ""))
        except (AttributeError, TypeError, ValueError):
            return None

    def _refuse(self, what: str) -> None:
        try:
            self._raw.close()  # the connection goes, not back to the pool half read
        except Exception:  # noqa: BLE001 - closing is a courtesy; the refusal is what matters
            pass
        raise StoreError(
            f"{self._location}: the endpoint's answer is larger than the {self._limit} bytes an answer to a listing "
            f"or a metadata request may take ({what})"
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def cap_botocore(client: Any, location: str) -> None:
    """Cap the answers botocore's ``client`` reads whole. Its endpoint's HTTP session's ``send`` reads an answer
    not asked for as a stream (``request.stream_output``) before returning it: here it is asked for as a stream,
    and read through :class:`CappedAnswer` (``content``, as ``send`` would have); a download's ``StreamingBody``
    reads ``read()``, as before."""
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    send: Callable[..., Any] | None = getattr(session, "send", None)
    if send is None:  # another botocore: its answers go uncapped, as before
        return

    def capped(request: Any) -> Any:
        whole = not getattr(request, "stream_output", False)
        request.stream_output = True
        try:
            response = send(request)
        finally:
            request.stream_output = not whole
        response.raw = CappedAnswer(response.raw, location)
        if whole:
            response.content  # noqa: B018 - read now, capped, where send would have read it whole
        return response

    session.send = capped  # type: ignore[union-attr]


def capped_requests_session(location: str) -> Any:
    """A ``requests.Session`` whose answers not asked for as a stream (``stream=False``: read whole) are capped."""
    import requests

    session = requests.Session()
    cap_requests_session(session, location)
    return session


def cap_requests_session(session: Any, location: str) -> None:
    """Mount on ``session`` (a client's own, or a new one) adapters that cap the answers it reads whole."""
    from requests.adapters import HTTPAdapter

    class _Capping(HTTPAdapter):
        def send(self, request: Any, stream: bool = False, *args: Any, **kwargs: Any) -> Any:
            response = super().send(request, stream, *args, **kwargs)
            if not stream:  # requests reads it whole next (Session.send: r.content)
                response.raw = CappedAnswer(response.raw, location)
            return response

    adapter = _Capping()
    for scheme in ("http://", "https://"):
        session.mount(scheme, adapter)
