"""Long-horizon agents: Harbor-format terminal tasks, the trial loop in sandboxes, agents, evals."""
