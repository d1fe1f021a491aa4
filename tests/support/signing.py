"""One test secret per signature scheme, shaped like the provider's own."""

import base64
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PROVIDER_SECRETS = {
    "stripe": "whsec_test_stripe_secret",
    "github": "github-secret",
    "shopify": "shopify-secret",
    "paystack": "sk_test_paystack",
    "standard-webhooks": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "hmac-sha256": "hmac-secret",
}


# --- every scheme, as a provider would use it (tests/unit/shared/signatures/) ---


def ed25519_pair(seed_byte: int) -> tuple[str, str]:
    """(`whsk_…` private key, `whpk_…` public key) from a fixed seed."""
    seed = bytes([seed_byte]) * 32
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return "whsk_" + base64.b64encode(seed).decode(), "whpk_" + base64.b64encode(public).decode()


V1A_PRIVATE, V1A_PUBLIC = ed25519_pair(7)
OLD_V1A_PRIVATE, OLD_V1A_PUBLIC = ed25519_pair(8)
TWILIO_URL = "https://hooks.example.com/webhooks/twilio"
SQUARE_URL = "https://hooks.example.com/webhooks/square?tenant=7"


@dataclass(frozen=True)
class Provider:
    source_secret: str  # what the sources file lists
    old_source_secret: str  # the secret being rotated out
    signing_secret: str = ""  # what the provider signs with, when it is not the listed one (v1a's private key)
    old_signing_secret: str = ""
    options: dict = field(default_factory=dict)  # the source's public_url / signature_header

    @property
    def signer(self) -> str:
        return self.signing_secret or self.source_secret

    @property
    def old_signer(self) -> str:
        return self.old_signing_secret or self.old_source_secret


PROVIDERS = {
    **{scheme: Provider(secret, "whsec_" + "A" * 32) for scheme, secret in PROVIDER_SECRETS.items()},
    "standard-webhooks-v1a": Provider(V1A_PUBLIC, OLD_V1A_PUBLIC, V1A_PRIVATE, OLD_V1A_PRIVATE),
    "slack": Provider("8f742231b10e8888abcd99yyyzzz85a5", "old-slack-signing-secret"),
    "gitlab": Provider("gitlab-token", "old-gitlab-token"),
    "twilio": Provider("twilio-auth-token", "old-twilio-auth-token", options={"public_url": TWILIO_URL}),
    "square": Provider("square-signature-key", "old-square-signature-key", options={"public_url": SQUARE_URL}),
    "basic-auth": Provider("hooks:s3cret", "hooks:old-s3cret"),
    "api-key": Provider("api-key-2", "api-key-1", options={"signature_header": "X-API-Key"}),
}
