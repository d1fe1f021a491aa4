"""Code both the ingress and the workers use. A leaf: never imports them."""
