"""A peer to compare with (`make bench --peers`, issue 24): what a team would
otherwise deploy. Runs in a venv of its own (build/peers-venv), never
imported by the product or the suite."""
