"""SQS's errors: the code each SDK maps to an exception, its HTTP status, and
the older code the query protocol (and ``x-amzn-query-error``) carries."""

# code -> (status, query protocol's code, the caller's fault)
ERRORS = {
    # modeled by the SQS API: the JSON protocol's __type names the shape
    "QueueDoesNotExist": (400, "AWS.SimpleQueueService.NonExistentQueue", True),
    "QueueNameExists": (400, "QueueAlreadyExists", True),
    "QueueDeletedRecently": (400, "AWS.SimpleQueueService.QueueDeletedRecently", True),
    "MessageNotInflight": (400, "AWS.SimpleQueueService.MessageNotInflight", True),
    "ReceiptHandleIsInvalid": (400, "ReceiptHandleIsInvalid", True),
    "PurgeQueueInProgress": (403, "AWS.SimpleQueueService.PurgeQueueInProgress", True),
    "BatchEntryIdsNotDistinct": (400, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", True),
    "BatchRequestTooLong": (400, "AWS.SimpleQueueService.BatchRequestTooLong", True),
    "EmptyBatchRequest": (400, "AWS.SimpleQueueService.EmptyBatchRequest", True),
    "InvalidBatchEntryId": (400, "AWS.SimpleQueueService.InvalidBatchEntryId", True),
    "TooManyEntriesInBatchRequest": (400, "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", True),
    "UnsupportedOperation": (400, "AWS.SimpleQueueService.UnsupportedOperation", True),
    "InvalidAttributeName": (400, "InvalidAttributeName", True),
    "InvalidAttributeValue": (400, "InvalidAttributeValue", True),
    "InvalidMessageContents": (400, "InvalidMessageContents", True),
    "InvalidIdFormat": (400, "InvalidIdFormat", True),
    "OverLimit": (403, "OverLimit", True),
    "RequestThrottled": (403, "RequestThrottled", True),
    "ResourceNotFoundException": (404, "ResourceNotFoundException", True),
    "InvalidAddress": (404, "InvalidAddress", True),
    # common to every AWS query-era API
    "InvalidAction": (400, "InvalidAction", True),
    "InvalidParameterValue": (400, "InvalidParameterValue", True),
    "MissingParameter": (400, "MissingParameter", True),
    "MalformedQueryString": (400, "MalformedQueryString", True),
    "SerializationException": (400, "SerializationException", True),
    "MissingAuthenticationToken": (403, "MissingAuthenticationToken", True),
    "IncompleteSignature": (400, "IncompleteSignature", True),
    "InvalidClientTokenId": (403, "InvalidClientTokenId", True),
    "SignatureDoesNotMatch": (403, "SignatureDoesNotMatch", True),
    "RequestExpired": (400, "RequestExpired", True),
    "AccessDenied": (403, "AccessDenied", True),
    "RequestEntityTooLarge": (413, "RequestEntityTooLarge", True),
    "ServiceUnavailable": (503, "ServiceUnavailable", False),
    "InternalError": (500, "InternalError", False),
}
# The errors the SQS API's model names (the JSON protocol's __type is the model's shape)
MODELED = frozenset({
    "QueueDoesNotExist", "QueueNameExists", "QueueDeletedRecently", "MessageNotInflight",
    "ReceiptHandleIsInvalid", "PurgeQueueInProgress", "BatchEntryIdsNotDistinct", "BatchRequestTooLong",
    "EmptyBatchRequest", "InvalidBatchEntryId", "TooManyEntriesInBatchRequest", "UnsupportedOperation",
    "InvalidAttributeName", "InvalidAttributeValue", "InvalidMessageContents", "InvalidIdFormat", "OverLimit",
    "RequestThrottled", "ResourceNotFoundException", "InvalidAddress"})


class SqsError(Exception):
    def __init__(self, code: str, message: str):
        assert code in ERRORS, code
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return ERRORS[self.code][0]

    @property
    def query_code(self) -> str:
        return ERRORS[self.code][1]

    @property
    def sender_fault(self) -> bool:
        return ERRORS[self.code][2]


def invalid(parameter: str, value, reason: str) -> SqsError:
    return SqsError("InvalidParameterValue", f"Value {value!r} for parameter {parameter} is invalid. Reason: {reason}")


def missing(parameter: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {parameter}.")
