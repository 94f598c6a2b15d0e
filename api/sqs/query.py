"""The query protocol: form-encoded ``Action=...&Param.1.Name=...`` in, XML out.

Parameters are rebuilt into the JSON protocol's shapes (``Attribute.N.Name`` /
``.Value`` into an ``Attributes`` map, ``AttributeName.N`` into a list, batch
entries into ``Entries``), so the actions serve both protocols; results are
rendered with the query protocol's flattened element names.
"""

import re
from xml.sax.saxutils import escape as escape_markup

from .errors import SqsError

NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"
# query's flattened map -> (JSON member, key element, value element)
MAPS = {"Attribute": ("Attributes", "Name", "Value"), "Tag": ("Tags", "Key", "Value"),
        "MessageAttribute": ("MessageAttributes", "Name", "Value"),
        "MessageSystemAttribute": ("MessageSystemAttributes", "Name", "Value")}
LISTS = {"AttributeName": "AttributeNames", "MessageAttributeName": "MessageAttributeNames",
         "MessageSystemAttributeName": "MessageSystemAttributeNames", "TagKey": "TagKeys",
         "AWSAccountId": "AWSAccountIds", "ActionName": "Actions"}
ENTRIES = ("SendMessageBatchRequestEntry", "DeleteMessageBatchRequestEntry",
           "ChangeMessageVisibilityBatchRequestEntry")
MAX_FIELDS = 2_000
MAX_INDEX = 1_000
# SendMessageBatchRequestEntry.10.MessageAttribute.10.Value.StringValue is the longest: 6 parts
MAX_NAME_PARTS = 8
MAX_NAME_CHARS = 256


def parse(fields: list) -> tuple[str, dict]:
    """(action, params) from the decoded (name, value) pairs of query and form."""
    if len(fields) > MAX_FIELDS:
        raise SqsError("MalformedQueryString", f"a request carries at most {MAX_FIELDS} parameters")
    tree: dict = {}
    for name, value in fields:
        node = tree
        if len(name) > MAX_NAME_CHARS:
            raise SqsError("MalformedQueryString", f"a parameter name has at most {MAX_NAME_CHARS} characters")
        parts = name.split(".", MAX_NAME_PARTS)
        if len(parts) > MAX_NAME_PARTS:
            raise SqsError("MalformedQueryString", f"a parameter name has at most {MAX_NAME_PARTS} parts")
        if not all(parts):
            raise SqsError("MalformedQueryString", f"parameter name {name[:100]!r} has an empty part")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SqsError("MalformedQueryString", f"parameter {name!r} conflicts with another")
            node = child
        if parts[-1] in node:
            raise SqsError("MalformedQueryString", f"parameter {name!r} is given twice")
        node[parts[-1]] = value
    action = tree.pop("Action", None)
    if not isinstance(action, str) or not action:
        raise SqsError("UnknownOperationException", "The request names no Action.")
    for noise in ("Version", "X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders",
                  "X-Amz-Signature"):
        tree.pop(noise, None)
    params = _members(tree)
    if action == "CreateQueue" and "Tags" in params:
        params["tags"] = params.pop("Tags")    # the JSON protocol's CreateQueue spells it so
    return action, params


def _numbered(node, name: str) -> list:
    if not isinstance(node, dict) or not all(k.isascii() and k.isdigit() and 0 < int(k) <= MAX_INDEX for k in node):
        raise SqsError("MalformedQueryString", f"{name} must be numbered {name}.1, {name}.2, ...")
    return [node[k] for k in sorted(node, key=int)]


def _members(tree: dict) -> dict:
    params = {}
    for name, node in tree.items():
        if name in MAPS:
            member, key_name, value_name = MAPS[name]
            params[member] = {}
            for item in _numbered(node, name):
                if not isinstance(item, dict) or not isinstance(item.get(key_name), str) or value_name not in item:
                    raise SqsError("MalformedQueryString", f"each {name}.N needs {key_name} and {value_name}")
                params[member][item[key_name]] = item[value_name]
        elif name in LISTS:
            params[LISTS[name]] = _numbered(node, name)
        elif name in ENTRIES:
            params["Entries"] = [_members(item) if isinstance(item, dict) else item for item in _numbered(node, name)]
        else:
            params[name] = node
    return params


# ---- rendering ----------------------------------------------------------------------------------

# What XML 1.0 does not allow in a document at all, not even as a character reference. What a
# client sends the SQS door is refused there (attributes.check_text); what reaches an answer
# otherwise (a body or a header that the native API stored, an echoed parameter name) is
# replaced by U+FFFD here, so that every answer parses. Bodies are base64'd before
# (message_actions.body_text), so their MD5 holds.
NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def escape(text: str, entities: dict | None = None) -> str:
    return escape_markup(NOT_XML.sub("\ufffd", text), entities or {})


def _entry_names(action: str) -> dict:
    return {"Successful": f"{action}ResultEntry", "Failed": "BatchResultErrorEntry",
            "QueueUrls": "QueueUrl", "queueUrls": "QueueUrl", "Messages": "Message",
            "Results": f"{action}ResultEntry"}


def _element(name: str, value, action: str) -> str:
    if isinstance(value, dict):
        if name in ("Attributes", "MessageSystemAttributes"):
            return "".join(f"<Attribute><Name>{escape(k)}</Name><Value>{_text(v)}</Value></Attribute>"
                           for k, v in value.items())
        if name == "MessageAttributes":
            return "".join(f"<MessageAttribute><Name>{escape(k)}</Name><Value>{_fields(_value_fields(v), action)}"
                           "</Value></MessageAttribute>" for k, v in value.items())
        if name == "Tags":
            return "".join(f"<Tag><Key>{escape(k)}</Key><Value>{_text(v)}</Value></Tag>" for k, v in value.items())
        return f"<{name}>{_fields(value, action)}</{name}>"
    if isinstance(value, list):
        item = _entry_names(action).get(name, name)
        return "".join(_element(item, v, action) for v in value)
    return f"<{name}>{_text(value)}</{name}>"


def _value_fields(value: dict) -> dict:
    """A message attribute's value with its members in the order of AWS's model."""
    return {k: value[k] for k in ("StringValue", "BinaryValue", "DataType") if k in value}


def _fields(value: dict, action: str) -> str:
    return "".join(_element(k, v, action) for k, v in value.items() if v is not None)


# AWS writes quotes and carriage returns as character references too
ENTITIES = {'"': "&quot;", "\r": "&#xD;"}


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return escape(str(value), ENTITIES)


# The actions whose reply has no result element
NO_RESULT = frozenset({"DeleteMessage", "DeleteQueue", "SetQueueAttributes", "PurgeQueue", "ChangeMessageVisibility",
                       "TagQueue", "UntagQueue", "AddPermission", "RemovePermission"})


def render(action: str, result: dict, request_id: str) -> bytes:
    inner = "" if action in NO_RESULT else f"<{action}Result>{_fields(result, action)}</{action}Result>"
    return (f'<?xml version="1.0"?><{action}Response xmlns="{NAMESPACE}">{inner}'
            f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>"
            f"</{action}Response>").encode()


# The query protocol's older words for what the JSON protocol words anew
LEGACY_MESSAGES = {"QueueDoesNotExist": "The specified queue does not exist for this wsdl version."}


def render_error(error: SqsError, fault: str, request_id: str) -> bytes:
    if error.code == "UnknownOperationException":
        return b'<?xml version="1.0"?><UnknownOperationException/>'    # AWS's whole answer to a call of no action
    message = LEGACY_MESSAGES.get(error.code, error.message)
    return (f'<?xml version="1.0"?><ErrorResponse xmlns="{NAMESPACE}"><Error><Type>{fault}</Type>'
            f"<Code>{_text(error.query_code)}</Code><Message>{_text(message)}</Message><Detail/></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>").encode()
