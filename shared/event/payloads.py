"""What a handler's `event.payload` is, in one place.

A body whose first byte past blanks is `{` is JSON, whatever the unsigned
Content-Type says (docs/reference.md §6): signed once, it is one payload.
Any other body is a url-encoded form when the Content-Type says
`application/x-www-form-urlencoded` (Twilio, Slack slash commands and
interactivity, GitHub's form option), decoded into a dict of name ->
value: a name sent once maps to its string, a name sent several times to
the list of its values in the order sent; else it is JSON, and refused.
So a Content-Type can refuse a signed body, never make it a second
payload (Twilio's signed query says it for Twilio: signatures/twilio.py).
The ingress stores the event with the Content-Type it read it as
(`content_type_read`), so the workers' readings (by Content-Type, below)
are the ingress's. The raw body travels unchanged; this is only how it is
read.

A form must be UTF-8 once percent-decoded and hold no NUL, for the same
reason `storable_json` refuses such JSON: the decoded form is hashed and
stored as JSON (`jsonb`), which cannot hold a NUL. And it holds at most
`MAX_FORM_FIELDS` fields, counted before anything is decoded: twilio signs
the decoded fields, so its verifier parses a form before any HMAC, and 1 MiB
of `a=&` cost ~0.45 s of the event loop per unsigned request.
"""

from urllib.parse import parse_qsl

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
_JSON_BLANKS = b" \t\r\n"

Form = dict[str, str | list[str]]
MAX_FORM_FIELDS = 1000  # Twilio sends a few dozen, Slack fewer


def is_form(content_type: str | None) -> bool:
    """Whether a Content-Type value names a url-encoded form (parameters such as charset ignored)."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() == FORM


def reads_as_json(body: bytes) -> bool:
    """Whether the body is JSON by its own first byte: a JSON object starts with `{`, no form Twilio,
    Slack or GitHub sends does (their first field is a name such as `payload`, `token`, `ToCountry`)."""
    return body.lstrip(_JSON_BLANKS)[:1] == b"{"


def content_type_read(content_type: str | None, as_form: bool) -> str | None:
    """The Content-Type to store with a body read as a form (`as_form`) or as JSON: the one sent when it
    says so, else the one that does (None: keep the one sent)."""
    if is_form(content_type) == as_form:
        return None
    return FORM if as_form else JSON


def repeats_a_field(form: Form) -> bool:
    """Whether a name carries one value twice: a form a signature over the set of fields (Twilio's)
    cannot tell from the one with it once."""
    return any(isinstance(value, list) and len(set(value)) < len(value) for value in form.values())


def parse_form(body: bytes) -> Form:
    """The decoded form; ValueError when it is not UTF-8, holds a NUL or more than MAX_FORM_FIELDS fields."""
    pairs = parse_qsl(
        body.decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=MAX_FORM_FIELDS
    )
    form: Form = {}
    for name, value in pairs:
        if "\x00" in name or "\x00" in value:
            raise ValueError("a NUL in a form field")
        earlier = form.get(name)
        if earlier is None:
            form[name] = value
        elif isinstance(earlier, list):
            earlier.append(value)
        else:
            form[name] = [earlier, value]
    return form


def values_of(form: Form) -> dict[str, list[str]]:
    """Every name with the list of its values (a name sent once: a list of one)."""
    return {name: value if isinstance(value, list) else [value] for name, value in form.items()}
