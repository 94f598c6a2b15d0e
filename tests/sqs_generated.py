"""SQS calls generated from botocore's service model, valid and invalid, for the differential test.

Each action's input members come from the model (botocore's sqs service-2.json:
members, which are required, each member's shape); each member's values from
what SQS means by it: a queue of the example's own, an attribute name of the
model's enum with a value in or out of AWS's range, a receipt handle the
servers gave, message attributes of each data type. A call makes at most one
member invalid (left out when it is required, else given a value AWS refuses),
so that the order in which AWS checks members never decides the answer.
"""

from __future__ import annotations

import botocore.session
from hypothesis import strategies as st

from tests.sqs_reference import Call, binary

MODEL = botocore.session.get_session().get_service_model("sqs")
ACCOUNT_ID = "123456789012"
# Not generated: moto has no move tasks (test_sqs_differential's scripted calls hold them to AWS's
# recorded answers); a receive's attempt id is accepted and not acted on (docs/sqs.md).
LEFT_OUT_ACTIONS = {"StartMessageMoveTask", "ListMessageMoveTasks", "CancelMessageMoveTask"}
LEFT_OUT_MEMBERS = {"ReceiveRequestAttemptId", "NextToken"}
# how often each action is drawn: sends and receives are most of what clients do
WEIGHTS = {"SendMessage": 4, "ReceiveMessage": 4, "SendMessageBatch": 2, "DeleteMessage": 2,
           "ChangeMessageVisibility": 2, "SetQueueAttributes": 2, "GetQueueAttributes": 2, "CreateQueue": 2}
# the most drawn first: Hypothesis leans to the first of a list
ACTIONS = sorted(set(MODEL.operation_names) - LEFT_OUT_ACTIONS, key=lambda action: (-WEIGHTS.get(action, 1), action))

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30)
# RedriveAllowPolicy aside: moto neither shows nor returns it (the script holds it to raftq's own tests)
WRITABLE = ["DelaySeconds", "MaximumMessageSize", "MessageRetentionPeriod", "ReceiveMessageWaitTimeSeconds",
            "VisibilityTimeout", "Policy", "SqsManagedSseEnabled", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds"]
FIFO_WRITABLE = ["ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"]
GOOD_VALUES = {
    "DelaySeconds": ["0", "3", "900"], "MaximumMessageSize": ["1024", "2048", "1048576"],
    "MessageRetentionPeriod": ["60", "3600", "1209600"], "ReceiveMessageWaitTimeSeconds": ["0"],
    "VisibilityTimeout": ["0", "30", "43200"], "SqsManagedSseEnabled": ["false", "true"],
    "KmsMasterKeyId": ["alias/aws/sqs"], "KmsDataKeyReusePeriodSeconds": ["60", "300"],
    "Policy": ['{"Version":"2012-10-17","Statement":[]}'],
    "RedriveAllowPolicy": ['{"redrivePermission":"allowAll"}', '{"redrivePermission":"denyAll"}'],
    "ContentBasedDeduplication": ["true", "false"], "DeduplicationScope": ["queue", "messageGroup"],
    "FifoThroughputLimit": ["perQueue"],
}
BAD_VALUES = {
    "DelaySeconds": ["901", "-1", "x"], "MaximumMessageSize": ["1023", "1048577"],
    "MessageRetentionPeriod": ["59", "1209601"], "ReceiveMessageWaitTimeSeconds": ["21"],
    "VisibilityTimeout": ["43201", "-5"], "KmsDataKeyReusePeriodSeconds": ["59", "86401"],
}
READABLE = [name for name in MODEL.shape_for("QueueAttributeName").enum if name != "RedriveAllowPolicy"]
SYSTEM_NAMES = [name for name in MODEL.shape_for("MessageSystemAttributeName").enum]


class Example:
    """The queues of one generated example: a standard one and a FIFO one, named for the example."""

    def __init__(self, number: int, content_based: bool):
        self.content_based = content_based    # whether the FIFO queue deduplicates by content
        self.prefix = f"gen{number}-"     # no other example's names begin so
        self.standard = f"{self.prefix}s"
        self.fifo = f"{self.prefix}f.fifo"
        self.queues = [self.standard, self.fifo]


# ---- each member's values, valid and invalid --------------------------------------------------------

def _queue(example: Example, fifo: bool | None = None):
    names = example.queues if fifo is None else [example.fifo if fifo else example.standard]
    return st.sampled_from(names)


def queue_url(example: Example, valid: bool, fifo: bool):
    if valid:
        return _queue(example, fifo).map(lambda name: f"@queue:{name}")
    return st.sampled_from([f"@queue:{example.prefix}none", f"http://127.0.0.1:9/111111111111/{example.standard}",
                            f"{example.prefix}none"])


def queue_name(example: Example, valid: bool, action: str):
    if valid:
        # an existing queue's attributes are compared, not checked (the script has those cases)
        return _queue(example) if action != "CreateQueue" else st.just(f"{example.prefix}new")
    return st.sampled_from(["bad name", "x" * 81, "a.b", f"{example.prefix}none.fifo"] if action == "CreateQueue"
                           else [f"{example.prefix}none", "bad name"])


def queue_attributes(example: Example, valid: bool, fifo: bool, creating: bool):
    names = WRITABLE + (FIFO_WRITABLE if fifo else [])
    good = st.dictionaries(st.sampled_from(names), st.just(None), min_size=1, max_size=3).flatmap(
        lambda chosen: st.fixed_dictionaries({name: st.sampled_from(GOOD_VALUES[name]) for name in chosen}))
    if creating and fifo:
        good = good.map(lambda given: {"FifoQueue": "true", **given})
    if valid:
        return good
    bad_one = st.one_of(
        st.sampled_from(sorted(BAD_VALUES)).flatmap(lambda name: st.sampled_from(BAD_VALUES[name]).map(
            lambda value: {name: value})),
        st.sampled_from(["Bogus", "QueueArn", "ApproximateNumberOfMessages"]).map(lambda name: {name: "1"}),
        st.sampled_from(FIFO_WRITABLE + ["FifoQueue"]).map(lambda name: {name: GOOD_VALUES.get(name, ["false"])[0]})
        if not fifo else st.just({"FifoQueue": "false"}),
        st.just({"RedrivePolicy": f'{{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:{ACCOUNT_ID}:'
                                  f'{example.prefix}none","maxReceiveCount":3}}'}),
        st.just({"KmsMasterKeyId": "alias/aws/sqs", "SqsManagedSseEnabled": "true"}))
    if creating and fifo:
        bad_one = bad_one.map(lambda given: {"FifoQueue": "true", **given})
    return bad_one


def message_attributes(valid: bool):
    name = st.text("abcXYZ09_-", min_size=1, max_size=8).filter(lambda n: not n.startswith("."))
    value = st.one_of(
        st.fixed_dictionaries({"DataType": st.sampled_from(["String", "String.label"]), "StringValue": TEXT}),
        st.fixed_dictionaries({"DataType": st.just("Number"),
                               "StringValue": st.integers(-10 ** 6, 10 ** 6).map(str)}),
        st.fixed_dictionaries({"DataType": st.sampled_from(["Binary", "Binary.png"]),
                               "BinaryValue": st.binary(min_size=1, max_size=12).map(binary)}))
    good = st.dictionaries(name, value, min_size=1, max_size=3)
    if valid:
        return good
    return st.sampled_from([
        {"a b": {"DataType": "String", "StringValue": "v"}},
        {"AWS.reserved": {"DataType": "String", "StringValue": "v"}},
        {"kind": {"DataType": "Strung", "StringValue": "v"}},
        {"empty": {"DataType": "String", "StringValue": ""}},
        {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
    ])


def body(valid: bool):
    return TEXT if valid else st.sampled_from(["", "bell\u0007"])


def fifo_id(valid: bool, name: str):
    return st.sampled_from(["g1", "g2"] if name == "MessageGroupId" else ["d1", "d2", "d3"]) if valid \
        else st.sampled_from(["", "a b", "x" * 129])


def integer(name: str, valid: bool):
    ranges = {"DelaySeconds": (0, 3), "MaxNumberOfMessages": (1, 10), "WaitTimeSeconds": (0, 0),
              "VisibilityTimeout": (0, 60), "MaxResults": (1, 3)}
    bad = {"DelaySeconds": [901, -1], "MaxNumberOfMessages": [0, 11], "WaitTimeSeconds": [21, -1],
           "VisibilityTimeout": [43201, -1], "MaxResults": [0, 1001]}
    low, high = ranges.get(name, (0, 5))
    return st.integers(low, high) if valid else st.sampled_from(bad.get(name, [-1]))


def entries(example: Example, action: str, valid: bool, fifo: bool):
    entry_shape = MODEL.shape_for(f"{action}RequestEntry")

    def entry(index: int):
        fields = {"Id": st.just(f"e{index}")}
        if action == "SendMessageBatch":
            fields["MessageBody"] = TEXT
            if fifo:
                fields["MessageGroupId"] = fifo_id(True, "MessageGroupId")
                fields["MessageDeduplicationId"] = st.just(f"b{index}")
            optional = {"MessageAttributes": message_attributes(True)}
            if not fifo:
                optional["DelaySeconds"] = integer("DelaySeconds", True)
        else:
            # each entry its own receipt (the received ones, by position): one handle twice is another call
            fields["ReceiptHandle"] = st.sampled_from([f"@receipt:{q}#{index}" for q in example.queues] +
                                                      [f"garbage{index}"])
            optional = {}
            if action == "ChangeMessageVisibilityBatch":
                fields["VisibilityTimeout"] = integer("VisibilityTimeout", True)
        assert set(fields) | set(optional) <= set(entry_shape.members)
        return st.fixed_dictionaries(fields, optional=optional)

    good = st.integers(1, 3).flatmap(lambda n: st.tuples(*(entry(i) for i in range(n))).map(list))
    if valid:
        return good
    return st.one_of(
        st.just([]),
        good.map(lambda given: given + [dict(given[0])]),                              # an id twice
        good.map(lambda given: [{**given[0], "Id": "no spaces"}] + given[1:]),          # a bad id
        st.tuples(*(entry(i) for i in range(11))).map(list))                            # 11 entries


# ---- a call of an action, from its input shape ---------------------------------------------------

def _member(example: Example, action: str, name: str, shape, valid: bool, fifo: bool):
    if name == "QueueUrl":
        return queue_url(example, valid, fifo)
    if name == "QueueName":
        return queue_name(example, valid, action)
    if name == "Attributes":
        return queue_attributes(example, valid, fifo, action == "CreateQueue")
    if name == "AttributeNames" and action == "GetQueueAttributes":
        return st.lists(st.sampled_from(READABLE), min_size=1, max_size=3) if valid else st.just(["Bogus"])
    if name in ("AttributeNames", "MessageSystemAttributeNames"):
        return st.lists(st.sampled_from(SYSTEM_NAMES), min_size=1, max_size=3)
    if name == "MessageAttributeNames":
        return st.sampled_from([["All"], [".*"], ["a.*"], ["a", "b"]])
    if name == "MessageAttributes":
        return message_attributes(valid)
    if name == "MessageSystemAttributes":
        trace = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5759e988-bd862e3fe1be46a994272793"}}
        return st.just(trace) if valid else st.just({"Other": {"DataType": "String", "StringValue": "x"}})
    if name == "MessageBody":
        return body(valid)
    if name in ("MessageGroupId", "MessageDeduplicationId"):
        return fifo_id(valid, name)
    if name == "Entries":
        return entries(example, action, valid, fifo)
    if name == "ReceiptHandle":
        return st.just(f"@receipt:{example.fifo if fifo else example.standard}") if valid else st.just("garbage")
    if name == "Tags" or name == "tags":
        good = st.dictionaries(st.sampled_from(["team", "env", "k"]), st.sampled_from(["", "blue", "x" * 5]),
                               min_size=1, max_size=2)
        return good if valid else st.sampled_from([{"k" * 129: "v"}, {"k": "v" * 257}])
    if name == "TagKeys":
        return st.lists(st.sampled_from(["team", "env", "other"]), min_size=1, max_size=2) if valid \
            else st.just(["k" * 129])
    if name == "Label":
        return st.just("label1")
    if name == "AWSAccountIds":
        return st.just([ACCOUNT_ID]) if valid else st.just([])
    if name == "Actions":
        return st.lists(st.sampled_from(["SendMessage", "ReceiveMessage", "*"]), min_size=1, max_size=2) if valid \
            else st.sampled_from([["Bogus"], ["SendMessage"] * 8])
    if name == "QueueNamePrefix":
        return st.just(example.prefix)
    if name == "QueueOwnerAWSAccountId":
        return st.just(ACCOUNT_ID) if valid else st.just("111111111111")
    if shape.type_name == "integer":
        return integer(name, valid)
    raise AssertionError(f"no values for {action}.{name} ({shape.type_name}): add them")


@st.composite
def calls(draw, example: Example) -> Call:
    action = draw(st.sampled_from([a for a in ACTIONS for _ in range(WEIGHTS.get(a, 1))]))
    shape = MODEL.operation_model(action).input_shape
    members = [name for name in (shape.members if shape else {}) if name not in LEFT_OUT_MEMBERS]
    required = set(shape.required_members) if shape else set()
    fifo = draw(st.booleans())
    faulty = draw(st.one_of(st.none(), st.sampled_from(members))) if members else None
    params = {}
    for name in members:
        if name == faulty and name in required and draw(st.booleans()):
            continue     # a required member left out
        # what a FIFO send needs is given unless it is the fault
        needed = action == "SendMessage" and fifo and (name == "MessageGroupId" or (
            name == "MessageDeduplicationId" and not example.content_based))
        if name not in required and name != faulty and not needed and not draw(st.booleans()):
            continue
        if name == "MessageDeduplicationId" and not fifo and name != faulty:
            continue     # a standard queue's fault
        params[name] = draw(_member(example, action, name, shape.members[name], name != faulty, fifo))
        if name == "DelaySeconds" and fifo and name != faulty:
            params[name] = 0     # a FIFO queue takes only its own delay
    if action == "CreateQueue" and fifo and faulty != "QueueName" and "QueueName" in params:
        params["QueueName"] = params["QueueName"].removesuffix(".fifo") + ".fifo"
        params.setdefault("Attributes", {}).setdefault("FifoQueue", "true")
    protocol = draw(st.sampled_from(["json", "json", "query"]))
    return Call(action, params, protocol)
