"""Prefect's and the tracker's plumbing around the controller, with no @task of its own:
the retry policy and stage keys of the stage tasks (stage_options.py), the run's progress
lines in the flow run's logs (run_log.py), what a run says about itself while it runs
(status.py: status.json, links.json), the step's metrics to the lake, MLflow and Prefect
(track.py, stage 8 `track`), and the temporary Prefect server of one CLI process
(prefect_server.py). The @task functions that call these are in rlpipe/tasks/; what the
stages do is in rlpipe/controller/."""
