# Every target makes its own virtual environment, so a fresh machine with
# Python 3.11 and pip needs nothing else.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SPARK_STAMP := $(VENV)/.spark-installed

.PHONY: up check test test-fast saturation mutate bench chaos clean spark-deps pipeline

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[server,dev,plot]'
	touch $(STAMP)

# The Spark connector's extra (pyspark: a 456 MB download, plus Java 17 to run).
# Only the Spark tests, bench/spark_bench.py and `make pipeline` need it; without
# it those tests skip (they fail instead under CI=true: .ci/run installs it).
$(SPARK_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[server,dev,plot,spark]'
	touch $(SPARK_STAMP)

spark-deps: $(SPARK_STAMP)

# Click events into raftq, a Structured Streaming job aggregating them per
# minute and page into parquet and the raftq queue `totals`, printed at the end.
pipeline: $(SPARK_STAMP)
	$(BIN)/python examples/spark_pipeline.py

# A local 3-node cluster in the foreground; it puts, receives and acks one
# message through the CLI to show it working, then serves until Ctrl-C.
up: $(STAMP)
	$(BIN)/raftq up --nodes 3 --demo

# The smoke suite: each door once -- HTTP, the CLI, the streaming wire, SQS, the console
# without its browser (its files and the event stream it draws) -- and the state machine's
# model test at a small size. A few minutes: for a newcomer, and before a commit; CI runs it
# before the rest. A node id that no longer exists fails it (pytest: "not found").
SMOKE := 'tests/test_api.py::test_put_receive_ack_json_and_bytes[G1]' \
         'tests/test_api.py::test_console_files_are_served_by_every_node[G1]' \
         'tests/test_api.py::test_events_stream_a_snapshot_every_interval[G1]' \
         'tests/test_cli.py::test_receive_and_browse_print_one_json_line_per_message' \
         'tests/test_stream.py::test_publish_confirms_each_message_with_the_http_semantics[G1]' \
         'tests/test_stream.py::test_consumer_credit_acks_and_nacks[G1]' \
         'tests/test_sqs_api.py::test_create_send_receive_delete_round_trip' \
         'tests/test_statemachine_model.py::TestQueuesAgainstModel'

check: $(STAMP)
	RAFTQ_MODEL_EXAMPLES=20 $(BIN)/python -m pytest -q -rs -p no:cacheprovider $(SMOKE)

# The whole suite: unit, property, integration (real node processes), the
# Spark connector's (hence the spark extra), the bounded chaos campaign and
# the saturation proofs. The 25 slowest tests are listed
# at the end, so CI's time (kept under 30 minutes) can be watched and trimmed
# where it goes.
test: $(SPARK_STAMP)
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider --durations=25

# Without the chaos campaign, for quick iterations (the Spark tests run when
# `make spark-deps` was done once, and skip otherwise).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -m "not chaos and not saturation"

# Only the proofs that no burst a client can cause costs an election (issues
# 9, 11): about three minutes, part of `make test`.
saturation: $(STAMP)
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -m saturation

# Plant known bugs one at a time in a copy of the tree and show which the tests
# catch (tests/mutate.py); the last line is one JSON object.
mutate: $(STAMP)
	$(BIN)/python tests/mutate.py

bench: $(STAMP)
	$(BIN)/python bench/statemachine_bench.py
	$(BIN)/python bench/put_bench.py

# A longer campaign than CI's: results (history, verdicts, timeline plot) in results/.
chaos: $(STAMP)
	$(BIN)/python -m chaos run --nodes 3 --minutes 10

clean:
	rm -rf $(VENV) .raftq
