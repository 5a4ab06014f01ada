"""Prefect tasks, and only them: thin @task functions, each one call per stage into
controller/; their retry policy, logging, status and tracking are in rlpipe/orchestration/."""
