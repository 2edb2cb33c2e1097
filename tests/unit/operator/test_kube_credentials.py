"""The reconciler's client takes every credential form kopf's login yields: PEM or base64
``*-data`` fields (as kubeconfigs carry them), files, tokens, other schemes, basic auth.
Against a real API server: tests/integration/test_k8s_real_clusters.py."""

from __future__ import annotations

import asyncio
import base64
import ssl
import tempfile
from pathlib import Path

import kopf
import pytest
from strategyjob_operator.kube import REQUEST_TIMEOUT, Credentials, KubeApi, _pem

from tests.support.certs import self_signed_ca

CERT, KEY = self_signed_ca()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b64(CERT), id="base64-str"),
        pytest.param(b64(CERT).encode(), id="base64-bytes"),
        pytest.param("\n".join(b64(CERT)[i : i + 76] for i in range(0, 2000, 76)), id="wrapped"),
        pytest.param(CERT, id="pem-str"),
        pytest.param(CERT.encode(), id="pem-bytes"),
    ],
)
def test_data_fields_become_pem(value: str | bytes) -> None:
    assert _pem(value, "certificate-authority-data") == CERT


def test_absent_data_is_none() -> None:
    assert _pem(None, "x") is None and _pem("", "x") is None


@pytest.mark.parametrize("value", ["not base64 at all!", b64("hello, not a certificate")])
def test_bad_data_names_the_field_and_the_fix(value: str) -> None:
    with pytest.raises(ValueError) as info:
        _pem(value, "client-certificate-data")
    message = str(info.value)
    assert "client-certificate-data is neither PEM nor base64-encoded PEM" in message
    assert "base64 -w0" in message and "\n" not in message


def test_kind_style_connection_info_is_decoded() -> None:
    """kopf's kubeconfig login keeps the fields as written: base64."""
    info = kopf.ConnectionInfo(
        server="https://127.0.0.1:6443/",
        ca_data=b64(CERT),
        certificate_data=b64(CERT),
        private_key_data=b64(KEY),
    )
    creds = Credentials.from_kopf(info)
    assert creds.server == "https://127.0.0.1:6443"
    assert (creds.ca_data, creds.certificate_data, creds.private_key_data) == (CERT, CERT, KEY)
    assert creds.headers() == {}
    context = creds.ssl_context()
    assert isinstance(context, ssl.SSLContext) and len(context.get_ca_certs()) == 1


def test_file_forms_pass_through(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text(CERT)
    (tmp_path / "c.crt").write_text(CERT)
    (tmp_path / "c.key").write_text(KEY)
    info = kopf.ConnectionInfo(
        server="https://h",
        ca_path=tmp_path / "ca.crt",
        certificate_path=str(tmp_path / "c.crt"),
        private_key_path=tmp_path / "c.key",
        token="t",
    )
    creds = Credentials.from_kopf(info)
    assert creds.ca_path == str(tmp_path / "ca.crt")
    assert creds.private_key_path == str(tmp_path / "c.key")
    assert isinstance(creds.ssl_context(), ssl.SSLContext)


def test_inline_certificates_leave_no_files_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    creds = Credentials("https://h", ca_data=CERT, certificate_data=CERT, private_key_data=KEY)
    assert isinstance(creds.ssl_context(), ssl.SSLContext)
    assert list(tmp_path.iterdir()) == []


def test_a_key_that_does_not_match_fails_when_loading() -> None:
    _, other_key = self_signed_ca()
    creds = Credentials("https://h", certificate_data=CERT, private_key_data=other_key)
    with pytest.raises(ssl.SSLError):
        creds.ssl_context()


def test_a_certificate_without_a_key_is_refused_in_one_line() -> None:
    info = kopf.ConnectionInfo(server="https://h", certificate_data=b64(CERT))
    with pytest.raises(ValueError, match=r"has a client certificate but no client-key\(-data\)"):
        Credentials.from_kopf(info)


@pytest.mark.parametrize(
    ("kwargs", "header"),
    [
        ({"token": "abc"}, "Bearer abc"),
        ({"token": "abc", "scheme": "Token"}, "Token abc"),
        ({"username": "u", "password": "p"}, "Basic " + base64.b64encode(b"u:p").decode()),
    ],
)
def test_authorization_header_as_kopf_sends_it(kwargs: dict[str, str], header: str) -> None:
    creds = Credentials.from_kopf(kopf.ConnectionInfo(server="https://h", **kwargs))
    assert creds.headers() == {"Authorization": header}


def test_plain_http_needs_no_tls() -> None:
    assert Credentials("http://127.0.0.1:8001").ssl_context() is False


def test_insecure_skips_verification() -> None:
    context = Credentials("https://h", insecure=True).ssl_context()
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_NONE


def test_new_credentials_get_a_new_session_and_the_old_one_closes_later() -> None:
    """After a login again, requests use the new credentials; the old session stays open
    while a request may still use it (REQUEST_TIMEOUT), then closes."""

    async def main() -> None:
        api = KubeApi(Credentials("http://127.0.0.1:1", token="old"))
        first = api._get_session()
        api.use(Credentials("http://127.0.0.1:1", token="new"))
        second = api._get_session()
        assert second is not first and not first.closed
        assert second.headers["Authorization"] == "Bearer new"
        api._retired = [(t - REQUEST_TIMEOUT - 2, s) for t, s in api._retired]
        assert api._get_session() is second
        await asyncio.gather(*api._closing)
        assert first.closed and not second.closed
        await api.close()
        assert second.closed

    asyncio.run(main())
