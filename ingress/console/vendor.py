"""Scripts the console serves from `static/`, pinned: nothing is loaded
from another host. To upgrade htmx: `npm pack htmx.org@VERSION`, copy
`package/dist/htmx.min.js` to `static/htmx-VERSION.min.js`, and put the
version and the file's sha256 here (tests/unit/ingress/console/test_vendor.py checks it).
"""

HTMX_VERSION = "2.0.11"  # npm: htmx.org, licence 0BSD (static/htmx-LICENSE.txt)
HTMX_SHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"
HTMX_FILE = f"htmx-{HTMX_VERSION}.min.js"
