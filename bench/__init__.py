"""raftq's benchmarks: single-system scripts (statemachine_bench.py, put_bench.py,
consensus_bench.py) and `python -m bench compare`, raftq side by side with
RabbitMQ quorum queues and NATS JetStream."""
