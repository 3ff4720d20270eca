"""The kubelet port's flags: parsed once, one line naming the flag when wrong."""

import argparse

import pytest

from anex_agent.errors import ConfigError
from anex_agent.virtualnode.kubelet import settings


def parse(*argv):
    parser = argparse.ArgumentParser()
    settings.configure(parser)
    return settings.from_args(parser.parse_args(list(argv)))


def test_defaults_ask_the_csr_api_and_listen_everywhere():
    got = parse()
    assert got == settings.KubeletSettings()
    assert got.address == "0.0.0.0" and got.tls_cert is None


def test_files_and_address(tmp_path):
    cert, key, ca = (tmp_path / n for n in ("c.pem", "k.pem", "ca.pem"))
    for f in (cert, key, ca):
        f.write_text("x")
    got = parse("--kubelet-tls-cert", str(cert), "--kubelet-tls-key", str(key), "--kubelet-client-ca-file", str(ca),
                "--kubelet-address", "192.0.2.10")
    assert (got.tls_cert, got.tls_key, got.client_ca, got.address) == (cert, key, ca, "192.0.2.10")


@pytest.mark.parametrize("argv, flag", [
    (("--kubelet-tls-cert", "/etc/hostname"), "--kubelet-tls-key"),
    (("--kubelet-tls-key", "/etc/hostname"), "--kubelet-tls-cert"),
    (("--kubelet-client-ca-file", "/nonexistent/ca.pem"), "--kubelet-client-ca-file"),
    (("--kubelet-address", "example.com"), "--kubelet-address"),
    (("--kubelet-cert-dir", "/nonexistent"), "--kubelet-cert-dir"),
])
def test_a_bad_flag_is_named(argv, flag):
    with pytest.raises(ConfigError) as caught:
        parse(*argv)
    assert caught.value.source == flag and "\n" not in str(caught.value)
