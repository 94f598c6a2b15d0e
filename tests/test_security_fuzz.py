"""The API document the node serves, and property-based fuzzing of every
route from it (schemathesis): no 5xx, only documented status codes, every
error in the {"error", "message"} shape."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raftq.api.routes import ROUTES
from tests.wire import call

pytestmark = pytest.mark.integration

# CI bound: 50 s of examples, each CI run a new random draw (RAFTQ_FUZZ_SECONDS for a longer hunt)
FUZZ_SECONDS = int(os.environ.get("RAFTQ_FUZZ_SECONDS", "50"))
EXAMPLES_PER_ROUTE = 20
# Membership changes and leadership transfer are tested elsewhere
# (test_security_limits, test_api): a random forced one would take away the
# one-node cluster's quorum for the rest of the run. The event stream and the
# WebSocket stream stay open: their tests are test_console and test_stream.
NOT_FUZZED = "^/v1/(cluster/nodes|cluster/leader|events|stream)"
NOT_FUZZED_COUNT = 5


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from tests.conftest import start_cluster
    cluster = start_cluster(tmp_path_factory.mktemp("fuzz"), 1, node_args=("--max-long-polls", "50"))
    yield cluster
    cluster.close()


def test_the_document_is_openapi_3_1_open_to_all_and_names_every_route_once(node):
    reply = call("GET", node.urls[0] + "/v1/openapi.json", headers={"Authorization": ""})
    assert reply.status == 200
    doc = reply.body
    assert doc["openapi"] == "3.1.0"
    served = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert served == {(r.method, r.template) for r in ROUTES}
    for route in ROUTES:
        op = doc["paths"][route.template][route.method.lower()]
        assert op["x-raftq-action"] == ("|".join(route.actions) if route.action else "open")
        assert "500" not in op["responses"]
        for status, response in op["responses"].items():
            # the SQS endpoint answers SQS's errors, in the caller's protocol (docs/sqs.md)
            content, error = (("application/x-amz-json-1.0", "SqsError") if route.action == "sigv4"
                              else ("application/json", "Error"))
            if int(status) >= 400:
                assert response["content"][content]["schema"] == {"$ref": f"#/components/schemas/{error}"}


def test_fuzzing_every_route_finds_no_5xx_and_no_undocumented_answer(node, tmp_path):
    url = node.urls[0]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "run", f"{url}/v1/openapi.json",
         "--url", url,
         "-H", f"Authorization: Bearer {node.token}",
         "--checks", "not_a_server_error,status_code_conformance,response_schema_conformance",
         "--exclude-path-regex", NOT_FUZZED,
         # the coverage phase of schemathesis 4.32 crashes inside hypothesis on Python 3.11
         # ("AST constructor recursion depth mismatch"): fuzzing only
         "--phases", "examples,fuzzing",
         # a first pass of EXAMPLES_PER_ROUTE reaches every route well inside the
         # time budget (at 100, the default, 50 s ran out two routes short);
         # fuzzing then goes round again until the budget is spent
         "--max-examples", str(EXAMPLES_PER_ROUTE),
         "--max-time", str(FUZZ_SECONDS), "--workers", "2", "--request-timeout", "45",
         "--suppress-health-check", "all", "--max-failures", "20"],
        # in tmp_path: schemathesis keeps a cache of what it found in its working directory
        capture_output=True, text=True, timeout=FUZZ_SECONDS + 300, env={**os.environ, "NO_COLOR": "1"},
        cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    selected = re.search(r"Selected: (\d+)/(\d+)", done.stdout)
    tested = re.search(r"Tested: (\d+)", done.stdout)
    cases = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    # every operation but those left out was exercised
    assert selected and tested, done.stdout[-3000:]
    assert int(tested.group(1)) == int(selected.group(1)) == int(selected.group(2)) - NOT_FUZZED_COUNT, done.stdout[-3000:]
    assert cases and int(cases.group(1)) == int(cases.group(2)) > 100, done.stdout[-3000:]
    assert "unhandled error" not in node.log_path("n1").read_text()
