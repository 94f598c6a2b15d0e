"""The [sqs] section of cluster.toml: what a node reads, what it refuses."""

import os

import pytest

from raftq.engine.config import ConfigError, Sqs, SqsKey, load, write_private

NODES = '''
[[nodes]]
id = "n1"
raft = "127.0.0.1:7001"
http = "127.0.0.1:8001"
'''
KEY = '''
[[sqs.keys]]
access_key = "AKIAEXAMPLE000000001"
secret_key = "a-secret-of-enough-length"
role = "data"
'''


def config(tmp_path, text: str):
    path = tmp_path / "cluster.toml"
    write_private(path, text + NODES)
    return load(path)


def test_keys_and_the_account_are_read_and_written_back(tmp_path):
    cfg = config(tmp_path, '[sqs]\naccount = "123456789012"\n' + KEY)
    assert cfg.sqs == Sqs("123456789012", (SqsKey("AKIAEXAMPLE000000001", "a-secret-of-enough-length", "data"),))
    assert cfg.sqs.key("AKIAEXAMPLE000000001").role == "data"
    assert cfg.sqs.key("AKIAOTHER") is None
    again = tmp_path / "again.toml"
    write_private(again, cfg.to_toml())
    assert load(again).sqs == cfg.sqs


def test_without_an_sqs_section_there_are_no_keys(tmp_path):
    assert config(tmp_path, "").sqs.keys == ()


@pytest.mark.parametrize("text, complaint", [
    ('[sqs]\naccount = "1234"\n', "12 digits"),
    ('[sqs]\naccount = 123456789012\n', "12 digits"),
    ('[sqs]\nregion = "x"\n', "may only set"),
    (KEY.replace('role = "data"', 'role = "metrics"'), "admin or data"),
    (KEY.replace("a-secret-of-enough-length", "short"), "at least 16"),
    (KEY.replace("AKIAEXAMPLE000000001", "AKIA/bad"), "letters and digits"),
    (KEY.replace('role = "data"\n', ""), "needs access_key, secret_key and role"),
    (KEY + KEY, "once"),
])
def test_a_malformed_sqs_section_is_refused_with_what_is_wrong(tmp_path, text, complaint):
    with pytest.raises(ConfigError, match=complaint):
        config(tmp_path, text)


def test_a_config_with_sqs_keys_must_be_private(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(KEY + NODES)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load(path)
