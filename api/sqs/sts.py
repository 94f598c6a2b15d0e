"""AWS STS's GetCallerIdentity at the SQS endpoint: who a key is.

The AWS CLI, Terraform and many SDK helpers ask it first (``aws sts
get-caller-identity``), signed for the service ``sts``. raftq answers it for an
SQS key of the cluster (credentials.py): the cluster's account, the key as the user id, and an
IAM user ARN named by the key. It is the only STS action raftq serves.
"""

from xml.sax.saxutils import escape

from raftq.engine.config import SqsKey

from .errors import SqsError

SERVICE = "sts"
NAMESPACE = "https://sts.amazonaws.com/doc/2011-06-15/"


def identity(key: SqsKey, account: str) -> dict:
    """GetCallerIdentity's result for `key`: what an IAM user's key would show."""
    return {"UserId": key.access_key, "Account": account, "Arn": f"arn:aws:iam::{account}:user/{key.access_key}"}


def answer(action: str, key: SqsKey, account: str, request_id: str) -> bytes:
    """The query protocol's answer of STS to `action`, or SqsError (InvalidAction) for another action."""
    if action != "GetCallerIdentity":
        raise SqsError("InvalidAction", f"Could not find operation {action} for version 2011-06-15")
    fields = "".join(f"<{name}>{escape(value)}</{name}>" for name, value in identity(key, account).items())
    return (f'<?xml version="1.0"?><GetCallerIdentityResponse xmlns="{NAMESPACE}"><GetCallerIdentityResult>'
            f"{fields}</GetCallerIdentityResult><ResponseMetadata><RequestId>{request_id}</RequestId>"
            "</ResponseMetadata></GetCallerIdentityResponse>").encode()
