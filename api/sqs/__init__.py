"""Amazon SQS's API on a front (docs/sqs.md): ``service`` is the endpoint,
``sigv4`` checks signatures, ``protocol`` and ``query`` speak the two wire
protocols, ``attributes`` maps SQS's attributes onto raftq's, ``actions``
runs each action through raftq's operations, ``errors`` names SQS's errors."""
