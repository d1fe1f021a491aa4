"""One test secret per signature scheme, shaped like the provider's own."""

PROVIDER_SECRETS = {
    "stripe": "whsec_test_stripe_secret",
    "github": "github-secret",
    "shopify": "shopify-secret",
    "paystack": "sk_test_paystack",
    "standard-webhooks": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "hmac-sha256": "hmac-secret",
}
