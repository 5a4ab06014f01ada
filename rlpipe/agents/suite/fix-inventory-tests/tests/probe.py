"""Runs the agent's inventory.py in its own process (check.py starts it): prints plain data only."""
import json
import sys

sys.path.insert(0, "/work")
from inventory import Inventory  # noqa: E402

stock = Inventory()
stock.add("a", 3, 2.0)
stock.add("b", 5, 1.5)
stock.add("a", 1, 2.0)
seen = {"total_value": stock.total_value()}
try:
    stock.remove("b", 6)
    seen["refused_removal"] = "returned"
except ValueError:
    seen["refused_removal"] = "ValueError"
seen["b_after_refusal"] = stock.items["b"][0]
stock.remove("b", 5)
seen["b_after_removal"] = stock.items["b"][0]
print(json.dumps(seen))
