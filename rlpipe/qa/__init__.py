"""The environment quality gate (`rlpipe qa`): is every task solvable, is the verifier
consistent and hard to fool, and how hard is the set for a given policy.

records.py (typed results), answers.py (the answers it tries: reference, accepted variants,
known-wrong answers, task-independent reward-hack probes), agent_probes.py (the hostile-agent
commands tried on terminal tasks, shared with the trial harness's tests), checks.py (the checks, over any batch verifier),
difficulty.py (pass@k of a policy; imports torch only when called), report.py (markdown,
PNG, JSON). The CLI (cli/qa.py) builds the env and the sandboxes and calls these.
"""
