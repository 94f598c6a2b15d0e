"""The two wire protocols of the SQS API: which one a request speaks, and the
AWS JSON 1.0 protocol's parsing and rendering (the query protocol is query.py).

Both turn a request into (action, params), params shaped as the JSON
protocol's input of that action, and an action's result (shaped as the JSON
protocol's output) or SqsError into a response.
"""

import uuid
from dataclasses import dataclass
from urllib.parse import parse_qsl

import orjson
from aiohttp import web

from ..bounded import check_json
from ..errors import ApiError
from . import query
from .errors import SqsError

JSON_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
FORM_TYPE = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Call:
    protocol: str            # "json" or "query"
    action: str
    params: dict
    request_id: str


def new_request_id() -> str:
    return str(uuid.uuid4())


def speaks_json(request: web.Request) -> bool:
    return "X-Amz-Target" in request.headers


# The JSON protocol's values (every key, scalar and container), counted before anything is
# decoded: the largest call, a SendMessageBatch of 10 entries of 10 attributes, holds about 700.
MAX_JSON_VALUES = 5_000


def parse(request: web.Request, body: bytes, request_id: str) -> Call:
    """The call a request makes; SqsError when it is not a well-formed call of either protocol.
    What bounds the work (fields, values) is counted in the raw bytes first, in C."""
    if speaks_json(request):
        target = request.headers["X-Amz-Target"]
        if not target.startswith(TARGET_PREFIX):
            raise SqsError("InvalidAction", f"X-Amz-Target {target!r} does not name an AmazonSQS action")
        try:
            check_json(body, MAX_JSON_VALUES)
            params = orjson.loads(body) if body else {}
        except ApiError as exc:
            raise SqsError("SerializationException", exc.message) from None
        except orjson.JSONDecodeError as exc:
            raise SqsError("SerializationException", f"the body is not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise SqsError("SerializationException", "the body must be a JSON object")
        return Call("json", target[len(TARGET_PREFIX):], params, request_id)
    form = body if body and request.content_type == FORM_TYPE else b""
    given = request.query_string
    if (given.count("&") + 1 if given else 0) + (form.count(b"&") + 1 if form else 0) > query.MAX_FIELDS:
        raise SqsError("MalformedQueryString", f"a request carries at most {query.MAX_FIELDS} parameters")
    try:
        fields = parse_qsl(given, keep_blank_values=True, strict_parsing=bool(given))
        if form:
            fields += parse_qsl(form.decode(), keep_blank_values=True, strict_parsing=True, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise SqsError("MalformedQueryString", f"the query or form is not well formed: {exc}") from None
    return Call("query", *query.parse(fields), request_id)


def render(call_protocol: str, action: str, result: dict, request_id: str) -> web.Response:
    if call_protocol == "json":
        return web.Response(body=orjson.dumps(result), content_type=JSON_TYPE,
                            headers={"x-amzn-RequestId": request_id})
    return web.Response(body=query.render(action, result, request_id), content_type="text/xml",
                        headers={"x-amzn-RequestId": request_id})


def render_error(call_protocol: str, error: SqsError, request_id: str) -> web.Response:
    fault = "Sender" if error.sender_fault else "Receiver"
    headers = {"x-amzn-RequestId": request_id}
    if error.status == 503:
        headers["Retry-After"] = "1"
    if call_protocol == "json":
        headers["x-amzn-query-error"] = f"{error.query_code};{fault}"
        return web.Response(body=orjson.dumps({"__type": error.kind.json_type, "message": error.message}),
                            status=error.status, content_type=JSON_TYPE, headers=headers)
    return web.Response(body=query.render_error(error, fault, request_id), status=error.status,
                        content_type="text/xml", headers=headers)
