"""HTTPS between clients and nodes, and between nodes, with a private CA."""

import datetime
import ipaddress
import ssl
from collections import Counter

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from raftq.client import Client
from tests.conftest import start_cluster
from tests.test_growth import join, replicas_agree
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raftq-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_https_end_to_end(fresh_cluster, tmp_path):
    cert, key = self_signed(tmp_path)
    cluster = fresh_cluster(3, node_args=("--tls-cert", cert, "--tls-key", key, "--tls-ca", cert), cafile=cert)
    assert all(url.startswith("https://") for url in cluster.urls)
    with Client(cluster.urls[::-1], cafile=cert, token=cluster.token) as client:   # a follower first: redirects stay https
        client.put("secure", {"over": "tls"})
        got = client.receive("secure", max=1)["messages"]
        assert got[0]["body"] == {"over": "tls"}
        assert client.ack("secure", [got[0]["receipt"]])["acked"] == 1
        assert all(n["healthy"] for n in client.cluster()["nodes"])   # node-to-node over https
        assert client.verify()["agree"] is True
    # a client that does not trust the private CA refuses the node's certificate
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        with Client(cluster.urls[0], retry_for=0, token=cluster.token) as untrusting:
            untrusting.queues()


def test_replicas_move_over_https_when_a_cluster_of_four_groups_grows(tmp_path):
    """With TLS on, the replica mover's calls between nodes (add a member, wait until it has
    caught up, remove the source) go over HTTPS checked against the cluster's CA, and every
    message is still there on the grown cluster, its replicas agreeing."""
    cert, key = self_signed(tmp_path)
    tls = ("--tls-cert", cert, "--tls-key", key, "--tls-ca", cert)
    cluster = start_cluster(tmp_path / "c", 3, groups=4, replicas=3, node_args=tls, cafile=cert)
    try:
        with cluster.client() as client:
            names = [f"q{n}" for n in range(8)]
            for name in names:
                client.put(name, {"queue": name})
            join(cluster, client, "n4")

            def spread() -> bool:
                routing = client.routing()
                held = Counter(member for group in routing["groups"][1:] for member in group["members"])
                return routing["move"] is None and "n4" in held and max(held.values()) - min(held.values()) <= 1
            wait_until(spread, 240, "the replicas to spread over four nodes")
            for name in names:
                assert [m["body"] for m in client.browse(name)["messages"]] == [{"queue": name}]
            replicas_agree(client, 4)
    finally:
        cluster.close()
