"""Bodies in and out: JSON by default, CBOR on request; message bodies in both forms.

A message body is JSON data (``body``) or raw bytes (``body_b64`` in JSON, a
byte string ``body`` in CBOR).  The state machine stores what it was given
— bytes stay bytes — so a reply echoes the form the body was put in.
"""

import asyncio
import base64
import binascii

import cbor2
import orjson
from aiohttp import web

from raftq.wire_format import with_body_b64

from .bounded import check_cbor, check_json
from .errors import ApiError
from .keys import SETTINGS

CBOR = "application/cbor"
JSON = "application/json"


def wants_cbor(request: web.Request) -> bool:
    return CBOR in request.headers.get("Accept", "")


async def read_body(request: web.Request, *, required: bool = True):
    """The request's decoded body (None when empty and optional)."""
    raw = await read_raw(request)
    if not raw:
        if required:
            raise ApiError("bad_request", "the request needs a body")
        return None
    return _decode(request, raw)


async def read_optional_body(request: web.Request):
    """The request's decoded body, {} when it has none. One that decodes to a falsy value
    ([], 0, "", null) is returned as it is, for the caller to refuse: taken for none, it ran
    the call with its defaults (a receive leased, a redrive moved)."""
    raw = await read_raw(request)
    return _decode(request, raw) if raw else {}


async def read_raw(request: web.Request) -> bytes:
    """The request's body as it came: bounded by --max-request-bytes and --body-timeout-s."""
    limits = request.app[SETTINGS].limits
    if (request.content_length or 0) > limits.max_request_bytes:
        # refused on the declared length, before waiting for any of it
        raise ApiError("too_large", f"the request body may be at most {limits.max_request_bytes} bytes")
    limit = limits.body_timeout_s
    try:
        async with asyncio.timeout(limit):
            return await request.read()
    except TimeoutError:
        raise ApiError("timeout", f"the request body did not arrive within {limit} s") from None
    except ConnectionError:
        # the client went away mid-body: nothing to log, nobody to answer
        raise ApiError("bad_request", "the request body ended before its Content-Length") from None


def _decode(request: web.Request, raw: bytes):
    if request.content_type == CBOR:
        check_cbor(raw)
        try:
            return cbor2.loads(raw)
        except Exception as exc:
            raise ApiError("bad_request", f"body is not valid CBOR: {exc}") from None
    check_json(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError("bad_request", f"body is not valid JSON: {exc}") from None


def respond(request: web.Request, payload, status: int = 200, headers=None) -> web.Response:
    if wants_cbor(request):
        return web.Response(body=cbor2.dumps(payload), status=status, content_type=CBOR,
                            headers=headers)
    return web.Response(body=orjson.dumps(json_safe(payload)), status=status,
                        content_type=JSON, headers=headers)


def json_safe(value):
    """Bytes become body_b64 on messages; anywhere else, base64 text."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in with_body_b64(value).items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def message_from_wire(raw, index: int) -> dict:
    """A client's message as the state machine takes it (body or body_b64 → body)."""
    if not isinstance(raw, dict):
        raise ApiError("bad_request", f"message {index} must be an object")
    if "body_b64" in raw:
        if "body" in raw:
            raise ApiError("bad_request", f"message {index}: give body or body_b64, not both")
        raw = dict(raw)
        encoded = raw.pop("body_b64")
        if not isinstance(encoded, str):
            raise ApiError("bad_request", f"message {index}: body_b64 must be a base64 string")
        try:
            raw["body"] = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("bad_request", f"message {index}: body_b64 is not valid base64") from None
    return raw
