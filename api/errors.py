"""The error contract: a status, and a body of {"error": code, "message": sentence}."""

STATUS = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "timeout": 408,
    "conflict": 409,
    "invalid_receipt": 400,
    "stale_receipt": 409,
    "wrong_group": 409,
    "cross_group": 409,
    "too_large": 413,
    "queue_full": 429,
    "too_many_waiters": 429,
    "limit_reached": 429,
    "quota_exceeded": 429,
    "not_leader": 307,
    "internal": 500,
    "no_quorum": 503,
    "damaged": 503,
    "release_unknown": 503,
    "buffer_full": 507,
    # a disk below its watermark or out of space, or the cluster's --max-stored-bytes reached: nothing
    # was stored, and retrying at once stores nothing either (api/disk.py)
    "insufficient_storage": 507,
}


class ApiError(Exception):
    def __init__(self, code: str, message: str, *, headers: dict | None = None, **details):
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.details = details

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 500)

    def body(self) -> dict:
        return {"error": self.code, "message": self.message, **self.details}


class LeadLost(ApiError):
    """This node's `engine` stopped leading the request's group before the request's answer was
    known, and serving it again is safe: nothing of it was written, or it was a receive (whose
    leases, if it was written, run out and deliver again, as for a client that lost the answer).
    The error middleware serves the request once more, where the lead is now (the route holds
    it through the election). A second loss is answered as it stands: 503."""

    def __init__(self, message: str, engine):
        super().__init__("no_quorum", message, headers={"Retry-After": "1"})
        self.engine = engine
        # the engine's view pushed after the loss may still be on its way
        view = engine.view()
        self.term = view["term"] if view["role"] == "leader" else None


class Rerouted(ApiError):
    """A request's queue was routed by a view of the catalog older than its group's fence (the
    name left the group: statemachine/release.py), and nothing of it was written. The front has
    read the catalog again; the error middleware serves the request once more, which routes it
    where the queue is now. Raised a second time, or outside a request: 503, retry."""

    def __init__(self, message: str):
        super().__init__("no_quorum", message, headers={"Retry-After": "1"})


def damaged(message: str) -> ApiError:
    """503: this node's copy of what the request reads is damaged on disk and no replica's intact
    copy reached it in time (it hands its lead to a replica that can read it); retry."""
    return ApiError("damaged", message, headers={"Retry-After": "1"})


def no_quorum(message: str) -> ApiError:
    """503: no leader answered for the request's group (or a write's fate is unknown); retry."""
    return ApiError("no_quorum", message, headers={"Retry-After": "1"})


# the refusals of the state machine that may pass once the cluster's state changes, and when to ask again
RETRY_AFTER = {"limit_reached": {"Retry-After": "60"}, "insufficient_storage": {"Retry-After": "5"},
               "quota_exceeded": {"Retry-After": "60"}}


def from_result(result: dict) -> ApiError:
    """A refusal from the state machine, as an API error."""
    details = {k: v for k, v in result.items() if k not in ("error", "message")}
    headers = RETRY_AFTER.get(result["error"])
    return ApiError(result["error"], result.get("message", result["error"]), headers=headers, **details)
