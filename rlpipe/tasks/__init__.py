"""Prefect tasks: thin @task functions, each one call per stage into controller/ (beside
them only the records they return and a few private helpers); their retry policy, logging,
status and tracking are in rlpipe/orchestration/."""
