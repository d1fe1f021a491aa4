"""`send-test` signs its sample as each scheme's provider would: the source's own verifier accepts it."""

import pytest
from multidict import CIMultiDict

from tests.support.signing import PROVIDERS
from webhook_ingest.cli.send_test import sample_body, signed_request
from webhook_ingest.shared import signatures
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.sources.model import parse_source

SIGNABLE = [scheme for scheme in signatures.SCHEMES if scheme != "standard-webhooks-v1a"]


@pytest.mark.parametrize("scheme", SIGNABLE)
def test_the_sample_verifies_under_the_sources_own_verifier(scheme):
    provider = PROVIDERS[scheme]
    source = parse_source(
        "x", {"scheme": scheme, "secrets": [provider.source_secret], "handler": "inbox", **provider.options}
    )
    body = sample_body(source)
    source.verifier.verify(CIMultiDict(signed_request(source, body)), body)


def test_a_v1a_source_cannot_be_signed_for_and_says_why():
    source = parse_source(
        "hooks",
        {
            "scheme": "standard-webhooks-v1a",
            "handler": "inbox",
            "secrets": [PROVIDERS["standard-webhooks-v1a"].source_secret],
        },
    )
    with pytest.raises(ConfigError, match="public keys only"):
        signed_request(source, sample_body(source))
