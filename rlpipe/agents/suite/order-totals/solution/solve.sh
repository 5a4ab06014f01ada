#!/bin/sh
python3 - <<'PY'
import json
totals = {}
for order in json.load(open("/work/orders.json")):
    if order["status"] == "paid":
        totals[order["user"]] = totals.get(order["user"], 0) + order["amount"]
json.dump({user: round(total, 2) for user, total in sorted(totals.items())}, open("/work/totals.json", "w"), indent=2)
PY
