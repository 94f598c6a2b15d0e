"""SQS's errors as AWS answers them: the code each SDK maps to an exception, its HTTP
status, the JSON protocol's ``__type``, and the query protocol's code (which
``x-amzn-query-error`` also carries, and botocore reports as the error's Code).

The statuses and query codes of the errors the SQS API models are AWS's own
model's (``@awsQueryError`` of its Smithy model: QueueDoesNotExist is
``AWS.SimpleQueueService.NonExistentQueue`` and 400, ReceiptHandleIsInvalid 404,
PurgeQueueInProgress and OverLimit 403, ...); those of errors common to AWS's
query-era APIs are its CommonErrors page's, their JSON types the
``com.amazon.coral.service`` exceptions AWS's JSON protocol names them by.
"""

from dataclasses import dataclass

MODELED = "com.amazonaws.sqs#"
CORAL = "com.amazon.coral.service#"


@dataclass(frozen=True)
class Kind:
    status: int
    query_code: str         # the query protocol's Code, and x-amzn-query-error's
    json_type: str          # the JSON protocol's __type
    sender_fault: bool = True


def _modeled(name: str, status: int = 400, query_code: str | None = None) -> Kind:
    return Kind(status, query_code or name, MODELED + name)


def _common(code: str, status: int, json_type: str | None = None, sender_fault: bool = True) -> Kind:
    return Kind(status, code, json_type or code, sender_fault)


ERRORS = {
    # modeled by the SQS API
    "QueueDoesNotExist": _modeled("QueueDoesNotExist", 400, "AWS.SimpleQueueService.NonExistentQueue"),
    "QueueNameExists": _modeled("QueueNameExists", 400, "QueueAlreadyExists"),
    "QueueDeletedRecently": _modeled("QueueDeletedRecently", 400, "AWS.SimpleQueueService.QueueDeletedRecently"),
    "MessageNotInflight": _modeled("MessageNotInflight", 400, "AWS.SimpleQueueService.MessageNotInflight"),
    "ReceiptHandleIsInvalid": _modeled("ReceiptHandleIsInvalid", 404),
    "PurgeQueueInProgress": _modeled("PurgeQueueInProgress", 403, "AWS.SimpleQueueService.PurgeQueueInProgress"),
    "BatchEntryIdsNotDistinct": _modeled("BatchEntryIdsNotDistinct", 400,
                                         "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
    "BatchRequestTooLong": _modeled("BatchRequestTooLong", 400, "AWS.SimpleQueueService.BatchRequestTooLong"),
    "EmptyBatchRequest": _modeled("EmptyBatchRequest", 400, "AWS.SimpleQueueService.EmptyBatchRequest"),
    "InvalidBatchEntryId": _modeled("InvalidBatchEntryId", 400, "AWS.SimpleQueueService.InvalidBatchEntryId"),
    "TooManyEntriesInBatchRequest": _modeled("TooManyEntriesInBatchRequest", 400,
                                             "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
    "UnsupportedOperation": _modeled("UnsupportedOperation", 400, "AWS.SimpleQueueService.UnsupportedOperation"),
    "InvalidAttributeName": _modeled("InvalidAttributeName"),
    "InvalidAttributeValue": _modeled("InvalidAttributeValue"),
    "InvalidMessageContents": _modeled("InvalidMessageContents"),
    "InvalidIdFormat": _modeled("InvalidIdFormat"),
    "InvalidSecurity": _modeled("InvalidSecurity", 403),
    "OverLimit": _modeled("OverLimit", 403),
    "RequestThrottled": _modeled("RequestThrottled", 403),
    "ResourceNotFoundException": _modeled("ResourceNotFoundException", 404),
    "InvalidAddress": _modeled("InvalidAddress", 404),
    # common to AWS's query-era APIs
    "InvalidAction": _common("InvalidAction", 400, CORAL + "UnknownOperationException"),
    "InvalidParameterValue": _common("InvalidParameterValue", 400, CORAL + "InvalidParameterValueException"),
    "InvalidParameterCombination": _common("InvalidParameterCombination", 400,
                                           CORAL + "InvalidParameterCombinationException"),
    "MissingParameter": _common("MissingParameter", 400, CORAL + "MissingRequiredParameterException"),
    "AccessDenied": _common("AccessDenied", 403, CORAL + "AccessDeniedException"),
    "MalformedQueryString": _common("MalformedQueryString", 400),
    "UnknownOperationException": _common("UnknownOperationException", 404),
    "SerializationException": _common("SerializationException", 400, CORAL + "SerializationException"),
    "MissingAuthenticationToken": _common("MissingAuthenticationToken", 403),
    "IncompleteSignature": _common("IncompleteSignature", 400),
    "InvalidClientTokenId": _common("InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": _common("SignatureDoesNotMatch", 403),
    "RequestExpired": _common("RequestExpired", 400),
    "RequestEntityTooLarge": _common("RequestEntityTooLarge", 413),
    "ServiceUnavailable": _common("ServiceUnavailable", 503, sender_fault=False),
    "InternalError": _common("InternalError", 500, sender_fault=False),
}


class SqsError(Exception):
    def __init__(self, code: str, message: str):
        assert code in ERRORS, code
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def kind(self) -> Kind:
        return ERRORS[self.code]

    @property
    def status(self) -> int:
        return self.kind.status

    @property
    def query_code(self) -> str:
        return self.kind.query_code

    @property
    def sender_fault(self) -> bool:
        return self.kind.sender_fault


def invalid(parameter: str, value, reason: str) -> SqsError:
    """AWS's refusal of one parameter's value: "Value <v> for parameter <p> is invalid. Reason: <r>"."""
    return SqsError("InvalidParameterValue", f"Value {value} for parameter {parameter} is invalid. Reason: {reason}")


def missing(parameter: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {parameter}.")
