"""Prefect flows: train (one flow run per RL run, a nested flow run per step)."""
