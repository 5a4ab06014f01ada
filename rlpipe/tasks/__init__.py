"""Prefect tasks (thin: each calls library code) and the Runtime they share in-process."""
