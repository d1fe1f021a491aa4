"""What a verifier raises: one `SignatureError` per 401 code, and `SchemeConfigError` at start-up.

Every failure of a request is a `SignatureError` whose `.code` is the
ingress's 401 error string: an absent header is `MissingSignature`; anything
present but wrong or garbled is `InvalidSignature`, never another exception;
a signature that matches over a timestamp outside the tolerance is
`StaleTimestamp`. The signature is checked before the time, so a forged
request with an old timestamp is reported as invalid, not stale.
"""


class SignatureError(Exception):
    """The webhook signature could not be verified."""

    code = "invalid_signature"

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class MissingSignature(SignatureError):
    """The signature header is absent."""

    code = "missing_signature"


class InvalidSignature(SignatureError):
    """The signature is wrong or garbled."""

    code = "invalid_signature"


class StaleTimestamp(SignatureError):
    """The signature is valid but its timestamp is outside the tolerance."""

    code = "stale_timestamp"


class SchemeConfigError(ValueError):
    """A source's secrets or options do not suit its scheme; `field` names the sources-file field."""

    def __init__(self, message: str, field: str = "secrets"):
        super().__init__(message)
        self.field = field
