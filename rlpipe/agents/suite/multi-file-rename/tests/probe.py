"""Imports the agent's shop.users in its own process (check.py starts it): prints plain data only."""
import json
import sys

sys.path.insert(0, "/work")
import shop.users  # noqa: E402

print(json.dumps({"fetch_user": callable(getattr(shop.users, "fetch_user", None)), "get_user": hasattr(shop.users, "get_user")}))
