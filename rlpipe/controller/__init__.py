"""The controller's plain code: the state of a run (runtime.py), starting it (launch.py,
preflight.py), and what each stage of a step does on the controller's side (sample,
generate, verify, advantage, persist, update, weight_sync), without Prefect: the @task
functions that call these are in rlpipe/tasks/, Prefect's plumbing in rlpipe/orchestration/."""
