"""The SQS endpoint of a front: ``POST /`` and the queue URLs' paths.

A call's SigV4 signature is checked as far as its headers go before its body
is read (bounded like every body), then the rest of it, its protocol parsed, and the action
its key's principal may do on each queue the call names (permissions.py); then the queues
it names choose its Raft group (``serving_group``, as for the native API), a
node whose engine of that group does not lead forwards the signed request, as
it came, to the group's leader (the SDKs do not follow a 307 on POST) and
relays the answer, and the leader runs the action.  Every failure is an SQS
error of the caller's protocol, never raftq's own shape.
"""

import asyncio
import logging
import time

from aiohttp import ClientError, ClientTimeout, web
from multidict import CIMultiDict

from .. import forwarding
from ..errors import ApiError
from ..keys import GROUP, GROUPS, SETTINGS
from ..leader import Elsewhere, node_authorization, serving_group
from ..principals import PRINCIPAL, PRINCIPALS
from . import sigv4, sts
from .actions import ACTIONS, Context, Target, check_required
from .context import from_native
from .errors import SqsError
from .permissions import authorize
from .protocol import new_request_id, parse, render, render_error, speaks_json

log = logging.getLogger(__name__)

FORWARDED = "X-Raftq-Sqs-Forwarded"    # how many nodes forwarded the call
# A new queue's name is placed on group 0's leader, which forwards the call on when it does not
# lead the group it chose.
MAX_FORWARDS = 2
# Hop-by-hop, or set anew by the client that forwards
NOT_FORWARDED = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
RELAYED = ("x-amzn-RequestId", "x-amzn-query-error", "Retry-After")
# A long poll (20 s) and the leader's write timeout, with room to spare
FORWARD_TIMEOUT_S = 45
# the calls that may wait for a message: forwarded on connections of their own (api/forwarding.py)
WAITING_ACTIONS = frozenset({"ReceiveMessage"})


def _refuse_too_large(request: web.Request) -> None:
    limit = request.app[SETTINGS].limits.max_request_bytes
    if (request.content_length or 0) > limit:
        raise SqsError("RequestEntityTooLarge", f"the request body may be at most {limit} bytes")


async def _body(request: web.Request) -> bytes:
    """The body, read once the call's headers passed (``sigv4.check``): at most
    --max-request-bytes (aiohttp's client_max_size, for a body without a Content-Length),
    within --body-timeout-s."""
    limits = request.app[SETTINGS].limits
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            return await request.read()
    except TimeoutError:
        raise SqsError("RequestEntityTooLarge", "the request body did not arrive in time") from None
    except web.HTTPRequestEntityTooLarge:
        raise SqsError("RequestEntityTooLarge", f"the request body may be at most {limits.max_request_bytes} "
                                                "bytes") from None
    except ConnectionError:
        # the client went away mid-body: nothing to log, nobody to answer
        raise SqsError("InvalidParameterValue", "the request body ended before its Content-Length") from None


def signed_hosts(app: web.Application) -> frozenset:
    """The names a call may be signed for: every node's HTTP address (a follower forwards the
    call as it came, Host included) and [sqs] hosts."""
    return frozenset(address.lower() for address in app[GROUPS].catalog.view()["http"].values() if address) \
        | app[SETTINGS].sqs.hosts


async def _to_group(request: web.Request, body: bytes, target: Target, waits: bool) -> web.Response | None:
    """None when this node's engine of the group of `target`'s queues leads (``request[GROUP]``
    is that group); else that leader's answer to the same signed request (`waits`: a call that
    may wait for a message, forwarded apart from the others)."""
    if "X-Raftq-Forward" in request.headers:
        # the native API's forwarding would change the Host the call was signed for
        raise SqsError("InvalidParameterValue", "X-Raftq-Forward belongs to the native API: every node forwards "
                                                "SQS calls to the leader by itself")
    try:
        # the node's own credentials for the catalog's leader: the caller signed for this node and call
        authorization = node_authorization(request.app)
        if target.existing:
            await serving_group(request.app, list(target.existing), authorization=authorization)
        request[GROUP] = await serving_group(request.app, target.queues, creating=target.creating,
                                             authorization=authorization, principal=request[PRINCIPAL])
    except Elsewhere as there:
        forwards = request.headers.get(FORWARDED, "0")
        forwards = int(forwards) if forwards.isascii() and forwards.isdigit() else MAX_FORWARDS
        if forwards >= MAX_FORWARDS:
            raise SqsError("ServiceUnavailable", "leadership moved while the call was forwarded; retry") from None
        return await _forward(request, body, f"{request.scheme}://{there.address}{request.path_qs}", forwards + 1,
                              waits)
    except ApiError as exc:
        if exc.code == "not_found":
            raise SqsError(*target.unknown) from None
        if exc.code == "cross_group":
            # only a redrive policy names a second queue
            queue, dead_letter = target.queues
            raise SqsError("InvalidParameterValue", f"Value for parameter RedrivePolicy is invalid. Reason: {queue} "
                                                    f"and {dead_letter} live in different Raft groups "
                                                    f"({exc.details.get('groups')} of this cluster's "
                                                    f"{request.app[GROUPS].count}); a dead-letter queue must live in "
                                                    "its queue's group (a queue not created yet joins it).") from None
        raise SqsError("ServiceUnavailable", exc.message) from None
    return None


async def _forward(request: web.Request, body: bytes, url: str, forwards: int, waits: bool) -> web.Response:
    # Every header as the client sent it, Host included: the leader checks the same signature.
    headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED)
    headers[FORWARDED] = str(forwards)
    try:
        return await forwarding.forward(request, url, body=body, headers=headers, waits=waits, relayed=RELAYED,
                                        timeout=ClientTimeout(total=FORWARD_TIMEOUT_S))
    except ApiError as exc:
        raise from_native(exc) from None
    except (ClientError, asyncio.TimeoutError) as exc:
        raise SqsError("ServiceUnavailable", f"the leader did not answer the forwarded call: {exc!r}; "
                                             "retry") from None


async def handle(request: web.Request) -> web.StreamResponse:
    request_id = new_request_id()
    protocol = "json" if speaks_json(request) else "query"
    try:
        # Nothing of the body is read before the headers are checked: the length it declares, then
        # the key, the signed headers, the host and the date (and the whole signature when it
        # signs its payload's hash).
        _refuse_too_large(request)
        principals = request.app[PRINCIPALS]
        access_key = sigv4.access_key_of(request.headers)
        found = await principals.sqs_key(access_key) if access_key else None
        pending = sigv4.check(found[0] if found else None, request.method,
                              request.rel_url.raw_path, request.rel_url.raw_query_string, request.headers,
                              time.time(), any_keys=principals.any_sqs_keys(), hosts=signed_hosts(request.app),
                              speaks_json=protocol == "json")
        body = await _body(request)
        signer = pending.verify(body)
        request[PRINCIPAL] = found[1]
        call = parse(request, body, request_id)
        if signer.service == sts.SERVICE:
            return web.Response(body=sts.answer(call.action, signer.key, request.app[SETTINGS].sqs.account,
                                                request_id), content_type="text/xml",
                                headers={"x-amzn-RequestId": request_id})
        if "queue" in request.match_info and "QueueUrl" not in call.params:
            # the query protocol may name the queue by the URL it posts to
            call.params["QueueUrl"] = request.path
        action = ACTIONS.get(call.action)
        if action is None or (not action.on_queue_url and "queue" in request.match_info):
            # a queue's URL takes only the actions on a queue, as AWS's do
            raise SqsError("InvalidAction", f"The action {call.action} is not valid for this endpoint.")
        check_required(action, call.params)
        ctx = Context(request, signer)
        target = action.target(ctx, call.params) if action.target is not None else None
        authorize(request, call.action, target.queues if target is not None else ())
        if target is not None:
            forwarded = await _to_group(request, body, target, waits=call.action in WAITING_ACTIONS)
            if forwarded is not None:
                return forwarded
        result = await action.handler(ctx, call.params)
        return render(protocol, call.action, result, request_id)
    except SqsError as exc:
        return render_error(protocol, exc, request_id)
    except Exception:
        log.exception("unhandled error serving SQS %s %s", request.method, request.path)
        return render_error(protocol, SqsError("InternalError", "the node hit a bug; see its log"), request_id)
