"""AWS Signature Version 4: is this request signed by a key of [sqs] in cluster.toml?

The node recomputes the signature the way every AWS SDK computes it (the
canonical request, the string to sign, the key derived from the secret and the
credential scope) and compares it in constant time.  A request dated more
than 15 minutes from this node's clock is refused, as AWS refuses it: a
captured request cannot be replayed later than that.  Only the Authorization
header form is taken (not presigned URLs: no SDK sends SQS calls that way).
"""

import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote, unquote

from raftq.engine.config import Sqs, SqsKey

from .errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
MAX_SKEW_S = 15 * 60
AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([a-z0-9-]{1,32})/([a-z0-9-]{1,32})/aws4_request\s*,"
    r"\s*SignedHeaders=([a-z0-9;._-]+)\s*,\s*Signature=([0-9a-f]{64})", re.ASCII)


@dataclass(frozen=True)
class Signer:
    """Who signed a request: the key and the region its credential scope names."""
    key: SqsKey
    region: str


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


def _signing_key(secret: str, day: str, region: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (day, region, SERVICE, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def verify(sqs: Sqs, method: str, raw_path: str, raw_query: str, headers, body: bytes, now: float) -> Signer:
    """The signer of a request, or the SqsError that refuses it. `headers`: a
    case-insensitive multidict (aiohttp's); `now`: this node's Unix time."""
    if not sqs.keys:
        raise SqsError("AccessDenied", "this raftq cluster has no SQS keys: add [[sqs.keys]] to cluster.toml "
                                       "(docs/sqs.md); until then every SQS call is refused")
    authorization = headers.get("Authorization")
    if not authorization:
        raise SqsError("MissingAuthenticationToken", "the request must be signed with AWS Signature Version 4 "
                                                     "(an Authorization header)")
    parsed = AUTHORIZATION.fullmatch(authorization.strip())
    if parsed is None:
        raise SqsError("IncompleteSignature", f"the Authorization header is not an {ALGORITHM} signature with "
                                              "Credential, SignedHeaders and Signature")
    access_key, day, region, service, signed, signature = parsed.groups()
    key = sqs.key(access_key)
    if key is None:
        raise SqsError("InvalidClientTokenId", "the security token included in the request is invalid")
    if service != SERVICE:
        raise SqsError("SignatureDoesNotMatch", f"the credential scope names service {service!r}, not 'sqs'")
    signed_headers = signed.split(";")
    if "host" not in signed_headers:
        raise SqsError("IncompleteSignature", "the signed headers must include host")
    stamp = headers.get("X-Amz-Date")
    if stamp is None:
        raise SqsError("IncompleteSignature", "the request needs an X-Amz-Date header")
    try:
        when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise SqsError("IncompleteSignature", f"X-Amz-Date {stamp!r} is not of the form YYYYMMDDTHHMMSSZ") from None
    if stamp[:8] != day:
        raise SqsError("SignatureDoesNotMatch", "the credential scope's date is not the date of X-Amz-Date")
    if abs(now - when) > MAX_SKEW_S:
        raise SqsError("RequestExpired", f"the request is dated {stamp}, more than 15 minutes from this node's "
                                         "clock; sign it again (and check the clocks)")
    lines = []
    for name in signed_headers:
        values = headers.getall(name, None)
        if values is None:
            raise SqsError("SignatureDoesNotMatch", f"the signed header {name!r} is not in the request")
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}")
    payload_hash = headers.get("X-Amz-Content-SHA256") or hashlib.sha256(body).hexdigest()
    canonical = "\n".join([method, canonical_path(raw_path), canonical_query(raw_query), "\n".join(lines) + "\n",
                           signed, payload_hash])
    scope = f"{day}/{region}/{SERVICE}/aws4_request"
    to_sign = f"{ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    expected = hmac.new(_signing_key(key.secret_key, day, region), to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise SqsError("SignatureDoesNotMatch", "the request signature we calculated does not match the signature "
                                                "you provided; check your secret access key and signing method")
    if headers.get("X-Amz-Content-SHA256") not in (None, hashlib.sha256(body).hexdigest()):
        raise SqsError("SignatureDoesNotMatch", "the body's SHA-256 is not the X-Amz-Content-SHA256 it was signed with")
    return Signer(key, region)
