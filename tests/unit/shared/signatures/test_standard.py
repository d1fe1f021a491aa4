"""standard-webhooks-v1a (docs/reference.md §4): ed25519 as the Standard Webhooks spec frames it,
checked against signatures made with `cryptography` directly, and RFC 8032's keys."""

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from tests.support.signing import OLD_V1A_PRIVATE, OLD_V1A_PUBLIC, PROVIDERS, V1A_PRIVATE, V1A_PUBLIC
from webhook_ingest.shared import signatures
from webhook_ingest.shared.signatures import InvalidSignature, MissingSignature, StaleTimestamp, standard

NOW = 1_760_000_000


def verify(headers, body, keys=(V1A_PUBLIC,), now=NOW):
    signatures.build_verifier("standard-webhooks-v1a", list(keys)).verify(CIMultiDict(headers), body, now=now)


def provider_signed(
    body: bytes,
    private_key: str = V1A_PRIVATE,
    msg_id="msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
    timestamp=NOW,
    prefix="webhook-",
) -> dict[str, str]:
    """As the spec says a sender signs: ed25519 over `id.timestamp.body`, `v1a,` + base64 (no code of ours)."""
    seed = base64.b64decode(private_key.removeprefix("whsk_"))
    signature = Ed25519PrivateKey.from_private_bytes(seed).sign(f"{msg_id}.{timestamp}.".encode() + body)
    return {
        f"{prefix}id": msg_id,
        f"{prefix}timestamp": str(timestamp),
        f"{prefix}signature": "v1a," + base64.b64encode(signature).decode(),
    }


@pytest.mark.parametrize("prefix", ["webhook-", "svix-"])
@given(body=st.binary(max_size=1024))
def test_we_accept_what_a_sender_signs_and_sign_the_same(prefix, body):
    headers = provider_signed(body, prefix=prefix)
    verify(headers, body)
    if prefix == "webhook-":  # ed25519 is deterministic: our signer writes the very same header
        assert (
            signatures.sign("standard-webhooks-v1a", body, V1A_PRIVATE, msg_id=headers["webhook-id"], timestamp=NOW)
            == headers
        )


def test_rfc_8032_keys_decode_as_the_rfc_says():
    # RFC 8032, 7.1, TEST 1: the secret key and the public key it gives.
    secret = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    public = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    whsk, whpk = "whsk_" + base64.b64encode(secret).decode(), "whpk_" + base64.b64encode(public).decode()
    assert standard.public_key_text(whsk) == whpk
    body = b'{"type":"contact.created"}'
    verify(provider_signed(body, whsk), body, keys=[whpk])


def test_a_header_with_both_versions_satisfies_both_schemes():
    body = b'{"id": 1}'
    symmetric = signatures.sign(
        "standard-webhooks", body, PROVIDERS["standard-webhooks"].source_secret, msg_id="msg_1", timestamp=NOW
    )
    asymmetric = provider_signed(body, msg_id="msg_1")
    both = {**symmetric, "webhook-signature": f"{symmetric['webhook-signature']} {asymmetric['webhook-signature']}"}
    verify(both, body)
    signatures.build_verifier("standard-webhooks", [PROVIDERS["standard-webhooks"].source_secret]).verify(
        CIMultiDict(both), body, now=NOW
    )
    with pytest.raises(InvalidSignature, match="no v1a signature"):
        verify(symmetric, body)


def test_rotation_wrong_key_stale_and_missing():
    body = b'{"id": 1}'
    for private_key in (OLD_V1A_PRIVATE, V1A_PRIVATE):
        verify(provider_signed(body, private_key), body, keys=[OLD_V1A_PUBLIC, V1A_PUBLIC])
    with pytest.raises(InvalidSignature):
        verify(provider_signed(body, OLD_V1A_PRIVATE), body)
    with pytest.raises(StaleTimestamp):
        verify(provider_signed(body, timestamp=NOW - 301), body)
    with pytest.raises(InvalidSignature):  # a wrong key with an old timestamp is invalid, not stale
        verify(provider_signed(body, OLD_V1A_PRIVATE, timestamp=NOW - 3600), body)
    with pytest.raises(MissingSignature):
        verify({"webhook-id": "msg_1", "webhook-timestamp": str(NOW)}, body)


def test_many_signatures_buy_no_more_than_a_few_ed25519_checks():
    body = b"{}"
    headers = provider_signed(body)
    padded = " ".join([headers["webhook-signature"]] * (standard.MAX_ASYMMETRIC_SIGNATURES + 1))
    with pytest.raises(InvalidSignature, match="more than"):
        verify({**headers, "webhook-signature": padded}, body)


@given(entries=st.lists(st.tuples(st.sampled_from(["v1", "v1a", "v2", ""]), st.binary(max_size=70)), max_size=6))
def test_signature_entries_parse_by_version(entries):
    header = " ".join(f"{version},{base64.b64encode(raw).decode()}" for version, raw in entries)
    for version in ("v1", "v1a"):
        wanted = [raw for name, raw in entries if name == version]
        if wanted:
            assert standard.signatures_of(version, header) == wanted
        else:
            with pytest.raises(InvalidSignature):
                standard.signatures_of(version, header)
