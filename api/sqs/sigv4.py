"""AWS Signature Version 4: is this request signed by an SQS key of the cluster (sqs/credentials.py)?

The node recomputes the signature the way every AWS SDK computes it (the
canonical request, the string to sign, the key derived from the secret and the
credential scope) and compares it in constant time.  A request dated more
than 15 minutes before this node's clock, or more than 5 minutes after it, is
refused: a captured request cannot be replayed later than that.  Only the
Authorization header form is taken (not presigned URLs: no SDK sends SQS calls
that way).

Authentication comes before the body is read (``check``, then ``Pending.verify``): a
signature covers the SHA-256 of the body, so a request that does not sign its
payload's hash in ``X-Amz-Content-SHA256`` (boto3 and the AWS CLI do not, for SQS) can be
verified only once its body is here. Everything else is checked from the headers
first, the key, the scope, the signed headers, the host and the date, so a caller
without a key of the cluster (or without a fresh date) makes the node read nothing of
its body; one that signs its payload's hash has its signature checked before any
body byte is read, and the body must then have that hash.
"""

import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote, unquote

from raftq.engine.config import SqsKey

from .errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
# the services a credential scope may name: SQS's, and STS's for GetCallerIdentity (sts.py)
SERVICES = (SERVICE, "sts")
MAX_AGE_S = 15 * 60
MAX_AHEAD_S = 5 * 60
AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([a-z0-9-]{1,32})/([a-z0-9-]{1,32})/aws4_request\s*,"
    r"\s*SignedHeaders=([a-z0-9;._-]+)\s*,\s*Signature=([0-9a-f]{64})", re.ASCII)


@dataclass(frozen=True)
class Signer:
    """Who signed a request: the key, and the region and service its credential scope names."""
    key: SqsKey
    region: str
    service: str = SERVICE


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def canonical_query(raw_query: str) -> str:
    pairs = []
    for part in raw_query.split("&") if raw_query else ():
        name, _, value = part.partition("=")
        pairs.append((_encode(unquote(name.replace("+", " "))), _encode(unquote(value.replace("+", " ")))))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def canonical_path(raw_path: str) -> str:
    """The path as SDKs sign it for SQS: dot segments removed, then each byte percent-encoded once more."""
    segments = []
    for segment in raw_path.split("/")[1:]:
        if segment == "..":
            if segments:
                segments.pop()
        elif segment != ".":
            segments.append(segment)
    path = "/" + "/".join(segments)
    if raw_path.endswith("/") and path != "/":
        path += "/"
    return quote(path, safe="/~")


def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


class Pending:
    """A request whose signature is checked as far as its headers go (``check``): the key, the
    credential scope, the signed headers AWS requires, the host, the date. What is left needs the
    body: ``verify``, once it is read. A request that signs its payload's hash
    (``X-Amz-Content-SHA256``) has its signature checked before that (``signed_before_body``)."""

    def __init__(self, signer: Signer, signature: str, signing_key: bytes, head: str, signed_hash: str | None,
                 stamp: str, scope: str):
        self.signer = signer
        self._signature, self._signing_key, self._head = signature, signing_key, head
        self._signed_hash, self._stamp, self._scope = signed_hash, stamp, scope
        # the whole signature, checked before any body byte is read when it covers the payload's hash
        self.signed_before_body = signed_hash is not None and self._matches(signed_hash)

    def _matches(self, payload_hash: str) -> bool:
        canonical = f"{self._head}\n{payload_hash}"
        to_sign = f"{ALGORITHM}\n{self._stamp}\n{self._scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        expected = hmac.new(self._signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected.encode(), self._signature.encode())

    def verify(self, body: bytes) -> Signer:
        """The signer, or the SqsError that refuses the request, now that its body is here."""
        body_hash = hashlib.sha256(body).hexdigest()
        if self._signed_hash is not None:
            if self._signed_hash != body_hash:
                raise SqsError("SignatureDoesNotMatch", "the body's SHA-256 is not the X-Amz-Content-SHA256 it was "
                                                        "signed with")
        elif not self._matches(body_hash):
            raise mismatch()
        return self.signer


def mismatch() -> SqsError:
    return SqsError("SignatureDoesNotMatch", "the request signature we calculated does not match the signature "
                                             "you provided; check your secret access key and signing method")


# What every SigV4 request signs (AWS's rule), and what the JSON protocol's must too: unsigned,
# the action could be changed on the way (SendMessage made DeleteQueue).
REQUIRED_SIGNED = ("host", "x-amz-date")
JSON_REQUIRED_SIGNED = ("x-amz-target",)


def access_key_of(headers) -> str | None:
    """The access key id an Authorization header names, if it has the shape of one."""
    parsed = AUTHORIZATION.fullmatch((headers.get("Authorization") or "").strip())
    return parsed.group(1) if parsed else None


def check(key: SqsKey | None, method: str, raw_path: str, raw_query: str, headers, now: float, *,
          any_keys: bool, hosts: frozenset, speaks_json: bool) -> Pending:
    """Everything of a request's signature that its headers tell (before any of its body is read),
    or the SqsError that refuses it. `key`: the cluster's key of the access key id the request
    names (``access_key_of``), None when it has none; `any_keys`: whether the cluster has any;
    `headers`: a case-insensitive multidict (aiohttp's); `now`: this node's Unix time; `hosts`:
    the names a call may be signed for (``host_allowed``)."""
    if not any_keys:
        raise SqsError("AccessDenied", "this raftq cluster has no SQS keys: make one with `raftq sqs key add "
                                       "--role admin` (docs/sqs.md); until then every SQS call is refused")
    authorization = headers.get("Authorization")
    if not authorization:
        raise SqsError("MissingAuthenticationToken", "the request must be signed with AWS Signature Version 4 "
                                                     "(an Authorization header)")
    parsed = AUTHORIZATION.fullmatch(authorization.strip())
    if parsed is None:
        raise SqsError("IncompleteSignature", f"the Authorization header is not an {ALGORITHM} signature with "
                                              "Credential, SignedHeaders and Signature")
    access_key, day, region, service, signed, signature = parsed.groups()
    if key is None or key.access_key != access_key:
        raise SqsError("InvalidClientTokenId", "the security token included in the request is invalid")
    if service not in SERVICES:
        raise SqsError("SignatureDoesNotMatch", f"the credential scope names service {service!r}, not 'sqs' (nor "
                                                "'sts', for GetCallerIdentity)")
    signed_headers = signed.split(";")
    for name in REQUIRED_SIGNED + (JSON_REQUIRED_SIGNED if speaks_json else ()):
        if name not in signed_headers:
            raise SqsError("IncompleteSignature", f"the signed headers must include {name} (they are {signed})")
    stamp = headers.get("X-Amz-Date")
    if stamp is None:
        raise SqsError("IncompleteSignature", "the request needs an X-Amz-Date header")
    try:
        when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise SqsError("IncompleteSignature", f"X-Amz-Date {stamp!r} is not of the form YYYYMMDDTHHMMSSZ") from None
    if stamp[:8] != day:
        raise SqsError("SignatureDoesNotMatch", "the credential scope's date is not the date of X-Amz-Date")
    if now - when > MAX_AGE_S:
        raise SqsError("RequestExpired", f"the request is dated {stamp}, more than 15 minutes before this node's "
                                         "clock; sign it again (and check the clocks)")
    if when - now > MAX_AHEAD_S:
        raise SqsError("SignatureDoesNotMatch", f"Signature not yet current: {stamp} is still later than "
                                                f"{_stamp(now + MAX_AHEAD_S)} ({_stamp(now)} + 5 min.)")
    host = headers.get("Host", "")
    if not host_allowed(host, hosts):
        raise SqsError("SignatureDoesNotMatch", f"the request is signed for host {host[:300]!r}, which is not a name "
                                                "of this cluster's nodes (add it to [sqs] hosts in cluster.toml)")
    lines = []
    for name in signed_headers:
        values = headers.getall(name, None)
        if values is None:
            raise SqsError("SignatureDoesNotMatch", f"the signed header {name!r} is not in the request")
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}")
    head = "\n".join([method, canonical_path(raw_path), canonical_query(raw_query), "\n".join(lines) + "\n", signed])
    signed_hash = headers.get("X-Amz-Content-SHA256") if "x-amz-content-sha256" in signed_headers else None
    pending = Pending(Signer(key, region, service), signature, _signing_key(key.secret_key, day, region, service),
                      head, signed_hash, stamp, f"{day}/{region}/{service}/aws4_request")
    if signed_hash is not None and not pending.signed_before_body:
        raise mismatch()
    return pending


def _stamp(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).strftime("%Y%m%dT%H%M%SZ")


LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})


def host_allowed(host: str, hosts: frozenset) -> bool:
    """Whether `host` (a Host header) is one of `hosts`: host:port names, or names without a port
    that any port of theirs matches. A loopback address stands for each of the others of the same
    port: a client of 127.0.0.1:8001 may call it localhost:8001."""
    host = host.lower()
    if host in hosts:
        return True
    name, colon, port = host.rpartition(":")
    if not colon or host.endswith("]"):
        return False
    if name in hosts:
        return True
    return name in LOOPBACK and any(f"{alias}:{port}" in hosts for alias in LOOPBACK)
