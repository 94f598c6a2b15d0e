"""HTTPS between clients and nodes, and between nodes, with a private CA."""

import datetime
import ipaddress
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from raftq.client import Client

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
    with Client(cluster.urls[::-1], cafile=cert) as client:   # a follower first: redirects stay https
        client.put("secure", {"over": "tls"})
        got = client.receive("secure", max=1)["messages"]
        assert got[0]["body"] == {"over": "tls"}
        assert client.ack("secure", [got[0]["receipt"]])["acked"] == 1
        assert all(n["healthy"] for n in client.cluster()["nodes"])   # node-to-node over https
        assert client.verify()["agree"] is True
    # a client that does not trust the private CA refuses the node's certificate
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        with Client(cluster.urls[0], retry_for=0) as untrusting:
            untrusting.queues()
