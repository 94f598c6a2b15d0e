"""JSON schemas of the request bodies, for the OpenAPI document.

They describe what the handlers and statemachine/validation.py accept; the
limits come from the same constants.
"""

from raftq.statemachine.backoff import MAX_FACTOR
from raftq.statemachine.principals import QUOTAS
from raftq.statemachine.ready import PRIORITIES
from raftq.statemachine.rules import ACTIONS, MAX_PATTERNS, MAX_RULES
from raftq.statemachine.validation import (MAX_BATCH, MAX_DURATION_MS, MAX_LOG_TIME_MS, MAX_ORDERING_KEY,
                                           MAX_QUOTA, MAX_RATE_LIMIT, MAX_RECEIVE, MAX_WAIT_MS, QUEUE_DEFAULTS)
from raftq.wire_format import NAME_PATTERN, PATTERN_PATTERN

NAME = {"type": "string", "pattern": f"^{NAME_PATTERN}$"}
DURATION = {"type": "integer", "minimum": 0, "maximum": MAX_DURATION_MS}
OPTIONAL_DURATION = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_DURATION_MS}

MESSAGE = {
    "type": "object",
    "properties": {
        "body": {},
        "body_b64": {"type": "string", "contentEncoding": "base64"},
        "key": {"type": "string", "minLength": 1, "maxLength": 1024},
        "id": {"type": "string", "minLength": 1, "maxLength": 1024},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "ttl_ms": OPTIONAL_DURATION,
        "delay_ms": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_DURATION_MS},
        "ordering_key": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_ORDERING_KEY},
        "priority": {"type": "integer", "minimum": 0, "maximum": PRIORITIES - 1},
    },
    "additionalProperties": False,
}
MESSAGES = {"type": "array", "items": MESSAGE, "minItems": 1, "maxItems": MAX_BATCH}
PUT = {"oneOf": [
    {"type": "object", "properties": {"messages": MESSAGES}, "required": ["messages"],
     "additionalProperties": False},
    {**MESSAGE, "required": ["body"]},
]}

QUEUE_CONFIG = {
    "type": "object",
    "properties": {
        "lease_ms": {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_MS},
        "max_deliveries": OPTIONAL_DURATION,
        "dead_letter": {"oneOf": [NAME, {"type": "null"}]},
        "ttl_ms": OPTIONAL_DURATION,
        "max_length": OPTIONAL_DURATION,
        "max_bytes": OPTIONAL_DURATION,
        "overflow": {"type": "string", "enum": ["reject", "drop_oldest"]},
        "dedup_window_ms": DURATION,
        "backoff": {"oneOf": [{"type": "object", "properties": {
            "initial_ms": {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_MS},
            "factor": {"type": "number", "minimum": 1, "maximum": MAX_FACTOR},
            "max_ms": {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_MS},
            "jitter": {"type": "number", "minimum": 0, "maximum": 1}}, "additionalProperties": False},
            {"type": "null"}]},
        "retention_ms": OPTIONAL_DURATION,
        "retention_bytes": OPTIONAL_DURATION,
        "tags": {"oneOf": [{"type": "object", "maxProperties": 50,
                            "additionalProperties": {"type": "string", "maxLength": 256}}, {"type": "null"}]},
        "sqs_attributes": {"oneOf": [{"type": "object", "maxProperties": 32,
                                      "additionalProperties": {"type": "string", "maxLength": 32_768}},
                                     {"type": "null"}]},
    },
    "additionalProperties": False,
}
assert set(QUEUE_CONFIG["properties"]) == set(QUEUE_DEFAULTS)

RECEIVE = {
    "type": "object",
    "properties": {
        "group": NAME,
        "max": {"type": "integer", "minimum": 1, "maximum": MAX_RECEIVE},
        "wait_ms": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS},
        "lease_ms": OPTIONAL_DURATION,
    },
}
RECEIPT_LIST = {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 300},
                "minItems": 1, "maxItems": MAX_BATCH}
RECEIPTS = {
    "type": "object",
    "properties": {"receipts": RECEIPT_LIST,
                   "delay_ms": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_DURATION_MS},
                   "lease_ms": OPTIONAL_DURATION},
    "required": ["receipts"],
}
POSITION = {"oneOf": [
    {"type": "string", "enum": ["earliest", "latest"]},
    {"type": "object", "properties": {"seq": {"type": "integer", "minimum": 0}}, "required": ["seq"],
     "additionalProperties": False},
    {"type": "object", "properties": {"time_ms": {"type": "integer", "minimum": 0}}, "required": ["time_ms"],
     "additionalProperties": False},
]}
GROUP = {"type": "object", "properties": {"start": POSITION}, "additionalProperties": False}
SEEK = {"type": "object", "properties": {"to": POSITION}, "required": ["to"], "additionalProperties": False}
PATCH_GROUP = {
    "type": "object",
    "properties": {"paused": {"type": "boolean"},
                   "until_ms": {"type": "integer", "minimum": 0, "maximum": MAX_LOG_TIME_MS},
                   "for_ms": {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_MS},
                   "rate_limit": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_RATE_LIMIT}},
    "additionalProperties": False,
}
COMMIT = {"type": "object", "properties": {"seq": {"type": "integer", "minimum": 0}}, "required": ["seq"]}
TX = {
    "type": "object",
    "properties": {
        "ack": {"type": "array", "items": {"type": "object", "properties": {"queue": NAME, "receipts": RECEIPT_LIST},
                                           "required": ["queue", "receipts"]}},
        "put": {"type": "array", "items": {"type": "object", "properties": {"queue": NAME, "messages": MESSAGES},
                                           "required": ["queue", "messages"]}},
    },
    "additionalProperties": False,
}
NEW_NODE = {
    "type": "object",
    "properties": {"id": NAME, "raft_addr": {"type": "string", "minLength": 1},
                   "http_addr": {"type": "string", "minLength": 1}},
    "required": ["id", "raft_addr", "http_addr"],
}
RELEASE_NAMES = {
    "type": "object",
    "properties": {"group": {"type": "integer", "minimum": 0},
                   "names": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 10_000},
                   "fence": {"type": "integer", "minimum": 0}},
    "required": ["group", "names", "fence"],
    "additionalProperties": False,
}
RETIRING = {
    "type": "object",
    "properties": {"names": RELEASE_NAMES["properties"]["names"], "fence": {"type": "integer", "minimum": 0}},
    "required": ["names", "fence"],
    "additionalProperties": False,
}
LEADER = {"type": "object", "properties": {"to": NAME}, "additionalProperties": False}
_LEASE = {"principal": NAME, "lease": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}
CONNECTION_LEASES = {
    "type": "object",
    "properties": {
        "hold": {"type": "object", "properties": {**_LEASE, "limit": {"type": "integer", "minimum": 0}},
                 "required": ["principal", "lease", "limit"], "additionalProperties": False},
        "renew": {"type": "array", "maxItems": 100_000,
                  "items": {"type": "array", "prefixItems": [_LEASE["principal"], _LEASE["lease"]],
                            "items": False, "minItems": 2}},
        "release": {"type": "object", "properties": _LEASE, "required": ["principal", "lease"],
                    "additionalProperties": False},
    },
    "additionalProperties": False,
}
SQS_KEY = {"type": "object", "properties": {"role": {"type": "string", "enum": ["admin", "data"]}},
           "required": ["role"], "additionalProperties": False}
REDRIVE = {"type": "object", "properties": {"from_queue": NAME,
                                            "max": {"type": "integer", "minimum": 1, "maximum": MAX_BATCH},
                                            "id": {"type": "string", "minLength": 1, "maxLength": 1024}},
           "additionalProperties": False}
RULES = {"type": "array", "maxItems": MAX_RULES, "items": {
    "type": "object", "required": ["actions"], "additionalProperties": False, "properties": {
        "actions": {"type": "array", "minItems": 1, "items": {"type": "string", "enum": list(ACTIONS)}},
        "queues": {"type": "array", "minItems": 1, "maxItems": MAX_PATTERNS,
                   "items": {"type": "string", "pattern": f"^{PATTERN_PATTERN}$"}}}}}
QUOTA_MAP = {"type": "object", "additionalProperties": False,
             "properties": {q: {"type": "integer", "minimum": 0, "maximum": MAX_QUOTA} for q in QUOTAS}}
NEW_PRINCIPAL = {"type": "object", "required": ["name", "rules"], "additionalProperties": False, "properties": {
    "name": NAME, "rules": RULES, "quotas": QUOTA_MAP, "sqs": {"type": "boolean"}}}
PRINCIPAL_CHANGE = {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
    "rules": RULES, "quotas": QUOTA_MAP, "new_token": {"type": "boolean", "enum": [True]},
    "new_sqs_key": {"type": "boolean", "enum": [True]}}}
ANY_OBJECT = {"type": "object"}   # checked field by field by its handler
ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
    "required": ["error", "message"],
}

SQS_ERROR = {"type": "object", "properties": {"__type": {"type": "string"}, "message": {"type": "string"}},
             "required": ["__type", "message"]}
