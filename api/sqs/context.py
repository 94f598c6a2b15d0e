"""What every SQS action is given and calls: the call's context, its parameters read and
checked, and raftq's reads and writes with their refusals turned into SQS errors."""

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web


from .. import commands
from ..errors import ApiError
from ..keys import GROUP, GROUPS, SETTINGS
from ..principals import PRINCIPAL, may_touch
from . import attributes as attrs
from .errors import SqsError, invalid, missing
from .sigv4 import Signer


NO_QUEUE = "The specified queue does not exist."


@dataclass(frozen=True)
class Context:
    request: web.Request
    signer: Signer

    @property
    def app(self) -> web.Application:
        return self.request.app

    @property
    def account(self) -> str:
        return self.app[SETTINGS].sqs.account

    def queue_url(self, name: str) -> str:
        return f"{self.request.scheme}://{self.request.host}/{self.account}/{name}"

    def arn(self, name: str) -> str:
        return attrs.arn(self.signer.region, self.account, name)

    def may_see(self, name: str) -> bool:
        """Whether the call's principal has an action on queue `name`: what its lists show."""
        return may_touch(self.request.get(PRINCIPAL), name)


# ---- calls into raftq, their refusals as SQS errors ---------------------------------------------

NATIVE = {"not_found": ("QueueDoesNotExist", NO_QUEUE), "queue_full": ("OverLimit", None),
          "limit_reached": ("OverLimit", None), "too_many_waiters": ("OverLimit", None),
          "bad_request": ("InvalidParameterValue", None), "too_large": ("InvalidParameterValue", None),
          "conflict": ("QueueNameExists", None), "no_quorum": ("ServiceUnavailable", None),
          "damaged": ("ServiceUnavailable", None), "timeout": ("ServiceUnavailable", None),
          # a full disk or the cluster's byte cap (507): AWS's throttling error, which SDKs back off on and
          # retry a few times, then raise with its message (which names the node and its free bytes)
          "insufficient_storage": ("RequestThrottled", None),
          # a principal's quota (docs/security.md, "Principals"), and a queue its rules do not name
          # that only the state knew (a stage commit's): as the SQS door's own refusals
          "quota_exceeded": ("RequestThrottled", None), "forbidden": ("AccessDenied", None)}


def from_native(exc: ApiError) -> SqsError:
    code, message = NATIVE.get(exc.code, ("InternalError", None))
    return SqsError(code, message or exc.message)


async def write(ctx: Context, command: dict):
    try:
        return (await commands.write(ctx.request, command)).result
    except ApiError as exc:
        raise from_native(exc) from None


async def read(ctx: Context, query: str, *args):
    try:
        result = await commands.leader_read(ctx.app, ctx.request[GROUP], query, *args)
    except ApiError as exc:
        raise from_native(exc) from None
    if isinstance(result, dict) and "error" in result:
        raise from_native(ApiError(result["error"], result.get("message", "")))
    return result


async def local_info(ctx: Context, name: str) -> dict:
    """A queue's config and stats as this (leading) node has applied them: no
    round to the majority, for what a send or receive needs of its settings.
    A queue it does not find is looked for again by a confirmed read: a leader
    just elected may not have applied the entry that created it yet."""
    result, _ = await ctx.app[GROUPS].engines[ctx.request[GROUP]].read("queue_info", name)
    if "error" in result:
        return await read(ctx, "queue_info", name)
    return result


# ---- parameters -----------------------------------------------------------------------------------

def required(params: dict, name: str):
    value = params.get(name)
    if value is None or value == "":
        raise missing(name)
    return value


def text(params: dict, name: str, default=None):
    value = params.get(name, default)
    if value is not None and not isinstance(value, str):
        raise invalid(name, value, "it must be a string")
    return value


def string_list(params: dict, name: str) -> list:
    value = params.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(name, value, "it must be a list of strings")
    return value


def string_map(params: dict, name: str) -> dict:
    value = params.get(name) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise invalid(name, value, "it must map strings to strings")
    return value


def queue_of(ctx: Context, params: dict) -> str:
    """The queue a QueueUrl names: its path's name (any node's address: only the path counts),
    or the name itself, which AWS takes there too."""
    url = text(params, "QueueUrl")
    if not url:
        raise missing("QueueUrl")
    if "/" not in url:
        name = url
    else:
        parts = urlsplit(url).path.strip("/").split("/")
        if len(parts) != 2 or not parts[0].isascii() or not parts[0].isdigit() or not parts[1]:
            raise SqsError("InvalidAddress", f"The address {url} is not valid for this endpoint.")
        if parts[0] != ctx.account:
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        name = parts[1]
    if not attrs.QUEUE_NAME.fullmatch(name.removesuffix(".fifo")):
        raise SqsError("QueueDoesNotExist", NO_QUEUE)
    return name


def now_s() -> str:
    return str(int(time.time()))
