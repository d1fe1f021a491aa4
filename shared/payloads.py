"""What a handler's `event.payload` is, decided by the request's Content-Type, in one place.

`application/x-www-form-urlencoded` (Twilio, Slack slash commands and
interactivity) is decoded into a dict of name -> value: a name sent once
maps to its string, a name sent several times to the list of its values in
the order sent. Anything else is parsed as JSON, as before. The raw body
travels unchanged either way; this is only how it is read.

A form must be UTF-8 once percent-decoded and hold no NUL, for the same
reason `storable_json` refuses such JSON: the decoded form is hashed and
stored as JSON (`jsonb`), which cannot hold a NUL. And it holds at most
`MAX_FORM_FIELDS` fields, counted before anything is decoded: twilio signs
the decoded fields, so its verifier parses a form before any HMAC, and 1 MiB
of `a=&` cost ~0.45 s of the event loop per unsigned request.
"""

from urllib.parse import parse_qsl

FORM = "application/x-www-form-urlencoded"

Form = dict[str, str | list[str]]
MAX_FORM_FIELDS = 1000  # Twilio sends a few dozen, Slack fewer


def is_form(content_type: str | None) -> bool:
    """Whether a Content-Type value names a url-encoded form (parameters such as charset ignored)."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() == FORM


def parse_form(body: bytes) -> Form:
    """The decoded form; ValueError when it is not UTF-8, holds a NUL or more than MAX_FORM_FIELDS fields."""
    pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict",
                      max_num_fields=MAX_FORM_FIELDS)
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
