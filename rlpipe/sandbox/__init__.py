"""Isolation backends (bubblewrap, docker) behind one protocol, and a pool of them."""
