"""Where webhooks may go (server-side request forgery, issue 26): https to public
addresses only unless BATCHGEN_WEBHOOK_ALLOWED_HOSTS allows more; checked at
registration (400) and at every send on the address connected to (DNS rebinding);
redirects never followed; a refused send is a recorded failure, not retried."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.core.management import CommandError, call_command

from batches import services as batch_services
from tests.conftest import error_of
from tests.webhooks.receiver import FakeDns, Receiver
from webhooks import sender, services
from webhooks.apps import check_allowed_hosts
from webhooks.destinations import AllowList, why_not_public
from webhooks.models import DeliveryStatus, WebhookDelivery

pytestmark = pytest.mark.django_db

REFUSED = "webhook_url_not_allowed"


@pytest.fixture
def strict(settings):
    """The default policy: no allow-list."""
    settings.BATCHGEN_WEBHOOK_ALLOWED_HOSTS = []


@pytest.fixture
def one_second_sends(settings):
    settings.BATCHGEN_WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS = 0.0


def register(api, url: str):
    return api.post("/v1/webhook_endpoints", {"url": url}, format="json")


def end_a_batch(create_batch) -> WebhookDelivery:
    batch_services.batch_cancel(batch_id=create_batch().id)
    return WebhookDelivery.objects.get()


# --- registration -----------------------------------------------------------------------


@pytest.mark.parametrize("url,reason", [
    ("https://127.0.0.1:5432/", "loopback"),
    ("https://10.0.0.5/", "private"),
    ("https://172.16.3.4/", "private"),
    ("https://192.168.1.1/", "private"),
    ("https://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("https://169.254.10.10/", "link-local"),
    ("https://100.64.0.1/", "carrier-grade NAT"),
    ("https://0.0.0.0/", "unspecified"),
    ("https://224.0.0.1/", "multicast"),
    ("https://240.0.0.1/", "reserved"),
    ("https://[::1]/", "loopback"),
    ("https://[::]/", "unspecified"),
    ("https://[fe80::1]/", "link-local"),
    ("https://[fc00::1]/", "unique-local"),
    ("https://[fd00:ec2::254]/latest/meta-data/", "cloud metadata"),
    ("https://[ff02::1]/", "multicast"),
    ("https://[::ffff:127.0.0.1]/", "loopback address (127.0.0.1) in IPv6 form"),
    ("https://[::ffff:a9fe:a9fe]/", "cloud metadata address (169.254.169.254) in IPv6"),
    ("https://[::10.0.0.1]/", "private address (10.0.0.1) in IPv6 form"),
    ("https://[64:ff9b::a00:1]/", "private address (10.0.0.1) in IPv6 form"),
    ("https://[2002:a00:1::]/", "private address (10.0.0.1) in IPv6 form"),
    ("https://localhost/", "loopback"),
])
def test_a_url_of_a_non_public_address_is_refused_at_registration(api, strict, url, reason):
    error = error_of(register(api, url), 400)
    assert (error["code"], error["param"]) == (REFUSED, "url")
    assert reason in error["message"] and "BATCHGEN_WEBHOOK_ALLOWED_HOSTS" in error["message"]


def test_a_name_is_refused_if_any_of_its_addresses_is_not_public(api, strict, dns):
    dns.names["split.example.com"] = [FakeDns.PUBLIC, "10.0.0.7"]
    error = error_of(register(api, "https://split.example.com/hook"), 400)
    assert error["code"] == REFUSED
    assert "split.example.com resolves to 10.0.0.7, a private address" in error["message"]


def test_plain_http_is_refused_even_to_a_public_address(api, strict, dns):
    error = error_of(register(api, f"http://{FakeDns.PUBLIC}/hook"), 400)
    assert error["code"] == REFUSED and "use https" in error["message"]
    assert dns.lookups == []  # said without a lookup


def test_a_name_that_does_not_resolve_is_refused(api, strict, dns):
    dns.names["gone.example.com"] = lambda: (_ for _ in ()).throw(
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    error = error_of(register(api, "https://gone.example.com/hook"), 400)
    assert error["code"] == REFUSED and "does not resolve" in error["message"]


def test_a_lookup_that_never_answers_is_refused_in_bounded_time(api, strict, dns,
                                                                 monkeypatch):
    # Given: a name whose DNS server never answers (the lookup blocks until released)
    import threading
    import time

    from webhooks import destinations

    monkeypatch.setattr(destinations, "LOOKUP_SECONDS", 0.5)
    release = threading.Event()
    dns.names["silent.example.com"] = lambda: release.wait(30) and [FakeDns.PUBLIC]
    try:
        # When: it is registered
        began = time.monotonic()
        response = register(api, "https://silent.example.com/hook")

        # Then: refused once the lookup's time is up, not when the resolver gives up
        assert time.monotonic() - began < 5
        error = error_of(response, 400)
        assert error["code"] == REFUSED
        assert "silent.example.com did not resolve within 0.5 s" in error["message"]
    finally:
        release.set()


@pytest.mark.parametrize("url", ["https://2130706433/", "https://0x7f.1/"])
def test_numeric_spellings_of_loopback_are_refused(strict, url):
    # Not URLs the API's validator accepts; the services (manage.py, admin) get them.
    from core.errors import BatchGenError

    with pytest.raises(BatchGenError) as refused:
        services.endpoint_create(url=url)
    assert refused.value.code == REFUSED and "127.0.0.1, a loopback address" in str(refused.value)


def test_https_to_a_public_address_is_registered(api, strict):
    created = register(api, "https://hooks.example.com/batchgen")
    assert created.status_code == 200, created.content
    assert created.json()["url"] == "https://hooks.example.com/batchgen"


def test_the_allow_list_lets_exactly_what_it_names_through(api, settings, dns):
    settings.BATCHGEN_WEBHOOK_ALLOWED_HOSTS = ["hooks.internal", "10.1.0.0/16"]
    dns.names.update({"hooks.internal": ["10.9.9.9"], "sub.hooks.internal": ["10.9.9.9"],
                      "in.internal": ["10.1.0.5"], "half.internal": ["10.1.0.5", "10.2.0.1"]})
    for url in ("http://hooks.internal/h", "https://hooks.internal/h", "http://10.1.2.3/h",
                "https://10.1.255.254:8443/h", "http://in.internal/h",
                "http://[::ffff:10.1.2.3]/h", "https://hooks.example.com/h"):
        assert register(api, url).status_code == 200, url
    for url in ("http://10.2.0.1/h", "https://10.2.0.1/h", "http://sub.hooks.internal/h",
                "https://sub.hooks.internal/h", "http://half.internal/h",
                "https://127.0.0.1/h", "http://hooks.example.com/h"):
        assert error_of(register(api, url), 400)["code"] == REFUSED, url


def test_a_wildcard_entry_allows_subdomains_only():
    allowed = AllowList.parse(["*.corp.example"])
    assert allowed.names_host("a.corp.example") and allowed.names_host("B.a.corp.example.")
    assert not allowed.names_host("corp.example") and not allowed.names_host("xcorp.example")


def test_a_public_address_is_public():
    for address in ("93.184.215.14", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"):
        assert why_not_public(ipaddress.ip_address(address)) is None, address


def test_changing_the_url_is_checked_too(api, strict):
    endpoint = register(api, "https://hooks.example.com/a").json()
    error = error_of(api.post(f"/v1/webhook_endpoints/{endpoint['id']}",
                              {"url": "https://169.254.169.254/"}, format="json"), 400)
    assert error["code"] == REFUSED
    renamed = api.post(f"/v1/webhook_endpoints/{endpoint['id']}", {"name": "n"}, format="json")
    assert renamed.status_code == 200


def test_the_admin_and_the_command_refuse_too(admin_client, strict):
    page = admin_client.post("/admin/webhooks/webhookendpoint/add/", {
        "name": "x", "url": "https://10.0.0.1/h", "event_types": ["batch.failed"],
        "enabled": "on"})
    assert page.status_code == 200 and "a private address" in page.content.decode()
    with pytest.raises(CommandError, match="a loopback address"):
        call_command("webhooks", "add", "https://127.0.0.1/h")


def test_a_bad_allow_list_entry_fails_the_checks_naming_the_setting(settings):
    settings.BATCHGEN_WEBHOOK_ALLOWED_HOSTS = ["10.0.0.0/33"]
    [error] = check_allowed_hosts(None)
    assert "BATCHGEN_WEBHOOK_ALLOWED_HOSTS" in error.msg and "10.0.0.0/33" in error.msg
    settings.BATCHGEN_WEBHOOK_ALLOWED_HOSTS = ["localhost", "127.0.0.1", "::1", "*.corp"]
    assert check_allowed_hosts(None) == []


# --- sending ----------------------------------------------------------------------------


def test_dns_rebinding_is_refused_at_the_send_and_nothing_connects(
        create_batch, published, strict, dns, one_second_sends):
    # Given: a name that is public when registered and loopback afterwards, and a
    # listening socket there that would see any connection
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    answers = iter([[FakeDns.PUBLIC]])
    dns.names["rebind.example.com"] = lambda: next(answers, ["127.0.0.1"])
    endpoint = services.endpoint_create(url=f"https://rebind.example.com:{port}/hook")

    # When: a batch ends and its event is sent
    delivery = end_a_batch(create_batch)
    assert services.deliveries_send() == {DeliveryStatus.FAILED: 1}

    # Then: a failed delivery that says why, no connection made, and no retry
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1
    assert delivery.last_status_code is None
    assert "rebind.example.com resolves to 127.0.0.1, a loopback address" in \
        delivery.last_error and "not retried" in delivery.last_error
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    assert services.deliveries_send() == {}
    assert endpoint.url.startswith("https://rebind.example.com")


def test_a_send_connects_to_the_address_it_checked_keeping_the_host_header(
        create_batch, published, dns, receiver, settings):
    # Given: the receiver's name allowed by its address (127.0.0.1, the tests' list)
    dns.names["pinned.example.com"] = ["127.0.0.1"]
    services.endpoint_create(url=receiver.url_for("pinned.example.com"))
    dns.lookups.clear()

    end_a_batch(create_batch)
    assert services.deliveries_send() == {DeliveryStatus.DELIVERED: 1}

    # Then: one lookup of the name, and the request still names the host
    assert dns.lookups == ["pinned.example.com"]
    [received] = receiver.received
    assert received.headers["host"] == f"pinned.example.com:{receiver.port}"


def test_a_destination_refused_at_the_send_is_one_failed_attempt(
        create_batch, published, receiver, settings, api, one_second_sends):
    # Given: an endpoint registered while the operator allowed loopback, then the
    # allow-list removed
    endpoint = services.endpoint_create(url=receiver.url)
    delivery = end_a_batch(create_batch)
    settings.BATCHGEN_WEBHOOK_ALLOWED_HOSTS = []

    assert services.deliveries_send() == {DeliveryStatus.FAILED: 1}
    delivery.refresh_from_db()
    assert "plain http is allowed only to the hosts and networks" in delivery.last_error
    assert receiver.received == []
    error = error_of(api.post(f"/v1/webhook_endpoints/{endpoint.id}/test",
                              {"event_type": "batch.failed"}, format="json"), 400)
    assert error["code"] == REFUSED and receiver.received == []


def test_a_name_that_fails_to_resolve_at_the_send_is_tried_again_not_failed(
        create_batch, published, dns, receiver, quick_retries):
    # Given: an endpoint whose name resolves at registration, then not for a while
    # (the resolver down: EAI_AGAIN), then again
    answers = iter([["127.0.0.1"], "down", ["127.0.0.1"]])

    def answer():
        now = next(answers)
        if now == "down":
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return now

    dns.names["flaky.example.com"] = answer
    services.endpoint_create(url=receiver.url_for("flaky.example.com"))
    delivery = end_a_batch(create_batch)

    # When: the first send finds no answer, and the next one finds the name again
    assert services.deliveries_send() == {DeliveryStatus.PENDING: 1}
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and "Temporary failure in name resolution" in \
        delivery.last_error and "not retried" not in delivery.last_error
    assert services.deliveries_send() == {DeliveryStatus.DELIVERED: 1}

    # Then: delivered on its second attempt
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DELIVERED and delivery.attempts == 2
    assert len(receiver.received) == 1


def test_a_redirect_is_an_answer_not_followed(create_batch, published, quick_retries):
    # Given: a receiver that answers 302 to another one
    target = Receiver().start()
    redirecting = Receiver(answers=[302], redirect_to=target.url).start()
    try:
        services.endpoint_create(url=redirecting.url)
        delivery = end_a_batch(create_batch)

        counts = services.deliveries_send()

        # Then: a failed attempt (to be retried), and nothing sent to the target
        delivery.refresh_from_db()
        assert counts == {DeliveryStatus.PENDING: 1}
        assert delivery.last_status_code == 302 and "HTTP 302" in delivery.last_error
        assert len(redirecting.received) == 1 and target.received == []
    finally:
        redirecting.stop()
        target.stop()


# --- TLS: the name is verified although the address is connected to --------------------


def _certificate(tmp_path, host: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for `host`: the receiver's context and a client
    context that trusts only it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cafile=str(cert_file))
    return server, client


def test_tls_is_verified_for_the_host_name_not_the_address(
        create_batch, published, dns, tmp_path, monkeypatch, one_second_sends):
    # Given: an https receiver on 127.0.0.1 with a certificate for hooks.example.com,
    # and a second name for the same address that the certificate does not cover
    server_tls, client_tls = _certificate(tmp_path, "hooks.example.com")
    monkeypatch.setattr(sender, "ssl_context", lambda: client_tls)
    dns.names["hooks.example.com"] = dns.names["other.example.com"] = ["127.0.0.1"]
    receiver = Receiver(tls=server_tls).start()
    try:
        services.endpoint_create(url=receiver.url_for("hooks.example.com"))
        services.endpoint_create(url=receiver.url_for("other.example.com"))
        end_a_batch_deliveries = create_batch()
        batch_services.batch_cancel(batch_id=end_a_batch_deliveries.id)

        services.deliveries_send()

        # Then: the name the certificate holds is delivered; the other one fails
        # verification (SNI and the check name the host, not 127.0.0.1)
        by_host = {d.endpoint.url.split("/")[2].split(":")[0]: d
                   for d in WebhookDelivery.objects.select_related("endpoint")}
        assert by_host["hooks.example.com"].status == DeliveryStatus.DELIVERED
        other = by_host["other.example.com"]
        assert other.status == DeliveryStatus.PENDING and "CERTIFICATE_VERIFY_FAILED" in \
            other.last_error
        [received] = receiver.received
        assert received.headers["host"] == f"hooks.example.com:{receiver.port}"
    finally:
        receiver.stop()
