"""Bodies in and out: JSON by default, CBOR on request; message bodies in both forms.

A message body is JSON data (``body``) or raw bytes (``body_b64`` in JSON, a
byte string ``body`` in CBOR).  The state machine stores what it was given
— bytes stay bytes — so a reply echoes the form the body was put in.
"""

import base64
import binascii

import cbor2
import orjson
from aiohttp import web

from .errors import ApiError

CBOR = "application/cbor"
JSON = "application/json"


def wants_cbor(request: web.Request) -> bool:
    return CBOR in request.headers.get("Accept", "")


async def read_body(request: web.Request, *, required: bool = True):
    """The request's decoded body (None when empty and optional)."""
    raw = await request.read()
    if not raw:
        if required:
            raise ApiError("bad_request", "the request needs a body")
        return None
    if request.content_type == CBOR:
        try:
            return cbor2.loads(raw)
        except Exception as exc:
            raise ApiError("bad_request", f"body is not valid CBOR: {exc}") from None
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
        if isinstance(value.get("body"), bytes):
            value = dict(value)
            value["body_b64"] = base64.b64encode(value.pop("body")).decode()
        return {k: json_safe(v) for k, v in value.items()}
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
